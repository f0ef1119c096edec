"""Process discovery with psutil on real processes titled like vLLM's, and command-line parsing."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from vllm_triage.config_loader import load
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.discovery import Discovery
from vllm_triage.exposition import Exposition
from vllm_triage.history.capture import read_readings
from vllm_triage.model import GPU_SOURCE, PROCESS_SOURCE, Reading
from vllm_triage.pipeline import evaluate
from vllm_triage.report import format_report
from vllm_triage.sources.process import ProcessSource, command_line_flags, parse_vllm_args, role_of
from vllm_triage.store import Store

from .pages import Counters, failed, page
from .pages import reading as page_reading
from .test_vllm_source import free_port

H200_KV_THRASH = Path(__file__).resolve().parents[1] / "data" / "real-vllm-h200-kv_thrash.jsonl.gz"


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
    assert parse_vllm_args(["vllm", "serve", "m" * 10_000, "--port", "70000", "--gpu-memory-utilization", "nan"]) == {"model": "m" * 256}


def test_command_line_flags_keep_every_flag_as_written_without_secrets():
    """What a change between two starts is told by: every flag, also those no signal reads, a flag alone as "", and no
    secret's value (an API key must not reach /diagnosis, a bundle or a dashboard)."""
    cmdline = ["vllm", "serve", "meta/llama", "--enforce-eager", "--compilation-config", '{"level": 0}', "--api-key=s3cr3t", "--hf-token", "hf_x"]
    flags = command_line_flags([*cmdline, "--max-num-seqs", "-1", "--kv-cache-dtype=fp8"])
    assert flags == {
        "--enforce-eager": "",
        "--compilation-config": '{"level": 0}',
        "--api-key": "(redacted)",
        "--hf-token": "(redacted)",
        "--max-num-seqs": "-1",
        "--kv-cache-dtype": "fp8",
    }
    assert "s3cr3t" not in str(flags) and "hf_x" not in str(flags)
    assert len(command_line_flags(["vllm", *(f"--flag-{i}" for i in range(10_000))])) == 128


@pytest.mark.parametrize(
    ("cmdline", "graphs"),
    [
        (["vllm", "serve", "m"], True),
        (["vllm", "serve", "m", "--enforce-eager"], False),
        (["vllm", "serve", "m", "--compilation-config", '{"cudagraph_mode": "NONE"}'], False),
        (["vllm", "serve", "m", '--compilation-config={"cudagraph_mode": "FULL_AND_PIECEWISE"}'], True),
        (["vllm", "serve", "m", "--compilation-config", "{not json"], True),  # vLLM refuses it: it would not be running
    ],
)
def test_whether_cuda_graphs_are_on_is_read_from_the_command_line_and_unknown_without_it(cmdline, graphs):
    seen = Discovery(256, "default", "", None, parse_vllm_args(cmdline), ({"pid": 1, "role": "api_server"},), api_server_flags=command_line_flags(cmdline))  # type: ignore[typeddict-item]
    assert seen.facts().cuda_graphs is graphs
    assert dataclasses.replace(seen, processes=()).facts().cuda_graphs is None  # no host view: not known, not "on"


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
import os, socket, subprocess, sys, time
if os.environ.get("FAKE_COMM_HEX"):  # a thread name as the kernel may cut it
    open("/proc/self/comm", "wb").write(bytes.fromhex(os.environ["FAKE_COMM_HEX"]))
port = int(sys.argv[sys.argv.index("--port") + 1])
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port)); listener.listen()
core = subprocess.Popen(["VLLM::EngineCore", "-c", "import time; time.sleep(60)"], executable=sys.executable)
print("ready", core.pid, flush=True)
time.sleep(60)
"""


def fake_vllm(port: int, max_num_seqs: int | str, comm: bytes = b"") -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [sys.executable, "-c", FAKE_API_SERVER, "vllm.entrypoints.openai.api_server", "--port", str(port), "--max-num-seqs", str(max_num_seqs)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FAKE_COMM_HEX": comm.hex()},
    )
    assert server.stdout is not None
    line = server.stdout.readline().split()
    return server, int(line[1])


def judged(reading) -> dict:
    """The discovery /diagnosis shows after one reading."""
    store = Store(60)
    store.add(reading)
    return evaluate(Engine(load(env={}).conditions, 60), store, reading.timestamp).discovery.to_json()


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


def test_a_hostile_command_line_and_a_split_thread_name_are_data_not_a_broken_evaluation():
    """A 400-digit or negative --max-num-seqs is ignored with a message (vLLM's default applies), and a thread name
    the kernel cut inside a UTF-8 character is read with a replacement character: evaluation and the report go on."""
    for hostile in ("9" * 400, "-1"):
        port = free_port()
        # the kernel keeps 15 bytes: "é" (2 bytes) at bytes 14-15 is split, as a long UTF-8 name would be
        server, core = fake_vllm(port, hostile, comm=b"api-server-ab\xc3")
        try:
            source = ProcessSource(port=port)
            source.collect()
            time.sleep(0.2)
            reading = source.collect()  # the second read of the threads names the busiest
            busiest = {e["pid"]: e["busiest_thread"] for e in reading.meta["processes"]}
            assert busiest[server.pid]["name"] == "api-server-ab\ufffd", busiest
            store = Store(60)
            store.add(reading)
            snapshot = evaluate(Engine(load(env={}).conditions, 60), store, reading.timestamp)
            assert snapshot.discovery.max_num_seqs_origin == "default"
            assert "max_num_seqs" not in reading.meta["api_server_args"]
            assert "max_num_seqs=" in format_report(snapshot, "vllm")
        finally:
            server.kill()
            server.wait()
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGKILL)


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
        assert reading.meta["api_server_flags"] == {"--max-num-seqs": "48", "--port": "18123"}
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


def test_a_process_titled_after_its_start_is_found_and_a_settled_one_is_not_read_again(monkeypatch):
    """vLLM titles its processes after they start (the pid and start time stay): a young process' command line is read
    at every scan until it has settled, then only a new process (or a pid's new process), and vLLM's own, are read."""
    import vllm_triage.sources.process as process_source

    late = subprocess.Popen(["bash", "-c", "sleep 0.5; exec -a VLLM::EngineCore sleep 30"])
    try:
        source = ProcessSource(port=None)
        source._scan()
        assert late.pid not in source._titled  # still bash
        time.sleep(1.0)
        source._scan()
        assert late.pid in source._titled  # the same process, titled since

        monkeypatch.setattr(process_source, "TITLE_SETTLED_SECONDS", 0.0)
        read = []
        real = psutil.Process.cmdline
        monkeypatch.setattr(psutil.Process, "cmdline", lambda self: read.append(self.pid) or real(self))
        source._scan()
        assert late.pid in read and late.pid in source._titled  # vLLM's own are read at every scan: one may have exited
        settled = set(psutil.pids()) - source._titled  # another vLLM on the host is read at every scan too
        read.clear()
        source._scan()
        assert not set(read) & settled  # nothing else known was read again
    finally:
        late.kill()
        late.wait()


def test_threads_are_read_every_ten_seconds_and_the_busiest_is_repeated_between(monkeypatch):
    import vllm_triage.sources.process as process_source

    spinner = subprocess.Popen(["bash", "-c", f"exec -a VLLM::EngineCore {sys.executable} -c 'while True: pass'"])
    reads = []
    real = process_source._thread_schedstats
    monkeypatch.setattr(process_source, "_thread_schedstats", lambda pid: reads.append(pid) or real(pid))
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


# A tensor-parallel vLLM as the host shows it: an API server listening, its engine core, and one worker per GPU titled
# with its ranks (vLLM 0.26's setproctitle: Worker[_DP<d>][_PP<p>][_TP<t>]).
FAKE_TP_SERVER = """
import socket, subprocess, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port)); listener.listen()
children = [subprocess.Popen([title, "-c", "import time; time.sleep(60)"], executable=sys.executable)
            for title in ("VLLM::EngineCore", "VLLM::Worker_TP0", "VLLM::Worker_TP1")]
print("ready", *(c.pid for c in children), flush=True)
time.sleep(60)
"""


def fake_tp_server() -> tuple[subprocess.Popen, int, int, int, int]:
    """A FAKE_TP_SERVER listening on a free port: it, its port, and the pids of its engine core and two workers."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", FAKE_TP_SERVER, "vllm.entrypoints.openai.api_server", "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    core, tp0, tp1 = map(int, server.stdout.readline().split()[1:])
    return server, port, core, tp0, tp1


def with_gpu_processes(held: list[tuple[int, int]]) -> Reading:
    """A GPU reading as the H200's (tests/data, TP=1) with NVML's compute processes replaced: (pid, gpu) each."""
    gpu = next(r for r in read_readings(H200_KV_THRASH) if r.source == GPU_SOURCE and r.ok)
    meta = {**gpu.meta, "compute_processes": [{"gpu": g, "pid": pid, "used_bytes": 2.0**33} for pid, g in held]}
    return dataclasses.replace(gpu, meta=meta)


def test_the_rank_map_names_each_workers_ranks_and_gpu_from_its_title_and_nvml():
    """The 2-GPU machine was not lent: a real process tree titled as vLLM titles a TP=2 engine, NVML's compute processes
    of the real H200 reading moved onto GPUs 2 and 3. What /diagnosis, the report and /metrics say of it."""
    server, port, core, tp0, tp1 = fake_tp_server()
    try:
        time.sleep(0.3)
        processes = ProcessSource(port=port).collect()
        assert {p["pid"]: p.get("title") for p in processes.meta["processes"]} == {
            server.pid: None,
            core: "VLLM::EngineCore",
            tp0: "VLLM::Worker_TP0",
            tp1: "VLLM::Worker_TP1",
        }
        store = Store(60)
        store.add(processes)
        store.add(dataclasses.replace(with_gpu_processes([(tp0, 2), (tp1, 3)]), timestamp=processes.timestamp))
        snapshot = evaluate(Engine(load(env={}).conditions, 60), store, processes.timestamp)
        assert [(r["role"], r["dp_rank"], r["tp_rank"], r["gpus"]) for r in snapshot.discovery.ranks] == [("worker", 0, 0, [2]), ("worker", 0, 1, [3])]
        said = f"engine 0: TP=2, 2 ranks on GPUs 2,3: TP0 GPU 2 (worker pid {tp0}), TP1 GPU 3 (worker pid {tp1})"
        assert list(snapshot.discovery.parallelism) == [said]
        assert said in format_report(snapshot, "vllm")
        exposition = Exposition(load(env={}).conditions, 1.0)
        exposition.update(snapshot)
        text = exposition.render(False).decode()
        assert 'vllm_triage_rank_info{engine="0",gpu="2",pp_rank="0",role="worker",tp_rank="0"} 1.0' in text
        assert 'vllm_triage_rank_info{engine="0",gpu="3",pp_rank="0",role="worker",tp_rank="1"} 1.0' in text
    finally:
        for child in psutil.Process(server.pid).children(recursive=True):
            child.kill()
        server.kill()
        server.wait()


def test_the_rank_map_of_the_h200_engine_is_its_engine_core_on_gpu_0_and_says_what_it_does_not_know():
    """The real H200 captures: vLLM 0.26 without tensor parallelism runs the model in its engine core (no worker)."""
    readings = [r for r in read_readings(H200_KV_THRASH) if r.source in (PROCESS_SOURCE, GPU_SOURCE)][:4]
    store = Store(60)
    for reading in readings:
        store.add(reading)
    found = evaluate(Engine(load(env={}).conditions, 60), store, readings[-1].timestamp).discovery.to_json()
    core = next(p["pid"] for p in found["processes"] if p["role"] == "engine_core")
    assert found["parallelism"] == [f"engine 0: TP=1, 1 rank on GPU 0: TP0 GPU 0 (engine_core pid {core})"]
    # A DP=2 x TP=2 server whose workers' memory NVML lists under other pids (another pid namespace): said so.
    titled = [{"pid": 10 + i, "role": "worker", "index": i, "title": f"VLLM::Worker_DP{i // 2}_TP{i % 2}"} for i in range(4)]
    process = next(r for r in readings if r.source == PROCESS_SOURCE)
    store.add(dataclasses.replace(process, timestamp=readings[-1].timestamp + 1, meta={**process.meta, "processes": titled}))
    store.add(dataclasses.replace(with_gpu_processes([(10, 0), (11, 1)]), timestamp=readings[-1].timestamp + 1))
    found = evaluate(Engine(load(env={}).conditions, 60), store, readings[-1].timestamp + 1).discovery.to_json()
    assert found["parallelism"][0] == "engine 0: TP=2, 2 ranks on GPUs 0,1: TP0 GPU 0 (worker pid 10), TP1 GPU 1 (worker pid 11)"
    assert found["parallelism"][1].startswith("engine 1: TP=2, 2 ranks: TP0 GPU unknown (worker pid 12), TP1 GPU unknown (worker pid 13) (NVML lists no memory")


def test_a_tensor_parallel_rank_that_dies_or_stops_while_its_engine_core_runs_is_the_primary_verdict():
    """A real process tree titled as a TP=2 vLLM: one worker SIGKILLed (left unreaped, as vLLM's executor may) while the
    engine core lives on, then, in a second life, one worker SIGSTOPped. vLLM's page meanwhile shows 8 requests running
    and no token: engine_wedged comes with the stall, tp_rank_lost names the rank and leads."""
    for kill in (signal.SIGKILL, signal.SIGSTOP):
        server, port, core, _, tp1 = fake_tp_server()
        try:
            time.sleep(0.3)
            source = ProcessSource(port=port, clock=lambda: 0.0)
            before = source.collect()
            assert before.samples[("process_lost", (("role", "worker"),))] == 0.0 and "lost_workers" not in before.meta
            os.kill(tp1, kill)
            time.sleep(0.3)
            after = source.collect()
            config = load(env={})
            store, engine, counters = Store(120), Engine(config.conditions, 60), Counters()
            verdicts = {}
            for t in range(0, 62, 2):
                store.add(page_reading(float(t), page(8, 0, 0.3, counters)))  # 8 running, the token counters frozen
                store.add(dataclasses.replace(after, timestamp=float(t)))
                snapshot = evaluate(engine, store, float(t))
                verdicts[t] = {v.condition: v for v in snapshot.verdicts}
            lost = verdicts[60]["tp_rank_lost"]
            if kill == signal.SIGKILL:
                assert after.samples[("process_lost", (("role", "worker"),))] == 1.0
                assert [(w["pid"], w["title"], w["engine_core_pid"]) for w in after.meta["lost_workers"]] == [(tp1, "VLLM::Worker_TP1", core)]
                assert verdicts[8]["tp_rank_lost"].state == "inactive" and verdicts[10]["tp_rank_lost"].state == "active"  # for 10 s
                assert lost.cause == "exited"
                assert any(f"worker VLLM::Worker_TP1 (pid {tp1}) is zombie while its engine core (pid {core}) runs on" in e.text for e in lost.evidence)
                assert snapshot.discovery.lost_workers[0]["pid"] == tp1
            else:
                assert after.samples[("process_lost", (("role", "worker"),))] == 0.0  # stopped, not gone
                assert verdicts[20]["tp_rank_lost"].state == "inactive" and verdicts[30]["tp_rank_lost"].state == "active"  # 20 s, then for 10 s
                assert lost.cause == "stopped"
                assert any(f"worker VLLM::Worker_TP1 (pid {tp1}) is stopped: it runs no code" in e.text for e in lost.evidence), [e.text for e in lost.evidence]
            assert lost.role == "primary" and verdicts[60]["engine_wedged"].state == "active"  # the stall, named by its cause
            os.kill(core, signal.SIGKILL)  # the engine core exits too (vLLM's shutdown, a restart): the rank is forgotten
            time.sleep(0.3)
            assert source.collect().samples[("process_lost", (("role", "worker"),))] == 0.0
        finally:
            for child in psutil.Process(server.pid).children(recursive=True):
                child.kill()
            server.kill()
            server.wait()


def test_without_schedstats_threads_are_read_through_psutil(monkeypatch):
    """A kernel that keeps no schedstats: the busiest thread still comes (psutil's per-thread times), with no run-queue wait."""
    import vllm_triage.sources.process as process_source

    monkeypatch.setattr(process_source, "_thread_schedstats", lambda pid: None)
    spinner = subprocess.Popen(["bash", "-c", f"exec -a VLLM::EngineCore {sys.executable} -c 'while True: pass'"])
    try:
        time.sleep(0.3)
        source = ProcessSource(port=None)
        source.collect()
        time.sleep(1.0)
        entry = next(p for p in source.collect().meta["processes"] if p["pid"] == spinner.pid)
    finally:
        spinner.kill()
    assert entry["busiest_thread"]["main"] and entry["busiest_thread"]["cpu_ratio"] > 0.3, entry
    assert "neediest_thread" not in entry, entry


def test_a_crash_looping_api_server_is_counted_and_a_loading_one_is_timed_on_real_processes():
    """What vllm_unreachable's start causes are read from, on real processes: API servers that start and die under new pids
    (each lives 1.5 s, as a bad model path's) are counted with when they went; one that runs without listening (loading)
    has its start time; one started for another port is ignored and counted as such."""
    port = free_port()
    source = ProcessSource(port)
    crash = [sys.executable, "-c", "import time; time.sleep(1.5)", "vllm.entrypoints.openai.api_server", "--port", str(port)]
    readings = []
    for _ in range(3):
        dying = subprocess.Popen(crash)
        while dying.poll() is None:
            readings.append(source.collect())
            time.sleep(0.3)
        readings.append(source.collect())
    last = readings[-1]
    assert last.process_meta()["process_view"] is True
    assert last.samples[("process_exits_total", (("role", "api_server"),))] == 3.0
    exits = last.process_meta()["api_server_exit_times"]
    assert len(exits) == 3 and exits == sorted(exits) and exits[-1] - exits[0] < 10
    seen = {p["pid"] for r in readings for p in r.process_meta()["processes"] if p["role"] == "api_server"}
    assert len(seen) == 3  # each life was watched, under its own pid

    loading = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "vllm.entrypoints.openai.api_server", "--port", str(port)])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "vllm.entrypoints.openai.api_server", "--port", str(free_port())])
    try:
        time.sleep(0.5)
        reading = source.collect()
        started = reading.samples[("process_start_time_seconds", (("index", "0"), ("role", "api_server")))]
        assert abs(started - psutil.Process(loading.pid).create_time()) < 0.01
        assert [p["pid"] for p in reading.process_meta()["processes"]] == [loading.pid]
        assert reading.process_meta()["ignored_processes"] >= 1  # the server of another port (and the other tests' fakes)
    finally:
        for process in (loading, other):
            process.kill()
            process.wait()


def test_a_process_entered_into_the_sidecars_own_container_is_no_view_of_vllms(monkeypatch):
    """`kubectl exec ... vllm-triage report` or the image's HEALTHCHECK start processes in the sidecar's own container: they
    are not vLLM's, and a sidecar without a shared process namespace must not take them for a view of vLLM's processes
    (the start-up wait would drop from the budget to not_started_seconds). Processes in another cgroup (another
    container: the pod's pause process, vLLM's) are."""
    from vllm_triage.sources import process

    entered = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # not the sidecar's child or parent
    try:
        real = process._cgroup_of
        visible = {os.getpid(), entered.pid}
        monkeypatch.setattr(process.psutil, "pids", lambda: sorted(visible))
        monkeypatch.setattr(process, "_own_tree", lambda: {os.getpid()})
        monkeypatch.setattr(process, "_cgroup_of", lambda pid: "0::/kubepods/pod1/sidecar\n")
        source = ProcessSource(port=free_port())
        assert source.collect().process_meta().get("process_view") is False
        monkeypatch.setattr(process, "_cgroup_of", lambda pid: "0::/kubepods/pod1/pause\n" if pid == entered.pid else "0::/kubepods/pod1/sidecar\n")
        assert ProcessSource(port=free_port()).collect().process_meta()["process_view"] is True
        assert real(os.getpid())  # readable by anyone, as the check needs
    finally:
        entered.kill()
        entered.wait()


# (a flag's value as written, a secret in it that must not be kept, what stays readable)
CREDENTIAL_SHAPES = [
    ("https://alice:hunter2@hub.example.com/models/llama", "hunter2", "hub.example.com/models/llama"),
    ("s3://bucket/llama?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=f00dbeef", "f00dbeef", "s3://bucket/llama"),
    ("https://store.example.com/m.gguf?sig=abcdef123456&se=2026", "abcdef123456", "store.example.com/m.gguf"),
    ('{"kv_connector": "LMCacheConnectorV1", "kv_connector_extra_config": {"api_token": "tok-9f8e"}}', "tok-9f8e", "LMCacheConnectorV1"),
    ('{"remote_url": "redis://user:redispass@cache:6379/0"}', "redispass", "cache:6379"),
    ("password=letmein", "letmein", "password="),
    ("authorization: Bearer eyJhbGciOi", "eyJhbGciOi", "authorization"),
]


@pytest.mark.parametrize(("value", "secret", "kept"), CREDENTIAL_SHAPES, ids=[s[1] for s in CREDENTIAL_SHAPES])
def test_credentials_inside_flag_values_are_never_kept(value, secret, kept):
    """A flag's name can be harmless while its value carries a credential (a URL with a password, a signed URL, a JSON
    config with a token): it reached /diagnosis, bundles and the envelope file. The process source keeps neither the
    flags nor the model path with it; what is not secret stays readable."""
    cmdline = ["vllm", "serve", value, "--model-loader-extra-config", value, "--kv-transfer-config", value, "--max-num-batched-tokens", "8192"]
    flags, args = command_line_flags(cmdline), parse_vllm_args(cmdline)
    shown = f"{flags} {args}"
    assert secret not in shown and kept in shown, shown
    assert flags["--max-num-batched-tokens"] == "8192"  # a count whose name says "tokens" is no secret
