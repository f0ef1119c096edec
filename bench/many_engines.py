"""What one sidecar costs as the watched server grows: CPU, RSS and /metrics latency against a page
made of the real vLLM 0.32.0 KV-saturated capture repeated once per data-parallel engine, and
against a page whose label explodes (refused by max_series); then the CPU while a browser reloads the live
incident page (/report.html) every second. Prints a table; nothing is enforced.

    .venv/bin/python -m bench.many_engines [--engines 1 8 32 64] [--warmup 70] [--seconds 20]

The page is a file served by Python's http.server on loopback; only the vllm source runs, at the
default cadence (scrape and evaluate every tick_seconds); the warm-up fills the 60 s window first.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.sidecar_overhead import percentile, scrape_latencies
from harness.components import get, start_sidecar
from harness.vllm_server import free_port

CAPTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm-0.32.0-cpu-kv-saturated.metrics.txt"


def engines_page(engines: int) -> str:
    lines = []
    for line in CAPTURE.read_text().splitlines():
        if line.startswith("vllm:") and 'engine="0"' in line:
            lines += [line.replace('engine="0"', f'engine="{e}"') for e in range(engines)]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def exploding_page() -> str:
    return "".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n' for i in range(160_000))


def measure(name: str, page: str, warmup: float, seconds: float) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "metrics").write_text(page)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        config = "sources: [vllm]\nmax_engines: 128\nmax_series: 50000\nlog_level: warning\n"
        sidecar = start_sidecar(Path(tmp), f"http://127.0.0.1:{port}", config)
        try:
            process = psutil.Process(sidecar.process.pid)
            time.sleep(warmup)
            before, started = process.cpu_times(), time.monotonic()
            time.sleep(seconds)
            after, ended = process.cpu_times(), time.monotonic()
            cpu = (after.user + after.system - before.user - before.system) / (ended - started)
            rss = process.memory_info().rss
            latencies = asyncio.run(scrape_latencies(sidecar.url + "/metrics", 1, 100))
            before, started = process.cpu_times(), time.monotonic()
            while time.monotonic() - started < seconds:  # the incident page open in a browser that reloads it every second
                get(sidecar.url + "/report.html", timeout=30)
                time.sleep(1.0)
            after, ended = process.cpu_times(), time.monotonic()
            polled = (after.user + after.system - before.user - before.system) / (ended - started)
        finally:
            sidecar.process.terminate()
            sidecar.process.wait(timeout=30)
            server.kill()
            server.wait()
    return (
        f"{name}: page {len(page) / 1e6:.1f} MB; sidecar {cpu:.3f} cores, {rss / 1e6:.0f} MB RSS; "
        f"/metrics p50 {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms; /report.html reloaded every 1 s: {polled:.3f} cores"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--warmup", type=float, default=70.0, help="seconds before measuring (fills the window)")
    parser.add_argument("--seconds", type=float, default=20.0, help="CPU measurement window")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores; python {platform.python_version()}")
    for engines in args.engines:
        print(measure(f"{engines} engine(s)", engines_page(engines), args.warmup, args.seconds), flush=True)
    print(measure("exploding label (160k series, refused)", exploding_page(), 10.0, args.seconds))


if __name__ == "__main__":
    main()
