"""Rollouts of a real vLLM (CPU build, tiny local model) under one steady load, the sidecar watching throughout as a
vLLM container restarts beside it: a restart with the same flags goes on with the same envelope and says nothing; a
restart with a lower --max-num-seqs is regression_after_change, naming the flag and by how much it cost.

The change is 8 -> 1 sequences: on this CPU a step's time grows with its batch, so 8 -> 2 cost only a third of the
throughput per request (0.66 of before, against the 0.8 threshold). The envelope compares across minutes, so what
else the machine runs must stay alike on both sides: CI runs this test first in its lane, beside the unit tests
(the Makefile says why).

The sidecar keeps its test cadence (a 1 s tick); the envelope's own window and match sizes are the defaults."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness import vllm_server
from harness.components import FAST_CADENCE, FAST_CONDITIONS, Sidecar, start_load, start_sidecar

pytestmark = pytest.mark.integration

CLIENTS = 16  # the same load before and after each restart: 16 requests in flight
LOADED_SECONDS = 60  # the envelope's 30 s window, then its 15 points to match, with room


def loaded(sidecar: Sidecar, url: str, seconds: float) -> list[str]:
    """The regression verdict's state once a second while CLIENTS clients keep vLLM busy for `seconds`."""
    load = start_load(url, clients=CLIENTS, prompt_words=20, max_tokens=64)
    states = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            states.append(sidecar.condition("regression_after_change")["state"])
            time.sleep(1)
    finally:
        load.stop()
    return states


def texts(sidecar: Sidecar) -> list[str]:
    return [e["text"] for e in sidecar.condition("regression_after_change")["evidence"]]


def test_a_plain_restart_is_no_change_and_a_lower_max_num_seqs_is_a_regression_naming_it(tmp_path: Path):
    port = vllm_server.free_port()
    server = vllm_server.start(tmp_path / "vllm-1.log", port=port, max_num_seqs=8)
    sidecar = start_sidecar(tmp_path, server.url, FAST_CADENCE + FAST_CONDITIONS)
    try:
        assert "active" not in loaded(sidecar, server.url, LOADED_SECONDS)
        server.stop()
        server = vllm_server.start(tmp_path / "vllm-2.log", port=port, max_num_seqs=8)  # a plain restart: new pids
        states = loaded(sidecar, server.url, LOADED_SECONDS)
        assert "active" not in states, states
        assert any(t.startswith("no change of vLLM's configuration seen") for t in texts(sidecar)), texts(sidecar)
        server.stop()
        server = vllm_server.start(tmp_path / "vllm-3.log", port=port, max_num_seqs=1)
        load = start_load(server.url, clients=CLIENTS, prompt_words=20, max_tokens=64)
        try:
            sidecar.wait_for(lambda: sidecar.condition("regression_after_change")["state"] == "active", 120, "regression_after_change")
            verdict = sidecar.condition("regression_after_change")
        finally:
            load.stop()
        said = [e["text"] for e in verdict["evidence"]]
        print("regression_after_change:", said)
        assert any(t.startswith("changed at ") and t.endswith(": --max-num-seqs 8 -> 1") for t in said), said
        ratio = next(e["value"] for e in verdict["evidence"] if e["signal"] == "vllm_change_throughput_ratio")
        assert ratio <= 0.8, ratio
        assert any("requests in flight" in t and "output tokens per second per request after the change" in t for t in said), said
    finally:
        if sidecar.process.poll() is None:
            print("regression_after_change at the end:", texts(sidecar))
        server.stop()
        sidecar.process.terminate()
        sidecar.process.wait(timeout=10)
        print(sidecar.log_path.read_text()[-3000:])
