"""Process discovery with psutil on real processes titled like vLLM's, and command-line parsing."""

from __future__ import annotations

import subprocess
import time

from vllm_triage.config import load
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.sources.process import ProcessSource, parse_vllm_args, role_of
from vllm_triage.store import Store


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


def test_discovers_real_processes_and_feeds_max_num_seqs(tmp_path):
    # Real processes whose command lines look like vLLM's: a `vllm` console script run by its
    # interpreter, and a process titled VLLM::EngineCore (exec -a sets argv[0] as setproctitle does).
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    server = subprocess.Popen(["/bin/sh", str(script), "serve", "m", "--max-num-seqs", "48", "--port", "18123"])
    core = subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 30"])
    try:
        time.sleep(0.3)
        reading = ProcessSource(port=18123).collect()
        roles = {p["pid"]: p["role"] for p in reading.meta["processes"]}
        assert roles[server.pid] == "api_server" and roles[core.pid] == "engine_core"
        assert reading.meta["api_server_args"]["max_num_seqs"] == 48
        store = Store(60)
        store.add(reading)
        snapshot = Engine(load(env={}).conditions, 60).evaluate(store, reading.timestamp)
        assert snapshot.discovery["max_num_seqs"] == 48
        assert snapshot.discovery["max_num_seqs_origin"] == "command_line"
        # another port: not our vLLM, so vLLM's default applies and says so
        other = ProcessSource(port=18124).collect()
        store = Store(60)
        store.add(other)
        snapshot = Engine(load(env={}).conditions, 60).evaluate(store, other.timestamp)
        assert snapshot.discovery["max_num_seqs_origin"] == "default"
        assert "default" in snapshot.discovery["max_num_seqs_text"]
    finally:
        server.kill()
        core.kill()
