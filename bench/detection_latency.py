"""How long the default settings take to raise and to clear each verdict, on real vLLM data: replays the bundled demo
capture (a real vLLM 0.26.0 on an H200 with all four sources, driven through idle / client underload / KV-cache
saturation / recovery; harness/gpu/real_vllm.py, scenario serving) and the real captures of the flagship regimes
(tests/data/real-vllm-h200-*, and two recorded on an H100: real-vllm-h100-*) on the virtual clock, and reports every
transition against the phase it happened in, and the CPU a tick took. Prints a table; enforces nothing.

    .venv/bin/python -m bench.detection_latency [--config FILE] [--capture FILE ...] [--cadence SECONDS]

Each capture is replayed as a sidecar at the config's cadences would have read it (harness/cadence.py: a source recorded
more often is thinned to its interval); --cadence sets every interval and the tick to SECONDS.

The phases come from each capture's header; they start with the recording (the load driver and the recorder start
together), so offsets are good to the scrape interval (2 s). A phase's offset is from the start of the phase the load
changed in, not from the moment the regime took hold inside vLLM (a KV cache fills some seconds after the clients come).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

from vllm_triage.config import Config
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_description, read_readings
from vllm_triage.model import Snapshot
from vllm_triage.pipeline import replay

from harness.cadence import as_read, every

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
# The flagship regimes, each recorded on the H200 beside a real vLLM 0.26.0 (the truth written before each run).
FLAGSHIP = (
    "h200-kv_thrash",
    "h200-contention",
    "h200-hung_kernel",
    "h200-killed",
    "h200-orphan",
    "h200-api_server_bound",
    "h200-token_budget",
    "h200-compute_limit",
    "h100-gpu_shared",
    "h100-eager_change",
)


Transitions = list[tuple[float, str, str, str]]


def transitions_of(path: str, config: Config) -> tuple[Transitions, list[tuple[str, float, float]], float, int, float]:
    """(transitions as (seconds in, condition, before, after), phases as (name, start, end), CPU seconds a tick, ticks,
    the capture's length)."""
    readings = as_read(list(read_readings(path)), config)
    start = readings[0].timestamp
    phases = []
    offset = 0.0
    # A capture recorded without phases in its header (the earliest ones keep them beside it) is one phase.
    for name, seconds, *_ in read_description(path).get("phases") or [("capture", readings[-1].timestamp - start)]:
        phases.append((name, offset, offset + seconds))
        offset += seconds
    states: dict[str, str] = {}
    transitions: list[tuple[float, str, str, str]] = []
    ticks = 0

    def on_tick(snapshot: Snapshot) -> None:
        nonlocal ticks
        ticks += 1
        for verdict in snapshot.verdicts:
            before = states.get(verdict.condition, "inactive")
            if verdict.state != before and "active" in (verdict.state, before):
                transitions.append((snapshot.timestamp - start, verdict.condition, before, verdict.state))
            states[verdict.condition] = verdict.state

    cpu_before = time.process_time()
    replay(readings, config, on_tick)
    return transitions, phases, (time.process_time() - cpu_before) / ticks, ticks, readings[-1].timestamp - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="A sidecar config file (default: the defaults).")
    default = [str(demo_capture_path()), *(str(DATA / f"real-vllm-{name}.jsonl.gz") for name in FLAGSHIP)]
    parser.add_argument("--capture", nargs="+", default=default, help="Captures to replay (default: the demo and the flagship regimes).")
    parser.add_argument("--cadence", type=float, help="Read every source and judge every this many seconds (default: the config's).")
    args = parser.parse_args()
    config = load(args.config, env={}, flags=every(args.cadence) if args.cadence else {})
    for path in args.capture:
        transitions, phases, cpu_per_tick, ticks, length = transitions_of(path, config)
        print(f"capture {Path(path).name}: {length:.0f} s; window {config.window_seconds:g} s, tick {config.tick_seconds:g} s")
        print(f"replayed {ticks} ticks: {cpu_per_tick * 1000:.2f} ms of CPU a tick (ingesting its readings, evaluating, the verdicts' bookkeeping above)")
        print("phases: " + ", ".join(f"{name} {lo:.0f}-{hi:.0f} s" for name, lo, hi in phases))
        print(f"{'at':>7}  {'condition':<28} {'change':<20} phase (seconds into it)")
        for at, condition, before, after in transitions:
            name, lo = next(((n, lo) for n, lo, hi in phases if lo <= at < hi), (phases[-1][0], phases[-1][1]))
            print(f"{at:6.0f}s  {condition:<28} {before + ' -> ' + after:<20} {name} (+{at - lo:.0f} s)")
        by_condition = itertools.groupby(sorted(transitions, key=lambda t: t[1]), key=lambda t: t[1])
        print("conditions that changed: " + (", ".join(name for name, _ in by_condition) or "none"))
        print()


if __name__ == "__main__":
    main()
