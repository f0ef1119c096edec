"""A real tensor-parallel vLLM: the CPU build at --tensor-parallel-size 2 (an engine core and two workers titled
VLLM::Worker_TP0 and _TP1, each holding half of every layer, their all-reduces over shared memory), beside a sidecar
at the fast cadence: its rank map, a rank stopped and continued, then a rank killed."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from harness import vllm_server
from harness.components import FAST_CADENCE, start_load, start_sidecar

pytestmark = pytest.mark.integration

CONFIG = (
    FAST_CADENCE
    + """conditions:
  vllm_unreachable: {for_seconds: 3, clear_for_seconds: 3}
  tp_rank_lost: {for_seconds: 3, clear_for_seconds: 5}
  engine_wedged: {for_seconds: 3, clear_for_seconds: 5}
"""
)


def test_a_stopped_rank_is_named_and_leads_the_stall_and_a_killed_rank_takes_the_server_down(tmp_path):
    server = vllm_server.start(tmp_path / "vllm.log", tensor_parallel_size=2)
    sidecar = load = None
    try:
        sidecar = start_sidecar(tmp_path, server.url, CONFIG, "--sources", "vllm,process")
        sidecar.wait_for(lambda: "TP=2" in " ".join(sidecar.diagnosis()["discovery"]["parallelism"]), 30, "the rank map")
        found = sidecar.diagnosis()["discovery"]
        workers = {r["tp_rank"]: r["pid"] for r in found["ranks"]}
        assert found["parallelism"] == [f"engine 0: TP=2, 2 ranks: TP0 (worker pid {workers[0]}), TP1 (worker pid {workers[1]})"]
        load = start_load(server.url, clients=4, prompt_words=50, max_tokens=200)
        time.sleep(10)
        assert not any(sidecar.active().values()), sidecar.active()
        # TP1 stopped (SIGSTOP: a debugger, a checkpointing tool): TP0 and the engine core wait for it in the all-reduce
        os.kill(workers[1], signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while psutil.Process(workers[1]).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.1)
        assert psutil.Process(workers[1]).status() == psutil.STATUS_STOPPED, "the kernel did not stop TP1"
        took = sidecar.wait_for(lambda: sidecar.active()["tp_rank_lost"] == 1.0, 60, "tp_rank_lost after a rank stopped", shows="tp_rank_lost")
        print(f"tp_rank_lost {took:.0f} s after TP1 stopped")
        lost = sidecar.condition("tp_rank_lost")
        assert lost["cause"] == "stopped" and lost["role"] == "primary", lost
        assert any(f"worker VLLM::Worker_TP1 (pid {workers[1]}) is stopped" in e["text"] for e in lost["evidence"]), lost["evidence"]
        # engine_wedged comes beside it only where vLLM's gauges still count the stuck requests: the engine core publishes
        # them after a step, and a step stuck in its all-reduce publishes nothing (two of four runs here read 0 pending)
        time.sleep(10)
        assert sidecar.diagnosis()["primary"] == "tp_rank_lost"
        os.kill(workers[1], signal.SIGCONT)
        sidecar.wait_for(lambda: sidecar.active()["tp_rank_lost"] == 0.0 and sidecar.active()["engine_wedged"] == 0.0, 60, "both clear once it runs")
        # TP1 killed: vLLM's executor sees its worker die and shuts the server down (vLLM 0.32.0 logs "Worker proc
        # VllmWorker-1 died unexpectedly ... shutting down executor"): nothing answers, and that is what pages
        os.kill(workers[1], signal.SIGKILL)
        took = sidecar.wait_for(lambda: sidecar.active()["vllm_unreachable"] == 1.0, 90, "vllm_unreachable after a rank died")
        print(f"vllm_unreachable {took:.0f} s after TP1 was killed")
        assert "died unexpectedly" in server.log_path.read_text()
    finally:
        if load is not None:
            load.stop()
        if sidecar is not None:
            sidecar.process.terminate()
            sidecar.process.wait(timeout=10)
        server.kill()
