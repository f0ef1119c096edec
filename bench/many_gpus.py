"""What each GPU the sidecar watches adds to a tick: replays the bundled demo capture (a real vLLM 0.26.0
on one H200, all four sources) with its GPU readings copied onto N GPUs (other indexes and UUIDs, the
same values), and reports the CPU a tick takes (ingest and evaluation) and the size and render time of
/metrics. With one GPU lent, this is how a second GPU is measured; reading it through NVML costs what
`bench/gpu_collect.py` measures per GPU. Prints a table; enforces nothing.

    .venv/bin/python -m bench.many_gpus [--gpus 1 2 4 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

from vllm_triage.config_loader import load
from vllm_triage.exposition import Exposition
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.model import GPU_SOURCE, Reading, Snapshot, make_labels
from vllm_triage.pipeline import replay


def on_gpus(reading: Reading, gpus: int) -> Reading:
    """The reading with every GPU series copied to GPUs 1..gpus-1."""
    if reading.source != GPU_SOURCE or not reading.ok:
        return reading
    samples = dict(reading.samples)
    for index in range(1, gpus):
        for (name, labels), value in reading.samples.items():
            copied = {k: (str(index) if k == "gpu" else f"{v}-{index}" if k == "uuid" else v) for k, v in labels}
            samples[(name, make_labels(copied))] = value
    listed = reading.meta.get("gpus", [])
    copies = [{**listed[0], "gpu": index, "uuid": f"{listed[0]['uuid']}-{index}"} for index in range(1, gpus)] if listed else []
    return dataclasses.replace(reading, samples=samples, meta={**reading.meta, "gpus": [*listed, *copies]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    config = load(None, env={})
    captured = list(read_readings(demo_capture_path()))
    print(f"machine: {platform.machine()}; python {platform.python_version()}; the demo capture, window {config.window_seconds:g} s")
    replay(captured, config, lambda _: None)  # warm-up: caches and the first parse of every label set
    for gpus in args.gpus:
        readings = [on_gpus(r, gpus) for r in captured]
        ticks, last = 0, None

        def keep(snapshot: Snapshot) -> None:
            nonlocal ticks, last
            ticks, last = ticks + 1, snapshot

        started = time.process_time()
        replay(readings, config, keep)
        per_tick = (time.process_time() - started) / ticks
        assert last is not None
        exposition = Exposition(config.conditions, config.tick_seconds)
        exposition.update(last)
        rendered = time.process_time()
        body = exposition.render(False)
        render_ms = (time.process_time() - rendered) * 1000
        print(f"{gpus} GPU(s): {per_tick * 1000:.2f} ms of CPU a tick over {ticks} ticks; /metrics {len(body) / 1000:.0f} kB, rendered in {render_ms:.1f} ms")


if __name__ == "__main__":
    main()
