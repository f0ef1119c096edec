"""Process discovery with psutil on real processes titled like vLLM's, and command-line parsing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
from vllm_triage.config import load
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.model import GPU_SOURCE, PROCESS_SOURCE, Reading
from vllm_triage.pipeline import evaluate
from vllm_triage.sources.process import ProcessSource, parse_vllm_args, role_of
from vllm_triage.store import Store

from .pages import Counters, failed, page
from .pages import reading as page_reading
from .test_vllm_source import free_port


def test_parse_vllm_args_both_spellings():
    args = parse_vllm_args(
        [
            "python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "/m",
            "--max-num-seqs=32",
            "-tp",
            "8",
            "--port",
            "8001",
            "--enable-prefix-caching",
        ]
    )
    assert args == {"model": "/m", "max_num_seqs": 32, "tensor_parallel_size": 8, "port": 8001, "enable_prefix_caching": True}
    assert parse_vllm_args(["/venv/bin/vllm", "serve", "meta/llama", "--max-num-seqs", "x"]) == {"model": "meta/llama"}


def test_roles():
    assert role_of(["VLLM::EngineCore"], "VLLM") == "engine_core"
    assert role_of(["VLLM::EngineCore_DP1"], "VLLM") == "engine_core"
    assert role_of(["VLLM::Worker_TP3"], "VLLM") == "worker"
    assert role_of(["MYAPP::Worker_TP0"], "MYAPP") == "worker"
    assert role_of(["/usr/bin/vllm", "serve", "m"], "VLLM") == "api_server"
    assert role_of(["python", "-m", "vllm.entrypoints.openai.api_server"], "VLLM") == "api_server"
    # the sidecar itself mentions vllm and serve, but is not vLLM
    assert role_of(["python", "/venv/bin/vllm-triage", "serve", "--vllm-url", "x"], "VLLM") is None


# A process that looks like vLLM's API server to the sidecar (`python -c CODE vllm.entrypoints... --port P`):
# it listens on P and starts an engine core titled VLLM::EngineCore (argv[0], as setproctitle sets it).
FAKE_API_SERVER = """
import socket, subprocess, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port)); listener.listen()
core = subprocess.Popen(["VLLM::EngineCore", "-c", "import time; time.sleep(60)"], executable=sys.executable)
print("ready", core.pid, flush=True)
time.sleep(60)
"""


def fake_vllm(port: int, max_num_seqs: int) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [sys.executable, "-c", FAKE_API_SERVER, "vllm.entrypoints.openai.api_server", "--port", str(port), "--max-num-seqs", str(max_num_seqs)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline().split()
    return server, int(line[1])


def judged(reading) -> dict:
    store = Store(60)
    store.add(reading)
    return evaluate(Engine(load(env={}).conditions, 60), store, reading.timestamp).discovery


def test_watches_only_the_vllm_it_scrapes_among_several_on_the_host():
    first_port, second_port = free_port(), free_port()
    first, first_core = fake_vllm(first_port, 48)
    second, second_core = fake_vllm(second_port, 96)
    stray = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 60"])  # a leftover engine core of a third
    try:
        time.sleep(0.3)
        reading = ProcessSource(port=first_port).collect()
        assert {p["pid"]: p["role"] for p in reading.meta["processes"]} == {first.pid: "api_server", first_core: "engine_core"}
        assert reading.meta["ignored_processes"] >= 3  # the other two servers' and the stray (and any other vLLM here)
        assert f"listening on port {first_port} (pid {first.pid})" in reading.meta["binding"]
        found = judged(reading)
        assert found["max_num_seqs"] == 48 and found["max_num_seqs_origin"] == "command_line"
        assert "listening on port" in found["process_binding"]
        reading = ProcessSource(port=second_port).collect()
        assert {p["pid"] for p in reading.meta["processes"]} == {second.pid, second_core}
        assert judged(reading)["max_num_seqs"] == 96
        # a port no server listens on and none was started for: the others are foreign, vLLM's default applies
        other = ProcessSource(port=free_port()).collect()
        watched = {p["pid"] for p in other.meta["processes"]}
        assert stray.pid in watched and not watched & {first.pid, first_core, second.pid, second_core}
        assert "assumed" in other.meta["binding"]
        assert judged(other)["max_num_seqs_origin"] == "default"
    finally:
        for process in (first, second, stray):
            process.kill()
            process.wait()
        for pid in (first_core, second_core):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_binds_by_the_api_servers_port_flag_when_its_socket_is_not_visible(tmp_path):
    # In another network namespace the listening socket is invisible; the --port flag still says which server
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\nbash -c 'exec -a VLLM::EngineCore sleep 30' &\nsleep 30\n")
    script.chmod(0o755)
    server = subprocess.Popen(["/bin/sh", str(script), "serve", "m", "--max-num-seqs", "48", "--port", "18123"])
    foreign = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 30"])
    try:
        time.sleep(0.3)
        reading = ProcessSource(port=18123).collect()
        roles = sorted(p["role"] for p in reading.meta["processes"])
        assert roles == ["api_server", "engine_core"] and foreign.pid not in {p["pid"] for p in reading.meta["processes"]}
        assert "started with --port 18123" in reading.meta["binding"]
        assert reading.meta["api_server_args"]["max_num_seqs"] == 48
    finally:
        for child in psutil.Process(server.pid).children(recursive=True):
            child.kill()
        server.kill()
        foreign.kill()


def test_sockets_are_read_again_only_when_vllms_processes_change(monkeypatch):
    """Binding reads every process' sockets: a rescan with the same vLLM processes keeps the binding; a
    restarted server (new pids) is bound again."""
    import vllm_triage.sources.process as process_source

    reads = []
    real = process_source._listening_pids
    monkeypatch.setattr(process_source, "_listening_pids", lambda port: reads.append(port) or real(port))
    port = free_port()
    server, core = fake_vllm(port, 48)
    try:
        source = ProcessSource(port=port)
        for _ in range(3):
            source._scanned_at = -float("inf")  # as when RESCAN_SECONDS have passed
            reading = source.collect()
            assert {p["pid"] for p in reading.meta["processes"]} == {server.pid, core}
        assert len(reads) == 1
    finally:
        server.kill()
        server.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(core, signal.SIGKILL)
    restarted, restarted_core = fake_vllm(port, 64)
    try:
        time.sleep(0.3)
        reading = source.collect()  # the old pids are gone: rescanned and bound again
        assert {p["pid"] for p in reading.meta["processes"]} == {restarted.pid, restarted_core} and len(reads) == 2
    finally:
        restarted.kill()
        restarted.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(restarted_core, signal.SIGKILL)


def test_threads_are_read_every_ten_seconds_and_the_busiest_is_repeated_between(monkeypatch):
    import vllm_triage.sources.process as process_source

    spinner = subprocess.Popen(["bash", "-c", f"exec -a VLLM::EngineCore {sys.executable} -c 'while True: pass'"])
    reads = []
    real = psutil.Process.threads
    monkeypatch.setattr(psutil.Process, "threads", lambda self: reads.append(self.pid) or real(self))
    clock = {"now": 1000.0}
    monkeypatch.setattr(process_source.time, "monotonic", lambda: clock["now"])
    try:
        time.sleep(0.3)
        source = ProcessSource(port=None)

        def engine_core(reading):
            return next(p for p in reading.meta["processes"] if p["pid"] == spinner.pid)

        source.collect()
        time.sleep(1.0)
        clock["now"] += 1.0
        first = engine_core(source.collect())["busiest_thread"]  # the first ratio comes as soon as it can
        assert first["main"] and reads.count(spinner.pid) == 2
        for _ in range(4):  # 2 s apart, within 10 s: the same figure, no thread read
            clock["now"] += 2.0
            reading = source.collect()
            assert engine_core(reading)["busiest_thread"] == first and reads.count(spinner.pid) == 2
            labels = (("index", str(engine_core(reading)["index"])), ("role", "engine_core"))
            assert reading.samples[("process_busiest_thread_cpu_ratio", labels)] == first["cpu_ratio"]
            assert reading.samples[("process_threads", labels)] >= 1
        clock["now"] += 2.0
        source.collect()
        assert reads.count(spinner.pid) == 3  # 10 s after the last read
    finally:
        spinner.kill()
        spinner.wait()


def test_an_engine_core_that_outlives_its_api_server_is_named_with_the_gpu_memory_it_holds():
    """The API server SIGKILLed (an OOM kill) while its engine core lives on, holding its GPU: vLLM's port stops
    answering, and the verdict says what of vLLM still runs and what it holds."""
    port = free_port()
    server, core = fake_vllm(port, 48)
    try:
        time.sleep(0.3)
        source = ProcessSource(port=port)
        assert source.collect().meta.get("orphans") is None
        server.kill()  # unreaped for now: a zombie is no API server either
        time.sleep(0.3)
        reading = source.collect()
        assert [(o["pid"], o["role"]) for o in reading.meta["orphans"]] == [(core, "engine_core")]
        assert core not in {p["pid"] for p in reading.meta["processes"]}  # not judged as the server's engine core
        orphaned = {dict(labels)["role"]: value for (name, labels), value in reading.samples.items() if name == "process_orphaned"}
        assert orphaned == {"engine_core": 1.0, "worker": 0.0}
        server.wait()
        assert [o["pid"] for o in source.collect().meta["orphans"]] == [core]  # reaped: still the orphan's story
        config = load(env={})
        store, engine = Store(120), Engine(config.conditions, 60)
        store.add(page_reading(0.0, page(4, 0, 0.3, Counters())))  # vLLM answered before its API server was killed
        for t in range(2, 52, 2):
            store.add(failed(float(t)))
            store.add(Reading(PROCESS_SOURCE, float(t), True, reading.samples, meta=reading.meta))
            store.add(Reading(GPU_SOURCE, float(t), True, {}, meta={"compute_processes": [{"gpu": 0, "pid": core, "used_bytes": 70.5 * 2**30}]}))
            snapshot = evaluate(engine, store, float(t))
        unreachable = next(v for v in snapshot.verdicts if v.condition == "vllm_unreachable")
        assert unreachable.active
        assert any(f"engine_core pid {core}" in e.text and "holds 70.5 GiB on GPU 0" in e.text and "kill" in e.text for e in unreachable.evidence), [
            e.text for e in unreachable.evidence
        ]
        os.kill(core, signal.SIGKILL)
        time.sleep(0.3)
        assert source.collect().meta.get("orphans") is None  # gone with the orphan: nothing holds the GPU
    finally:
        server.kill()
        server.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(core, signal.SIGKILL)
