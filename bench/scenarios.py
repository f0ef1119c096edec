"""The labelled scenario suite (make scenarios): every scenario of harness/scenarios.py on the
real vLLM (CPU build) at normal priority and the default settings, then the real H200 captures replayed at
the default and short settings. Prints one row per phase and condition: detected (seconds after the phase
started), cleared (seconds after it ended), and every false active with its duration. Nothing is enforced.

    .venv/bin/python -m bench.scenarios [--only NAME ...] [--settings default|short] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import psutil
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.pipeline import replay

from harness.gpu.truth import CONTENTION, CPU_BOUND, GPU_HEAVY, HUNG_KERNEL, KV_THRASH, SERVING, read_phases
from harness.scenarios import SCENARIOS, run

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
CAPTURES = {"serving": (demo_capture_path(), SERVING), "cpu_bound": (DATA / "real-vllm-h200-cpu_bound.jsonl.gz", CPU_BOUND)}
CAPTURES["gpu_heavy"] = (DATA / "real-vllm-h200-gpu_heavy.jsonl.gz", GPU_HEAVY)
CAPTURES["contention"] = (DATA / "real-vllm-h200-contention.jsonl.gz", CONTENTION)
CAPTURES["contention-2"] = (DATA / "real-vllm-h200-contention-2.jsonl.gz", CONTENTION)
CAPTURES["kv_thrash"] = (DATA / "real-vllm-h200-kv_thrash.jsonl.gz", KV_THRASH)
CAPTURES["hung_kernel"] = (DATA / "real-vllm-h200-hung_kernel.jsonl.gz", HUNG_KERNEL)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def live(names: list[str], settings: str, scale: float) -> None:
    print("| scenario | server | phase | condition | detected (s into the phase) | cleared (s after it) | false active (s) |")
    print("|---|---|---|---|---|---|---|")
    for scenario in SCENARIOS:
        if names and scenario.name not in names:
            continue
        result = run(scenario, settings, scale)
        rows = result.scores or []
        for s in rows:
            print(
                f"| {s.scenario} | {s.server} | {s.phase} | {s.condition} | {seconds(s.detected_seconds)} | "
                f"{seconds(s.cleared_seconds)} | {s.false_active_seconds:.0f} |",
                flush=True,
            )
        for note in result.notes:
            print(f"| {scenario.name} | | | {note} | | | |", flush=True)


def replayed(settings: str) -> None:
    """The H200 captures: per phase, when each expected verdict first held and which others did."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "short.yaml"
        conditions = list(load(env={}).conditions)
        durations = "".join(f"  {c}: {{for_seconds: 2, clear_for_seconds: 2}}\n" for c in conditions)
        path.write_text("window_seconds: 20\ntick_seconds: 2\nconditions:\n" + durations)
        config = load(str(path), env={}) if settings == "short" else load(env={})
    print(f"\nH200 captures replayed at the {settings} settings")
    print("| capture | phase | expected | first active (s into the phase) | others active at any tick |")
    print("|---|---|---|---|---|")
    for name, (capture, expected) in CAPTURES.items():
        phases = read_phases(DATA / f"real-vllm-h200-{name}.json")
        snapshots: list = []
        replay(list(read_readings(capture)), config, snapshots.append)
        for phase, start, end in phases:
            if phase not in expected:
                continue
            during = [s for s in snapshots if start <= s.timestamp <= end]
            want, _ = expected[phase]
            firsts = []
            for condition in sorted(want):
                first = next((s.timestamp - start for s in during if any(v.condition == condition and v.active for v in s.verdicts)), None)
                firsts.append(f"{condition} {seconds(first)}")
            others = sorted({v.condition for s in during for v in s.verdicts if v.active} - want)
            print(f"| {name} | {phase} | {', '.join(sorted(want)) or 'nothing'} | {', '.join(firsts) or '-'} | {', '.join(others) or 'none'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], help="scenario names (default: all)")
    parser.add_argument("--settings", choices=("default", "short"), default="default")
    parser.add_argument("--scale", type=float, default=1.0, help="phase length factor (short settings need less)")
    parser.add_argument("--replay-only", action="store_true")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores; settings {args.settings}, phases x{args.scale}")
    if not args.replay_only:
        live(args.only, args.settings, args.scale)
    for settings in ("default", "short"):
        replayed(settings)


if __name__ == "__main__":
    main()
