"""A process that holds the GIL a known share of the time, and the GIL source's reading of it: the truth
the GIL source is checked against (tests/unit/test_gil.py, bench/gil_accuracy.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from vllm_triage.model import ProcessTargets, Reading
from vllm_triage.sources.gil import GilSource

# A thread that holds the GIL `duty` of each 20 ms (spinning in Python) and sleeps the rest (no GIL), next
# to a main thread blocked in C (no GIL either), `idle` threads asleep (vLLM's engine core runs ~90) and
# `wakers` threads that take the GIL for a moment every millisecond (frequent hand-overs, as I/O threads
# make). With `churn` the spinning thread's stack changes all the time, 1-40 calls deep, as vLLM's engine
# core loop's does: a read of a running process' stack then often fails. Sleeps overshoot on a loaded
# machine, so the target writes the share of wall time it really spun; that, not the nominal duty, is the truth.
TARGET = textwrap.dedent(
    """
    import random, sys, threading, time
    duty, truth, idle, wakers, churn = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    started, spun = time.perf_counter(), 0.0
    def calls_deep(depth):
        return sum(range(20)) if depth == 0 else calls_deep(depth - 1) + 1
    def spin_a_share_of_each_period():
        global spun
        while True:
            start = time.perf_counter()
            while time.perf_counter() - start < 0.02 * duty:
                if churn:
                    calls_deep(random.randint(1, 40))
            spun += time.perf_counter() - start
            time.sleep(0.02 * (1 - duty))
            with open(truth, "w") as out:
                out.write(f"{spun} {time.perf_counter() - started}")
    def asleep():
        while True:
            time.sleep(10)
    def waking_every_millisecond():
        while True:
            time.sleep(0.001)
    for target, count in ((asleep, idle), (waking_every_millisecond, wakers)):
        for _ in range(count):
            threading.Thread(target=target, daemon=True).start()
    threading.Thread(target=spin_a_share_of_each_period, daemon=True).start()
    time.sleep(600)
    """
)


def read_ratio(reading: Reading, name: str) -> float:
    """The value of `name` (gil_held_ratio, gil_failed_sample_ratio) in a reading of one role."""
    return next(value for (found, _), value in reading.samples.items() if found == name)


def sample_known_duty(
    duty: float, folder: Path, idle: int = 0, wakers: int = 0, rate: int = 100, nonblocking: bool = True, churn: bool = False
) -> tuple[Reading, float, float]:
    """(the GIL source's reading of one 3 s window, its gil_held_ratio, the share of that window the target
    really held the GIL)."""
    truth = folder / "truth"
    truth.unlink(missing_ok=True)
    target = subprocess.Popen([sys.executable, "-c", TARGET, str(duty), str(truth), str(idle), str(wakers), "1" if churn else "0"])

    def spun_and_elapsed() -> tuple[float, float]:
        while True:
            fields = truth.read_text().split() if truth.exists() else []
            if len(fields) == 2:  # not caught mid-write
                return float(fields[0]), float(fields[1])
            time.sleep(0.01)

    try:
        time.sleep(0.5 + idle / 200)  # its threads are started
        spun_before, elapsed_before = spun_and_elapsed()
        source = GilSource(ProcessTargets([("engine_core", target.pid)]), window_seconds=3, rate=rate, nonblocking=nonblocking)
        reading = asyncio.run(source.collect())
        spun_after, elapsed_after = spun_and_elapsed()
    finally:
        target.kill()
        target.wait()
    assert reading.ok, reading.error
    held = read_ratio(reading, "gil_held_ratio")
    return reading, held, (spun_after - spun_before) / (elapsed_after - elapsed_before)
