"""CPU cost of one GPU collection, per GPU, with and without GPM (run on a machine with a GPU).

    python -m bench.gpu_collect [--collections 200]

Measured as this thread's CPU time around GpuSource.collect(), which is what the sidecar pays per
tick; wall time is shown too (NVML calls block in the driver). Nothing is enforced.
"""

from __future__ import annotations

import argparse
import statistics
import time

from vllm_triage.sources.gpu import GpuSource


def measure(use_gpm: bool, collections: int, interval: float) -> tuple[list[float], list[float], int, bool]:
    source = GpuSource(use_gpm=use_gpm)
    first = source.collect()  # initialisation is paid once, not per tick
    if not first.ok:
        raise SystemExit(f"no GPU: {first.error}")
    gpus = len(first.meta["gpus"])
    gpm = any(g["gpm"] for g in first.meta["gpus"])
    cpu, wall = [], []
    for _ in range(collections):
        time.sleep(interval)
        c0, w0 = time.thread_time(), time.perf_counter()
        reading = source.collect()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
        assert reading.ok, reading.error
    source.close()
    return cpu, wall, gpus, gpm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--collections", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.12, help="seconds between collections (GPM needs >= 0.1)")
    args = parser.parse_args()
    for use_gpm in (True, False):
        cpu, wall, gpus, gpm = measure(use_gpm, args.collections, args.interval)
        label = "with GPM" if gpm else "without GPM"
        print(
            f"{label:12} {gpus} GPU(s), {len(cpu)} collections: CPU per collection per GPU "
            f"median {statistics.median(cpu) / gpus * 1000:.3f} ms, p95 {sorted(cpu)[int(0.95 * len(cpu))] / gpus * 1000:.3f} ms; "
            f"wall median {statistics.median(wall) / gpus * 1000:.3f} ms"
        )


if __name__ == "__main__":
    main()
