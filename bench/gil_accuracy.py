"""How well the GIL source reads a process whose GIL share is known, in both py-spy modes, as the target
grows threads as vLLM's engine core does (~90, some of them taking the GIL often) and as its stack
changes all the time (churn: what makes nonblocking reads fail). Prints one line per case; enforces
nothing (tests/unit/test_gil.py checks the cases).

    .venv/bin/python -m bench.gil_accuracy [--repeats 3] [--duty 0.6]

On the H200 machine run it with py-spy on PATH (harness/gpu/device_vllm.sh installs it to /tmp/pyspy/bin).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from harness.gil_target import read_ratio, sample_known_duty

# (threads asleep, threads taking the GIL every millisecond, a churning stack)
CASES = ((0, 0, False), (90, 0, False), (90, 8, False), (90, 0, True), (90, 8, True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duty", type=float, default=0.6)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; one 3 s window at 20 Hz per reading; read (truth, share of samples py-spy failed to read)")
    with tempfile.TemporaryDirectory() as folder:
        for idle, wakers, churn in CASES:
            for nonblocking in (False, True):
                readings = [
                    sample_known_duty(args.duty, Path(folder), idle, wakers, rate=20, nonblocking=nonblocking, churn=churn) for _ in range(args.repeats)
                ]
                shown = "  ".join(f"{held:.2f} ({truth:.2f}, failed {read_ratio(reading, 'gil_failed_sample_ratio'):.2f})" for reading, held, truth in readings)
                mode = "nonblocking" if nonblocking else "blocking"
                stack = "churning stack" if churn else "steady stack"
                print(f"{idle:3d} threads asleep, {wakers} waking every ms, {stack}, {mode:11s}: {shown}", flush=True)


if __name__ == "__main__":
    main()
