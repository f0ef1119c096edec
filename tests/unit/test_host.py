"""The host layer on real processes (psutil), and gpu_starved on both sides."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from vllm_triage.config_loader import load
from vllm_triage.derive import DeriveSettings
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.model import GIL_SOURCE, PROCESS_SOURCE, Reading, make_labels
from vllm_triage.pipeline import Pipeline, evaluate
from vllm_triage.scope import HOST_SCOPE
from vllm_triage.sources.process import ProcessSource
from vllm_triage.store import Store

from harness.components import FAST_CADENCE, FAST_CONDITIONS, REPO, start_sidecar
from harness.vllm_server import free_port

from .pages import Counters, page, reading
from .test_gpu_conditions import gpu_reading


def test_busiest_thread_of_a_spinning_engine_core_is_a_full_core():
    """A real process titled like vLLM's engine core whose main thread spins in Python."""
    spinner = subprocess.Popen(["bash", "-c", f"exec -a VLLM::EngineCore {sys.executable} -c 'while True: pass'"])
    sleeper = subprocess.Popen(["bash", "-c", f"exec -a VLLM::Worker_TP0 {sys.executable} -c 'import time; time.sleep(60)'"])
    try:
        time.sleep(0.5)
        source = ProcessSource(port=None)
        source.collect()
        time.sleep(1.5)
        second = source.collect()
    finally:
        spinner.kill()
        sleeper.kill()
    by_role = {p["role"]: p for p in second.meta["processes"] if p["pid"] in (spinner.pid, sleeper.pid)}
    assert by_role["engine_core"]["busiest_thread"]["cpu_ratio"] > 0.3  # ~1.0 on an idle machine, less on a contended one
    assert by_role["engine_core"]["busiest_thread"]["main"] is True
    assert by_role["worker"]["busiest_thread"]["cpu_ratio"] < 0.1
    labels = {dict(lbl)["role"] for (name, lbl) in second.samples if name == "process_cpu_seconds_total"}
    assert {"engine_core", "worker"} <= labels
    assert all("pid" not in dict(lbl) for _, lbl in second.samples)  # bounded labels: role and index only


def process_reading(t: float, engine_core_thread: float, cpu_seconds: float, waited: float | None = None, api_server_thread: float = 0.2) -> Reading:
    core = make_labels({"role": "engine_core", "index": "0"})
    server = make_labels({"role": "api_server", "index": "0"})
    thread = {"tid": 7, "name": "VLLM::EngineCor", "main": True, "cpu_ratio": engine_core_thread}
    samples = {
        ("process_busiest_thread_cpu_ratio", core): engine_core_thread,
        ("process_cpu_seconds_total", core): cpu_seconds,
    }
    if engine_core_thread >= 0.5 or waited is not None:  # the relaxed case is a headless engine: no API server visible
        samples[("process_busiest_thread_cpu_ratio", server)] = api_server_thread
    process = {"pid": 7, "role": "engine_core", "index": 0, "busiest_thread": thread}
    if waited is not None:  # what schedstat says: the thread ran `engine_core_thread` and waited `waited` for a CPU
        samples[("process_thread_runqueue_wait_ratio", core)] = waited
        samples[("process_thread_cpu_demand_ratio", core)] = engine_core_thread + waited
        process |= {"neediest_thread": {**thread, "runqueue_wait_ratio": waited}, "cpus_allowed": 1}
    return Reading(PROCESS_SOURCE, t, True, samples, meta={"processes": [process], "runnable_tasks": 4})


def starved_run(core_thread: float, gpu_util: float, sm: float, running: float = 8, waited: float | None = None, api_server_thread: float = 0.2):
    config = load(env={})
    settings = {cid: dataclasses.replace(s, window_seconds=20, for_seconds=0, clear_seconds=0) for cid, s in config.conditions.items()}
    engine = Engine(settings, 20)
    store = Store(120)
    c = Counters()
    snapshot = None
    for t in range(0, 40, 2):
        c.finished += 1
        c.generation_tokens += 8 * running
        store.add(reading(float(t), page(running, 0, 0.3, c)))
        store.add(gpu_reading(float(t), util=gpu_util, sm=sm))
        store.add(process_reading(float(t), core_thread, cpu_seconds=t * core_thread, waited=waited, api_server_thread=api_server_thread))
        snapshot = evaluate(engine, store, float(t), derive_settings=DeriveSettings(max_num_seqs=64))
    assert snapshot is not None
    return snapshot, {v.condition: v for v in snapshot.verdicts}


def test_gpu_starved_names_the_saturated_thread():
    snapshot, verdicts = starved_run(core_thread=0.97, gpu_util=0.2, sm=0.05)
    v = verdicts["gpu_starved"]
    assert v.state == "active"
    texts = [e.text for e in v.evidence]
    assert any('engine_core 0 (pid 7): busiest thread "VLLM::EngineCor" (main thread) at 0.97' in t for t in texts)
    assert snapshot.signals[HOST_SCOPE]["host_engine_core_cpu_cores"] is not None


def test_a_py_spy_window_stays_evidence_until_the_next_one():
    """py-spy windows come gil_interval_seconds apart (minutes): the latest one's GIL share is what gpu_starved and the
    causes read until the next has come, at any interval set, and not forever after py-spy stops."""
    core = make_labels({"role": "engine_core"})
    for interval in (300.0, 120.0):
        pipeline = Pipeline(load(env={}, flags={"gil_interval_seconds": interval}))
        c = Counters()
        held: dict[float, float | None] = {}
        for t in range(0, 800, 4):
            c.generation_tokens += 64
            pipeline.feed(reading(float(t), page(8, 0, 0.3, c)))
            if t == 100:  # one window, then py-spy stops (no permission any more, say)
                pipeline.feed(Reading(GIL_SOURCE, float(t), True, {("gil_held_ratio", core): 0.9}))
            held[float(t)] = pipeline.evaluate(float(t)).signals[HOST_SCOPE].get("host_engine_core_gil_held_ratio")
        assert held[100.0 + interval] == 0.9, f"gone before the next window was due at {interval:g} s"
        assert held[100.0 + 1.4 * interval] is None, f"still evidence {1.4 * interval:g} s later"


def test_gpu_not_starved_when_the_gpu_computes():
    _, verdicts = starved_run(core_thread=0.97, gpu_util=1.0, sm=0.95)
    assert verdicts["gpu_starved"].state == "inactive"


def test_gpu_not_starved_when_the_host_is_relaxed():
    _, verdicts = starved_run(core_thread=0.3, gpu_util=0.2, sm=0.05)
    assert verdicts["gpu_starved"].state == "inactive"


def test_gpu_not_starved_without_work():
    _, verdicts = starved_run(core_thread=0.97, gpu_util=0.0, sm=0.0, running=0)
    assert verdicts["gpu_starved"].state == "inactive"


def test_a_headless_engine_core_decides_alone():
    """No API server visible (a headless engine): the engine core's relaxed thread rules starvation out
    instead of leaving it unknown; its saturated thread decides it."""
    _, verdicts = starved_run(core_thread=0.10, gpu_util=0.2, sm=0.05)
    assert verdicts["gpu_starved"].state == "inactive"


def test_starvation_names_its_cause():
    _, verdicts = starved_run(core_thread=0.97, gpu_util=0.2, sm=0.05)
    # no GIL window (py-spy off or refused), no PCIe traffic in this run: the engine core's thread, Python or launches untold
    assert verdicts["gpu_starved"].cause == "engine_core"
    assert any("GIL share is not measured" in e.text for e in verdicts["gpu_starved"].evidence)


def test_a_thread_spinning_beside_a_working_gpu_is_no_starvation():
    """Measured on the H200 (the wide model, 8 clients, eager): the engine core's thread at 0.98 of a core, GPM SM active
    0.375, util.gpu 0.52. The thread spins in its CUDA syncs while a kernel is resident half the time: no gpu_starved."""
    _, verdicts = starved_run(core_thread=0.98, gpu_util=0.52, sm=0.375)
    assert verdicts["gpu_starved"].state == "inactive"
    assert any("util.gpu (share of time a kernel ran)" in e.text for e in verdicts["gpu_starved"].evidence)
    _, verdicts = starved_run(core_thread=0.98, gpu_util=0.3, sm=0.2)  # no kernel most of the time: the host is the limit
    assert verdicts["gpu_starved"].state == "active"


def test_a_saturated_api_server_is_named_with_the_api_server_count_to_set():
    """Measured on the H200 (a tiny model, streamed clients asking for logprobs): the API server's main thread 0.99 of a
    core, the engine core 0.6, SM activity 0.004. The cause is the API server, not the engine core's launches."""
    _, verdicts = starved_run(core_thread=0.6, gpu_util=0.05, sm=0.004, api_server_thread=0.99)
    v = verdicts["gpu_starved"]
    assert v.state == "active" and v.cause == "api_server", (v.state, v.cause)
    assert any(a.startswith("--api-server-count 2:") for a in v.advice), v.advice
    assert v.next_actions[0].startswith("cause=api_server"), v.next_actions[0]


def test_an_engine_core_waiting_for_a_cpu_starves_the_gpu():
    """Measured on the H200: the engine core sharing its CPUs with busy processes got 0.26-0.34 of a core, SM activity
    fell to 0.11-0.15. Its thread is not saturated: it waits for a CPU."""
    _, verdicts = starved_run(core_thread=0.3, gpu_util=0.35, sm=0.13, waited=0.66)
    v = verdicts["gpu_starved"]
    assert v.state == "active" and v.cause == "cpu_contention", (v.state, v.cause)
    texts = [e.text for e in v.evidence]
    assert any("waited 0.66 s per second for a CPU" in t and "it may run on 1 CPU" in t for t in texts), texts
    _, verdicts = starved_run(core_thread=0.3, gpu_util=0.35, sm=0.13, waited=0.02)  # a light load: no CPU wanted
    assert verdicts["gpu_starved"].state == "inactive"


def test_run_queue_wait_of_a_real_thread_that_shares_its_cpu():
    """A process titled like the engine core, pinned to one CPU with two busy loops: it gets about a third of the CPU and
    waits for it the rest of the time (schedstat)."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    spin = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    core = subprocess.Popen(["bash", "-c", f'exec -a VLLM::EngineCore {sys.executable} -c "{spin}"'])
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        source = ProcessSource(port=None)
        time.sleep(0.5)
        source.collect()
        time.sleep(2.0)
        contended = source.collect()
    finally:
        for p in (core, *hogs):
            p.kill()
    entry = next(p for p in contended.meta["processes"] if p["pid"] == core.pid)
    needy = entry["neediest_thread"]
    assert needy["main"] and needy["runqueue_wait_ratio"] > 0.3 and needy["cpu_ratio"] < 0.7, needy
    assert entry["cpus_allowed"] == 1


# A process titled like vLLM's API server that serves a real vLLM page on one thread; on SIGUSR1 its next request blocks
# that thread for good (an event loop blocked by a synchronous call).
API_SERVER = """
import http.server, signal, sys, time
page = open(sys.argv[2], "rb").read()
hung = []
signal.signal(signal.SIGUSR1, lambda *_: hung.append(True))

def blocked_in_a_synchronous_call():
    while True:
        time.sleep(0.1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if hung:
            blocked_in_a_synchronous_call()
        self.send_response(200)
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_an_unreachable_vllm_says_what_the_host_sees_of_its_api_server(tmp_path):
    """vllm_unreachable's cause on a real process titled like vLLM's API server: hung (the scrape times out while the
    process runs: its stacks are taken and name the blocking call), then stopped (SIGSTOP), then gone (SIGKILL)."""
    port = free_port()
    script = tmp_path / "api_server.py"
    script.write_text(API_SERVER)
    page_path = REPO / "tests" / "data" / "vllm-0.32.0-cpu-idle.metrics.txt"
    server = subprocess.Popen(["bash", "-c", f"exec -a VLLM::APIServer {sys.executable} {script} {port} {page_path}"])
    config = FAST_CADENCE + FAST_CONDITIONS + "scrape_timeout_seconds: 2\nstale_after_seconds: 4\n"
    sidecar = start_sidecar(tmp_path, f"http://127.0.0.1:{port}", config)
    try:
        sidecar.wait_for(lambda: sidecar.diagnosis()["sources"]["vllm"]["up"] is True, 30, "vLLM's page read")

        def cause() -> str | None:
            verdict = sidecar.condition("vllm_unreachable")
            return verdict["cause"] if verdict["state"] == "active" else None

        os.kill(server.pid, signal.SIGUSR1)
        sidecar.wait_for(lambda: cause() == "not_answering", 60, "vllm_unreachable, cause not_answering")
        sidecar.wait_for(lambda: bool(sidecar.diagnosis()["stack_dumps"]), 30, "the API server's stacks")
        dump = sidecar.diagnosis()["stack_dumps"][0]
        assert dump["condition"] == "vllm_unreachable" and dump["role"] == "api_server" and dump["pid"] == server.pid, dump
        assert "blocked_in_a_synchronous_call" in dump.get("stacks", ""), dump

        os.kill(server.pid, signal.SIGSTOP)
        sidecar.wait_for(lambda: cause() == "process_stopped", 30, "cause process_stopped")

        server.kill()
        server.wait()
        sidecar.wait_for(lambda: cause() == "process_gone", 30, "cause process_gone")
        evidence = " ".join(e["text"] for e in sidecar.condition("vllm_unreachable")["evidence"])
        assert "API server process was last seen" in evidence, evidence
    finally:
        server.kill()
        sidecar.process.kill()
