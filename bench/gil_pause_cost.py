"""What a py-spy window costs the process it samples, on a target whose speed is steady enough to
resolve it (vLLM on 2 CPU cores swings +-30 % run to run; bench/gil_overhead.py shows that).

    python -m bench.gil_pause_cost [--pairs 6] [--seconds 10] [--rate 20] [--nonblocking]

The target is the worst case for blocking sampling: an engine-core-like loop, Python-bound between
tiny torch kernels (on the GPU when there is one), with torch's thread pools up. Segments alternate
py-spy off / on (`record --gil` as the GIL source runs it) and compare the loop's iterations per
second. The sidecar's default opens a window on each process for gil_window_seconds every
gil_interval_seconds, so its cost is this in-window cost times their ratio. Prints a table; enforces nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from vllm_triage.config import OPTIONS_BY_KEY
from vllm_triage.sources.gil import find_py_spy

TARGET = textwrap.dedent(
    """
    import sys, time, torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(64, device=device)
    out, n = sys.argv[1], 0
    while True:
        x = x * 1.0001 + 0.0001
        sum(i * i for i in range(20000))
        n += 1
        if n % 20 == 0:
            with open(out, "w") as f:
                f.write(f"{n} {time.perf_counter()} {device}")
    """
)


def read(progress: Path) -> tuple[int, float, str]:
    while True:
        fields = progress.read_text().split() if progress.exists() else []
        if len(fields) == 3:
            return int(fields[0]), float(fields[1]), fields[2]
        time.sleep(0.01)


def segment(progress: Path, seconds: float, py_spy: list[str] | None) -> float:
    n0, t0, _ = read(progress)
    if py_spy:
        subprocess.run([*py_spy, "--duration", f"{seconds:g}"], capture_output=True, check=True)
    else:
        time.sleep(seconds)
    n1, t1, _ = read(progress)
    return (n1 - n0) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--nonblocking", action="store_true")
    args = parser.parse_args()
    binary = find_py_spy()
    if binary is None:
        sys.exit("py-spy is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress"
        target = subprocess.Popen([sys.executable, "-c", TARGET, str(progress)])
        try:
            _, _, device = read(progress)
            time.sleep(3)  # warm-up
            py_spy = [binary, "record", "--pid", str(target.pid), "--rate", str(args.rate), "--gil", "--format", "raw", "--output", str(Path(tmp) / "raw")]
            if args.nonblocking:
                py_spy.append("--nonblocking")
            ratios = []
            for pair in range(args.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                rates = {on: segment(progress, args.seconds, py_spy if on else None) for on in order}
                ratios.append(rates[True] / rates[False])
                print(f"pair {pair + 1}: off {rates[False]:.1f} it/s, on {rates[True]:.1f} it/s, on/off {ratios[-1]:.4f}", flush=True)
        finally:
            target.kill()
    median = statistics.median(ratios)
    mode = "nonblocking" if args.nonblocking else "blocking"
    window, interval = (float(OPTIONS_BY_KEY[key].default) for key in ("gil_window_seconds", "gil_interval_seconds"))
    print(
        f"{device} target, py-spy {mode} {args.rate} Hz: in-window on/off median {median:.4f} (range {min(ratios):.4f}-{max(ratios):.4f}), "
        f"cost {(1 - median) * 100:.2f} % while a window is open; "
        f"at the default duty ({window:g} s every {interval:g} s) {(1 - median) * 100 * window / interval:.2f} %"
    )


if __name__ == "__main__":
    main()
