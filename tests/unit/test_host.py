"""The host layer on real processes (psutil), and gpu_starved on both sides."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

from vllm_triage.config import load
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.model import PROCESS_SOURCE, Reading, make_labels
from vllm_triage.pipeline import evaluate
from vllm_triage.sources.process import ProcessSource
from vllm_triage.store import Store

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


def process_reading(t: float, engine_core_thread: float, cpu_seconds: float) -> Reading:
    core = make_labels({"role": "engine_core", "index": "0"})
    server = make_labels({"role": "api_server", "index": "0"})
    thread = {"tid": 7, "name": "VLLM::EngineCor", "main": True, "cpu_ratio": engine_core_thread}
    samples = {
        ("process_busiest_thread_cpu_ratio", core): engine_core_thread,
        ("process_cpu_seconds_total", core): cpu_seconds,
    }
    if engine_core_thread >= 0.5:  # the relaxed case is a headless engine: no API server visible
        samples[("process_busiest_thread_cpu_ratio", server)] = 0.2
    return Reading(PROCESS_SOURCE, t, True, samples, meta={"processes": [{"pid": 7, "role": "engine_core", "index": 0, "busiest_thread": thread}]})


def starved_run(core_thread: float, gpu_util: float, sm: float, running: float = 8):
    config = load(env={})
    settings = {cid: dataclasses.replace(s, window_seconds=20, for_seconds=0, clear_seconds=0) for cid, s in config.conditions.items()}
    engine = Engine(settings, 20, max_num_seqs=64)
    store = Store(120)
    c = Counters()
    snapshot = None
    for t in range(0, 40, 2):
        c.finished += 1
        c.generation_tokens += 8 * running
        store.add(reading(float(t), page(running, 0, 0.3, c)))
        store.add(gpu_reading(float(t), util=gpu_util, sm=sm))
        store.add(process_reading(float(t), core_thread, cpu_seconds=t * core_thread))
        snapshot = evaluate(engine, store, float(t))
    assert snapshot is not None
    return snapshot, {v.condition: v for v in snapshot.verdicts}


def test_gpu_starved_names_the_saturated_thread():
    snapshot, verdicts = starved_run(core_thread=0.97, gpu_util=0.2, sm=0.05)
    v = verdicts["gpu_starved"]
    assert v.state == "active"
    texts = [e.text for e in v.evidence]
    assert any('engine_core 0 (pid 7): busiest thread "VLLM::EngineCor" (main thread) at 0.97' in t for t in texts)
    assert snapshot.signals["host"]["host_engine_core_cpu_cores"] is not None


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
    assert verdicts["gpu_starved"].cause == "launch_overhead"  # no GIL window, no PCIe traffic in this run
