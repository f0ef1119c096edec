"""Costs measured beside the real vLLM 0.26.0 on the H200 (runs ON the GPU machine, after
harness/gpu/stage_vllm.sh's payload is unpacked; see harness/gpu/device_vllm.sh):

    python3 -m bench.real_engine OUT_DIR gil_window [PAIRS] [modes=blocking,nonblocking]  what one py-spy window costs
                                                          while open (per mode, round by round), and so the default
    python3 -m bench.real_engine OUT_DIR gil_ab [PAIRS [SETTING=VALUE...]]   the default's cost head-on (goal: < 2 %)
    python3 -m bench.real_engine OUT_DIR cost [full-only] [cpu-only] [profile] [windows=N] [SETTING=VALUE...]  the
                                                          sidecar beside nvitop-exporter, one run, same load (cpu-only:
                                                          the CPU and RSS windows and the footprint, no latency or floor;
                                                          profile: py-spy records the sidecar over the windows)
    python3 -m bench.real_engine OUT_DIR bursts [ROUNDS]   bursts of 50 new connections under load, the sidecar
                                                          and a bare aiohttp server with its page taking turns
    python3 -m bench.real_engine OUT_DIR cost + gil_ab 3 gil_nonblocking=false   several, one after the other

gil_window: the same CPU-bound load; for each role (engine core, then API server) PAIRS rounds of short
segments: one in which the GIL source (the sidecar's own class, at the default window and rate) samples that
process for one window in each mode asked (blocking, nonblocking), and one as long without it, each arm first
in turn. Segments of a few seconds are too short for the load to drift, so the on/off ratio resolves what a
window costs while open; py-spy's own CPU per window and the GIL share it read are kept per mode. The
default duty's cost follows: each role's in-window cost times the share of the time its window is open
(gil_window_seconds / gil_interval_seconds), summed over the two roles.

gil_ab: a CPU-bound server (the tiny model, 128 clients of short requests: the engine core's Python loop
is the limit, where py-spy's pauses cost the most) under one continuous load; each 60 s window runs a
fresh sidecar with all four sources (GIL on at its default duty, or with the settings given, e.g.
gil_nonblocking=false) or with vllm,process,gpu (GIL off). A window lasts one GIL interval, so an on window
holds exactly one py-spy round, as in a long run. Throughput is vLLM's own generation-token counter over the window; windows
go off/on, on/off, ... so that drift cancels out.

cost: the 1B model serving 32 clients; the sidecar (all defaults, or the settings given) and nvitop-exporter (its default 1 s
interval; the reference GPU exporter) run side by side over the same window (one GIL interval, so one
py-spy round; `windows=N`: N such windows back to back), each scraped every 15 s as Prometheus would; then (unless `full-only`) the sidecar with the
GPU source only. CPU as a share of one core, RSS, where the
sidecar's CPU went (its vllm_triage_sidecar_cpu_seconds_total by stage) and /metrics latency with 1 and
50 scrapers (one scraper back to back for 30 s, and with its requests spread over 30 s; 50 also on
connections already open; the same for a bare aiohttp server and a bare asyncio protocol returning the
sidecar's page: the floor of the framework and of the machine), and the RSS of a fresh Python as the sidecar's imports, NVML and the GPU
source load. With `profile`, py-spy samples the sidecar's threads (nonblocking, 200 Hz, in its own process, so
outside both CPU figures) over the windows: sidecar-profile.txt holds the raw stacks, the summary the functions
its busy samples fell in. Needs the nvitop and nvitop-exporter wheels carried in `.whl/`.
Each measurement prints and writes N-<name>.json (N: its place on the command line).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families
from vllm_triage.config import OPTIONS_BY_KEY
from vllm_triage.model import ProcessTargets
from vllm_triage.sources.gil import GilSource
from vllm_triage.sources.process import role_of

from bench.scrape_bursts import FLOOR_SERVERS, burst_p99, start_floor, wait_listening
from bench.sidecar_overhead import percentile, prometheus_like_scrapes, scrape_latencies
from harness.components import get
from harness.gil_target import read_ratio
from harness.gpu.real_vllm import SCENARIOS, URL, make_model, start_vllm, stop
from harness.load import run_load

SIDECAR_PORT = 9400
NVITOP_PORT = 9401
FLOOR_PORT = 9402


def generated_tokens() -> float:
    with urllib.request.urlopen(URL + "/metrics", timeout=10) as response:
        page = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(page) for s in f.samples if s.name == "vllm:generation_tokens_total")


def start_sidecar(folder: Path, sources: str, port: int = SIDECAR_PORT, settings: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "sidecar.yaml"
    config.write_text(f"sources: {sources}\nlog_level: warning\n" + "".join(f"{key}: {value}\n" for key, value in (settings or {}).items()))
    command = [sys.executable, "-m", "vllm_triage.cli", "serve", "--config", str(config), "--vllm-url", URL, "--listen", f"127.0.0.1:{port}"]
    return subprocess.Popen(command, stdout=(folder / "sidecar.log").open("wb"), stderr=subprocess.STDOUT)


def stage_seconds(url: str) -> dict[str, float]:
    """The sidecar's own CPU seconds by stage, and the threads of vLLM's processes, from its page."""
    page = get(url)[1].decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "vllm_triage_sidecar_cpu_seconds_total":
                found[sample.labels["stage"]] = sample.value
            elif sample.name == "vllm_triage_process_threads":
                found[f"threads_{sample.labels['role']}_{sample.labels['index']}"] = sample.value
    return found


async def gil_ab(out: Path, pairs: int, settings: dict[str, str]) -> dict[str, object]:
    scenario = SCENARIOS["cpu_bound"]
    clients, prompt_words, max_tokens = 128, 8, 16
    window = float(settings.get("gil_interval_seconds", OPTIONS_BY_KEY["gil_interval_seconds"].default))
    server = start_vllm(make_model(scenario.model, Path("/tmp/staged-model")), scenario.flags, out / "gil_ab-vllm.log")
    stop_load = asyncio.Event()
    load = asyncio.create_task(run_load(URL, "tiny", clients, 10 * 3600, prompt_words, max_tokens, stop=stop_load))
    results: dict[str, list[float]] = {"off": [], "on": []}
    gil_windows: list[int] = []
    gil_held: list[dict[str, float]] = []
    try:
        await asyncio.sleep(20)  # warm-up: the batch fills, caches warm
        for pair in range(pairs):
            for gil in (False, True) if pair % 2 == 0 else (True, False):
                arm = "on" if gil else "off"
                folder = out / f"gil_ab-{pair}-{arm}"
                sidecar = start_sidecar(folder, "vllm,process,gpu,gil" if gil else "vllm,process,gpu", settings=settings if gil else None)
                before, started = await asyncio.to_thread(generated_tokens), time.monotonic()
                await asyncio.sleep(window)
                after, ended = await asyncio.to_thread(generated_tokens), time.monotonic()
                try:
                    page = (await asyncio.to_thread(get, f"http://127.0.0.1:{SIDECAR_PORT}/metrics"))[1].decode()
                    (folder / "sidecar.metrics.txt").write_text(page)
                    if gil:  # the on arm really sampled: py-spy windows of both roles are in the page
                        held = {
                            s.labels["role"]: s.value for f in text_string_to_metric_families(page) for s in f.samples if s.name == "vllm_triage_gil_held_ratio"
                        }
                        gil_windows.append(len(held))
                        gil_held.append(held)
                finally:
                    stop(sidecar)
                tokens_per_second = (after - before) / (ended - started)
                results[arm].append(tokens_per_second)
                print(f"{time.strftime('%H:%M:%S')} pair {pair + 1} GIL {arm:3}: {tokens_per_second:.0f} generated tokens/s", flush=True)
    finally:
        stop_load.set()
        load.cancel()
        stop(server)
    ratios = [on / off for off, on in zip(results["off"], results["on"], strict=True)]
    summary = {
        "load": {"model": scenario.model, "flags": list(scenario.flags), "clients": clients, "prompt_words": prompt_words, "max_tokens": max_tokens},
        "window_seconds": window,
        "gil_settings": settings or "defaults",
        "tokens_per_second": results,
        "on_over_off": ratios,
        "mean_ratio": statistics.mean(ratios),
        "spread": [min(ratios), max(ratios)],
        "gil_series_in_on_pages": gil_windows,
        "gil_held_ratio_in_on_pages": gil_held,
    }
    print(
        f"GIL source ({settings or 'defaults'}): throughput on/off = {summary['mean_ratio']:.4f} "
        f"({(1 - statistics.mean(ratios)) * 100:+.2f} % cost), per pair {', '.join(f'{r:.4f}' for r in ratios)}",
        flush=True,
    )
    return summary


def vllm_pids() -> dict[str, int]:
    return {role: p.pid for p in psutil.process_iter(["cmdline"]) if (role := role_of(p.info["cmdline"] or [], "VLLM")) in ("engine_core", "api_server")}


def mean_and_half_width(values: list[float]) -> tuple[float, float]:
    """The mean and its 95 % interval's half width (two standard errors)."""
    return statistics.mean(values), 2 * statistics.stdev(values) / len(values) ** 0.5


def children_cpu_seconds() -> float:
    """CPU of this process' finished children: the py-spy runs the GIL source started."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def gil_window(out: Path, pairs: int, modes: tuple[str, ...]) -> dict[str, object]:
    scenario = SCENARIOS["cpu_bound"]
    clients, prompt_words, max_tokens = 128, 8, 16
    window, interval = (float(OPTIONS_BY_KEY[key].default) for key in ("gil_window_seconds", "gil_interval_seconds"))
    rate = OPTIONS_BY_KEY["gil_rate"].default
    server = start_vllm(make_model(scenario.model, Path("/tmp/staged-model")), scenario.flags, out / "gil_window-vllm.log")
    stop_load = asyncio.Event()
    load = asyncio.create_task(run_load(URL, "tiny", clients, 10 * 3600, prompt_words, max_tokens, stop=stop_load))
    summary: dict[str, Any] = {
        "load": {"model": scenario.model, "flags": list(scenario.flags), "clients": clients, "prompt_words": prompt_words, "max_tokens": max_tokens},
        "py_spy": {"window_seconds": window, "interval_seconds": interval, "rate": rate, "modes": list(modes)},
    }
    default_cost = dict.fromkeys(modes, 0.0)
    default_half_width = dict.fromkeys(modes, 0.0)
    try:
        await asyncio.sleep(20)  # warm-up: the batch fills, caches warm
        for role, pid in sorted(vllm_pids().items()):
            sources = {mode: GilSource(ProcessTargets([(role, pid)]), window, rate, mode == "nonblocking") for mode in modes}
            arms = ("off", *modes)
            tokens_per_second: dict[str, list[float]] = {arm: [] for arm in arms}
            held: dict[str, list[float]] = {mode: [] for mode in modes}
            failed: dict[str, list[float]] = {mode: [] for mode in modes}  # samples py-spy could not read (nonblocking: counted as held)
            py_spy_cpu: dict[str, list[float]] = {mode: [] for mode in modes}
            segment = window
            for pair in range(pairs):
                for arm in arms[pair % len(arms) :] + arms[: pair % len(arms)]:  # each arm first in turn: drift cancels
                    before, started = await asyncio.to_thread(generated_tokens), time.monotonic()
                    if arm != "off":
                        children = children_cpu_seconds()
                        reading = await sources[arm].collect()
                        if not reading.ok:
                            raise RuntimeError(f"py-spy ({arm}) on the {role}: {reading.error}")
                        py_spy_cpu[arm].append(children_cpu_seconds() - children)
                        held[arm].append(read_ratio(reading, "gil_held_ratio"))
                        failed[arm].append(read_ratio(reading, "gil_failed_sample_ratio"))
                        segment = time.monotonic() - started  # py-spy's start and attach included: they cost too
                    else:
                        await asyncio.sleep(segment)
                    after, ended = await asyncio.to_thread(generated_tokens), time.monotonic()
                    tokens_per_second[arm].append((after - before) / (ended - started))
            summary[role] = {"pairs": pairs, "segment_seconds": round(segment, 2), "tokens_per_second_off": [round(v) for v in tokens_per_second["off"]]}
            for mode in modes:
                ratios = [on / off for off, on in zip(tokens_per_second["off"], tokens_per_second[mode], strict=True)]
                mean, half_width = mean_and_half_width(ratios)
                default_cost[mode] += (1 - mean) * segment / interval
                default_half_width[mode] += half_width * segment / interval
                summary[role][mode] = {
                    "on_over_off": [round(r, 4) for r in ratios],
                    "mean_on_over_off": mean,
                    "ci95_half_width": half_width,
                    "gil_held_ratio_seen": [round(h, 3) for h in held[mode]],
                    "gil_failed_sample_ratio_seen": [round(f, 3) for f in failed[mode]],
                    "py_spy_cpu_seconds_per_window": statistics.mean(py_spy_cpu[mode]),
                }
                print(
                    f"{time.strftime('%H:%M:%S')} {role} {mode}: throughput on/off while a window is open {mean:.4f} ± {half_width:.4f} "
                    f"({pairs} pairs), py-spy {statistics.mean(py_spy_cpu[mode]) * 1000:.0f} ms CPU a window, GIL held "
                    f"{statistics.mean(held[mode]) if held[mode] else float('nan'):.3f} (of it samples py-spy failed to read "
                    f"{statistics.mean(failed[mode]) if failed[mode] else float('nan'):.3f})",
                    flush=True,
                )
    finally:
        stop_load.set()
        load.cancel()
        stop(server)
    summary["default_duty_cost"], summary["default_duty_cost_ci95_half_width"] = default_cost, default_half_width
    for mode in modes:
        print(
            f"cost at the default duty ({window:g} s per process every {interval:g} s), {mode}: {default_cost[mode] * 100:.3f} ± "
            f"{default_half_width[mode] * 100:.3f} % of the engine's throughput",
            flush=True,
        )
    return summary


def install_nvitop() -> str:
    target = "/tmp/nvitop"
    wheels = [str(p) for p in Path(".whl").glob("nvitop*.whl")]
    if not wheels:
        raise RuntimeError("carry .whl/ with the nvitop and nvitop-exporter wheels")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", target, *wheels], check=True)
    return target


def measure(processes: dict[str, psutil.Process], seconds: float, scrape_urls: list[str]) -> dict[str, dict[str, float]]:
    """CPU (share of one core: its own, and its finished children's — the sidecar's py-spy runs) and RSS
    at the end of one window in which every URL is scraped every 15 s, Prometheus-like (in threads, so
    the scrapes interleave)."""
    before = {name: p.cpu_times() for name, p in processes.items()}
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(scrape_urls)) as pool:
        scrapes = list(pool.map(lambda url: prometheus_like_scrapes(url, seconds, 15.0), scrape_urls))
    wall = time.monotonic() - started
    result = {}
    for name, p in processes.items():
        after, start = p.cpu_times(), before[name]
        own = (after.user + after.system - start.user - start.system) / wall
        children = (after.children_user + after.children_system - start.children_user - start.children_system) / wall  # py-spy
        result[name] = {
            "cpu_percent_of_core": own * 100,
            "children_cpu_percent_of_core": children * 100,
            "rss_mb": p.memory_info().rss / 1e6,
            **resident_parts(p.pid),
            "threads": p.num_threads(),
        }
    for url, latencies in zip(scrape_urls, scrapes, strict=True):
        print(f"  {url}: {len(latencies)} Prometheus-like scrapes, slowest {max(latencies) * 1000:.2f} ms", flush=True)
    return result


def resident_parts(pid: int) -> dict[str, float]:
    """RSS split as the kernel counts it (MB): anonymous memory (heap, code objects) and mapped files (libraries)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {f"{key.lower()}_mb": int(fields[key].split()[0]) * 1024 / 1e6 for key in ("RssAnon", "RssFile") if key in fields}


def latencies(url: str) -> dict[str, float]:
    one = asyncio.run(scrape_latencies(url, 1, 0, for_seconds=30))  # back to back over 15 ticks
    one_spread = asyncio.run(scrape_latencies(url, 1, 300, pause_seconds=0.1))  # ~30 s: every phase of 15 ticks
    fifty = asyncio.run(scrape_latencies(url, 50, 20))
    fifty_connected = asyncio.run(scrape_latencies(url, 50, 20, connected=True))
    return {
        "requests_1": len(one),
        "p50_1_ms": statistics.median(one) * 1000,
        "p99_1_ms": percentile(one, 0.99) * 1000,
        "p999_1_ms": percentile(one, 0.999) * 1000,
        "p50_1_spread_ms": statistics.median(one_spread) * 1000,
        "p99_1_spread_ms": percentile(one_spread, 0.99) * 1000,
        "p50_50_ms": statistics.median(fifty) * 1000,
        "p99_50_ms": percentile(fifty, 0.99) * 1000,
        "p99_50_connected_ms": percentile(fifty_connected, 0.99) * 1000,
    }


_RSS = """
import json, os, sys
def rss():
    pages = open("/proc/self/statm").read().split()
    resident, shared = (int(pages[i]) * os.sysconf("SC_PAGE_SIZE") / 1e6 for i in (1, 2))
    return {"rss": resident, "files": shared}
steps = {"python": rss()}
"""
# The libraries the house names (asyncio and aiohttp for HTTP, prometheus_client, psutil, yaml), then the sidecar's own
# code: what part of its RSS the libraries are, beside nvitop-exporter's imports in the same Python.
FOOTPRINT = (
    _RSS
    + """
import asyncio, aiohttp.web, prometheus_client, psutil, yaml
steps["the libraries (asyncio, aiohttp, prometheus_client, psutil, yaml)"] = rss()
import vllm_triage.cli
steps["the sidecar's imports"] = rss()
import pynvml
pynvml.nvmlInit()
steps["nvmlInit"] = rss()
from vllm_triage.sources.gpu import GpuSource
source = GpuSource()
source.collect()
steps["GPU source, first collection (GPM samples allocated)"] = rss()
source.collect()
steps["second collection"] = rss()
print(json.dumps(steps))
"""
)
NVITOP_FOOTPRINT = (
    _RSS
    + """
import nvitop_exporter.__main__
steps["nvitop-exporter's imports"] = rss()
import pynvml
pynvml.nvmlInit()
steps["nvmlInit"] = rss()
print(json.dumps(steps))
"""
)


def footprint(code: str = FOOTPRINT, env: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
    """RSS (MB, and of it mapped files: libraries) of a fresh Python as the sidecar's parts load: where its memory goes before it reads anything."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    steps = json.loads(done.stdout.strip().splitlines()[-1]).items()
    return {step: {part: round(mb, 1) for part, mb in parts.items()} for step, parts in steps}


def record_profile(pid: int, seconds: float, path: Path) -> subprocess.Popen[bytes]:
    command = ["py-spy", "record", "--pid", str(pid), "--rate", "200", "--duration", str(round(seconds))]
    command += ["--nonblocking", "--threads", "--format", "raw", "-o", str(path)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_summary(path: Path, top: int = 25) -> dict[str, Any]:
    """Busy samples by thread, and the functions they fell in (self, and anywhere on the stack). A thread parked in
    epoll or on its work queue is idle, whatever py-spy's guess: those samples are counted apart."""
    idle_frames = ("Selector.select (selectors.py", "_worker (concurrent/futures/thread.py", "Condition.wait (threading.py")
    threads: dict[str, int] = {}
    own: dict[str, int] = {}
    within: dict[str, int] = {}
    idle = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames, count = stack.split(";"), int(count_text)
        if any(frame in frames[-1] for frame in idle_frames):
            idle += count
            continue
        thread = frames[0].partition(": ")[2] or frames[0]
        threads[thread] = threads.get(thread, 0) + count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames[1:]):
            within[frame] = within.get(frame, 0) + count

    def ranked(counts: dict[str, int]) -> dict[str, int]:
        return dict(sorted(counts.items(), key=lambda item: -item[1])[:top])

    busy = sum(threads.values())
    return {"rate_hz": 200, "busy_samples": busy, "idle_samples": idle, "threads": ranked(threads), "self": ranked(own), "inclusive": ranked(within)}


def per_stage(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """CPU per stage as a share of one core over the window (threads: vLLM's processes' thread counts)."""
    return {key: value if key.startswith("threads_") else round((value - before.get(key, 0.0)) / seconds * 100, 4) for key, value in after.items()}


@contextlib.contextmanager
def serving_under_load(log: Path) -> Iterator[None]:
    """The 1B model serving 32 clients, for as long as the block runs."""
    scenario = SCENARIOS["serving"]
    server = start_vllm(make_model(scenario.model, Path("/tmp/staged-model")), scenario.flags, log)
    load_command = ["--url", URL, "--model", "tiny", "--clients", "32", "--seconds", "3600", "--prompt-words", "40", "--max-tokens", "160"]
    load = subprocess.Popen([sys.executable, "-m", "harness.load", *load_command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        load.kill()
        stop(server)


def cost(out: Path, gpu_only_too: bool, windows: int, settings: dict[str, str], cpu_only: bool = False, profile: bool = False) -> dict[str, Any]:
    seconds = float(OPTIONS_BY_KEY["gil_interval_seconds"].default)  # one py-spy round in the window, as in a long run
    nvitop = install_nvitop()
    env = {**os.environ, "PYTHONPATH": nvitop}
    exporter = subprocess.Popen(
        [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", str(NVITOP_PORT)],
        stdout=(out / "nvitop-exporter.log").open("wb"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    sidecar = start_sidecar(out / "cost-full", "vllm,process,gpu,gil", settings=settings)
    summary: dict[str, Any] = {"machine": f"{psutil.cpu_count()} cores", "window_seconds": seconds, "sidecar_settings": settings}
    try:
        sidecar_url, nvitop_url = f"http://127.0.0.1:{SIDECAR_PORT}/metrics", f"http://127.0.0.1:{NVITOP_PORT}/metrics"
        wait_listening(sidecar_url)
        wait_listening(nvitop_url)
        time.sleep(20)  # windows fill; the first py-spy round is over (the next one falls in the window)
        processes = {"sidecar_all_defaults": psutil.Process(sidecar.pid), "nvitop_exporter": psutil.Process(exporter.pid)}
        summary["side_by_side"], summary["sidecar_stages_percent_of_core"] = [], []
        profiler = record_profile(sidecar.pid, windows * seconds, out / "sidecar-profile.txt") if profile else None
        for _ in range(windows):  # back to back: how much the ratio moves between windows of one run
            before = stage_seconds(sidecar_url)
            summary["side_by_side"].append(measure(processes, seconds, [sidecar_url, nvitop_url]))
            summary["sidecar_stages_percent_of_core"].append(per_stage(before, stage_seconds(sidecar_url), seconds))
        if profiler is not None:
            profiler.wait(timeout=60)
            summary["sidecar_profile"] = profile_summary(out / "sidecar-profile.txt")
        summary["footprint_rss_mb"] = footprint()
        summary["footprint_nvitop_exporter_rss_mb"] = footprint(NVITOP_FOOTPRINT, env)
        if cpu_only:
            return summary
        summary["latency_sidecar_all_defaults"] = latencies(sidecar_url)
        summary["latency_nvitop_exporter"] = latencies(nvitop_url)
        page = out / "sidecar-page.txt"
        page.write_bytes(get(sidecar_url)[1])
        summary["sidecar_page_bytes"] = page.stat().st_size
        for name in FLOOR_SERVERS:
            floor = start_floor(name, page, FLOOR_PORT)
            try:
                wait_listening(f"http://127.0.0.1:{FLOOR_PORT}/metrics")
                summary[f"latency_{name}_same_page"] = latencies(f"http://127.0.0.1:{FLOOR_PORT}/metrics")
            finally:
                stop(floor)
        stop(sidecar)
        if not gpu_only_too:
            return summary
        gpu_only = start_sidecar(out / "cost-gpu", "gpu")
        try:
            wait_listening(sidecar_url)
            time.sleep(10)
            processes = {"sidecar_gpu_only": psutil.Process(gpu_only.pid), "nvitop_exporter": psutil.Process(exporter.pid)}
            before = stage_seconds(sidecar_url)
            summary["gpu_only_side_by_side"] = measure(processes, seconds, [sidecar_url, nvitop_url])
            summary["gpu_only_stages_percent_of_core"] = per_stage(before, stage_seconds(sidecar_url), seconds)
        finally:
            stop(gpu_only)
    finally:
        stop(sidecar)
        stop(exporter)
    return summary


def bursts(out: Path, rounds: int) -> dict[str, Any]:
    """Bursts of 50 new connections under the serving load: the sidecar (all defaults) and a bare aiohttp
    server returning its page take turns, round by round, so both meet the same moments of the machine (one
    burst a run, as `cost` measures, is one sample of the 2 s cycle)."""
    sidecar = start_sidecar(out / "bursts", "vllm,process,gpu,gil")
    sidecar_url, floor_url = f"http://127.0.0.1:{SIDECAR_PORT}/metrics", f"http://127.0.0.1:{FLOOR_PORT}/metrics"
    floor = None
    rows: list[dict[str, float]] = []
    try:
        wait_listening(sidecar_url)
        time.sleep(20)  # windows fill: the page as large as it stays
        page = out / "bursts-page.txt"
        page.write_bytes(get(sidecar_url)[1])
        floor = start_floor("bare_aiohttp", page, FLOOR_PORT)
        wait_listening(floor_url)
        for _ in range(rounds):
            rows.append({"sidecar_ms": round(burst_p99(sidecar_url) * 1000, 2), "bare_aiohttp_ms": round(burst_p99(floor_url) * 1000, 2)})
            time.sleep(0.11)  # rounds fall on every phase of the 2 s cycle
    finally:
        stop(sidecar)
        if floor is not None:
            stop(floor)
    summary: dict[str, Any] = {"machine": f"{psutil.cpu_count()} cores", "burst": "p99 of 50 new connections x 20 requests", "rounds": rows}
    for server in ("sidecar_ms", "bare_aiohttp_ms"):
        values = sorted(row[server] for row in rows)
        summary[server] = {"median": statistics.median(values), "min": values[0], "max": values[-1]}
    return summary


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    measurements: list[list[str]] = [[]]
    for arg in sys.argv[2:]:
        if arg == "+":
            measurements.append([])
        else:
            measurements[-1].append(arg)
    for number, (what, *args) in enumerate(measurements):
        if what == "gil_window":
            modes = next((tuple(a.removeprefix("modes=").split(",")) for a in args if a.startswith("modes=")), ("nonblocking",))
            summary = asyncio.run(gil_window(out, next((int(a) for a in args if a.isdigit()), 30), modes))
        elif what == "gil_ab":
            settings = dict(arg.split("=", 1) for arg in args[1:])
            summary = asyncio.run(gil_ab(out, int(args[0]) if args else 4, settings))
        elif what == "cost":
            settings = dict(a.split("=", 1) for a in args if "=" in a)
            windows = int(settings.pop("windows", "1"))
            with serving_under_load(out / "cost-vllm.log"):
                summary = cost(
                    out, gpu_only_too="full-only" not in args, windows=windows, settings=settings, cpu_only="cpu-only" in args, profile="profile" in args
                )
        elif what == "bursts":
            with serving_under_load(out / "bursts-vllm.log"):
                summary = bursts(out, next((int(a) for a in args if a.isdigit()), 40))
        else:
            raise SystemExit(f"unknown measurement {what!r}: gil_window, gil_ab, cost or bursts")
        text = json.dumps(summary, indent=2)
        print(text, flush=True)
        (out / f"{number}-{what}.json").write_text(text)


if __name__ == "__main__":
    main()
