"""The real vLLM (CPU build) the integration tests share; the other components are in harness/."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from harness import vllm_server


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_server.VllmServer]:
    """One vLLM for the whole run (startup costs ~30 s); test_real_vllm.py kills it last."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    started = time.monotonic()
    server = vllm_server.start(log)
    print(f"vLLM ready in {time.monotonic() - started:.0f} s at {server.url}")
    yield server
    server.stop()
