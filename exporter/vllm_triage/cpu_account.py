"""The sidecar's own CPU by stage, exported as vllm_triage_sidecar_cpu_seconds_total{stage}: what it costs
beside vLLM and where (node_exporter's per-collector durations, in CPU seconds). Each stage runs on one
thread at a time, so its cost is that thread's CPU clock around it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
EVENT_LOOP = "event_loop"  # the main thread: HTTP serving, vLLM's page on the wire, py-spy's windows


class CpuAccount:
    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._lock = threading.Lock()
        main = threading.main_thread().ident
        self._main_clock = time.pthread_getcpuclockid(main) if main is not None and hasattr(time, "pthread_getcpuclockid") else None

    def run(self, stage: str, work: Callable[..., T], *args: object) -> T:
        """work(*args), its CPU time added to `stage`."""
        started = time.thread_time()
        try:
            return work(*args)
        finally:
            spent = time.thread_time() - started
            with self._lock:
                self._seconds[stage] = self._seconds.get(stage, 0.0) + spent

    def totals(self) -> dict[str, float]:
        with self._lock:
            totals = dict(self._seconds)
        if self._main_clock is not None:
            totals[EVENT_LOOP] = time.clock_gettime(self._main_clock)
        return totals


CPU = CpuAccount()  # one per process, like the process_cpu_seconds_total it breaks down
