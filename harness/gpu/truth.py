"""What each GPU workload phase must produce, checked the same way live on a GPU (test_gpu_live)
and in CI on the captures recorded there (tests/unit/test_gpu_captures.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from vllm_triage.config import Config
from vllm_triage.config_loader import load
from vllm_triage.diagnosis.conditions import CONDITIONS, gpu
from vllm_triage.history.capture import read_readings
from vllm_triage.model import PROCESS_SOURCE, Reading
from vllm_triage.pipeline import replay
from vllm_triage.sources.process import THREAD_SAMPLE_SECONDS

GPU_IDS = {c.id for c in gpu.CONDITIONS}

# Short windows so that 30-40 s phases have a steady part; thresholds keep their defaults.
REPLAY_CONFIG = """
window_seconds: 8
tick_seconds: 1
conditions:
""" + "".join(f"  {cid}: {{for_seconds: 2, clear_for_seconds: 2}}\n" for cid in sorted(GPU_IDS))

# phase -> (conditions that must be active, conditions that must not be)
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "idle": (set(), GPU_IDS),
    "compute": ({"compute_bound"}, GPU_IDS - {"compute_bound"}),
    "copy_d2d": ({"memory_bandwidth_bound"}, GPU_IDS - {"memory_bandwidth_bound"}),
    "copy_h2d": ({"gpu_busy_not_computing"}, {"compute_bound", "memory_bandwidth_bound", "gpu_throttled", "pcie_link_degraded"}),
    "copy_h2d_only": ({"gpu_busy_not_computing", "pcie_saturated"}, {"compute_bound", "memory_bandwidth_bound", "gpu_throttled", "pcie_link_degraded"}),
    "starved": (set(), GPU_IDS),
    "mixed": (set(), {"gpu_busy_not_computing", "memory_bandwidth_bound", "pcie_saturated", "gpu_throttled", "pcie_link_degraded"}),
}


def replay_config(tmp_path: Path, text: str = REPLAY_CONFIG) -> Config:
    path = tmp_path / "gpu-replay.yaml"
    path.write_text(text)
    return load(str(path), env={})


def write_phases(workload_output: str, path: Path) -> None:
    """Keep the workload's `phase NAME at T` lines as the JSON that read_phases reads (tests/data/*.json)."""
    marks = [(line.split()[1], float(line.split()[-1])) for line in workload_output.splitlines() if line.startswith("phase ")]
    path.write_text(json.dumps(marks))


# Marks the real-vLLM driver keeps for what it did inside a phase (harness/gpu/real_vllm.py): not phases.
ACTION_MARKS = frozenset(
    {"engine_stopped", "engine_continued", "contention_started", "contention_ended", "kernel_hung", "api_server_killed", "vllm_killed"}
    | {"foreign_started", "foreign_computing", "foreign_ended"}
)


def read_phases(path: Path) -> list[tuple[str, float, float]]:
    """(name, start, end) of each phase, from the marks write_phases kept (an action inside a phase does not end it)."""
    marks = [(name, at) for name, at in json.loads(path.read_text()) if name not in ACTION_MARKS]
    return [(name, start, end) for (name, start), (_, end) in itertools.pairwise(marks)]


# The host layer's proof (harness/gpu/serving.py): the engine core's main thread saturated in both
# busy phases; only where the GPU then waits on it is it starved.
STARVED_EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "idle": (set(), {"gpu_starved"}),
    "starved": ({"gpu_starved"}, {"compute_bound"}),
    "compute": ({"compute_bound"}, {"gpu_starved"}),
}
STARVED_REPLAY_CONFIG = REPLAY_CONFIG + "  gpu_starved: {for_seconds: 2, clear_for_seconds: 2}\n"

# The causes (harness/gpu/serving.py running more workloads): phase -> {condition: cause it must report}
# while active, and the conditions that must be active.
CAUSES_EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "idle": (set(), {"gpu_starved", "compute_bound", "memory_bandwidth_bound"}),
    "starved": ({"gpu_starved"}, {"compute_bound", "memory_bandwidth_bound"}),
    "launch": ({"gpu_starved"}, {"compute_bound", "memory_bandwidth_bound"}),
    "pageable": ({"gpu_starved"}, {"compute_bound", "memory_bandwidth_bound"}),
    "matmul_fp32": ({"compute_bound"}, {"gpu_starved", "memory_bandwidth_bound"}),
    "matmul_fp64": ({"compute_bound"}, {"gpu_starved", "memory_bandwidth_bound"}),
    "elementwise": ({"memory_bandwidth_bound"}, {"gpu_starved", "compute_bound"}),
    "bursty": (set(), {"compute_bound", "memory_bandwidth_bound", "gpu_busy_not_computing"}),
}
CAUSES: dict[str, tuple[str, str]] = {
    "starved": ("gpu_starved", "engine_python"),
    "launch": ("gpu_starved", "launch_overhead"),
    "pageable": ("gpu_starved", "pageable_copies"),
    "matmul_fp32": ("compute_bound", "cuda_cores"),
    "matmul_fp64": ("compute_bound", "tensor_cores"),
}


def rise_seconds(readings: list[Reading]) -> float:
    """How much later than the other verdicts one may rise: where the capture holds the process source,
    one step of the busiest thread's share (a step between two reads of every thread's CPU,
    THREAD_SAMPLE_SECONDS apart: the step that spans a phase's start is part idle, and stays in the window
    that long after it)."""
    return THREAD_SAMPLE_SECONDS if any(r.source == PROCESS_SOURCE for r in readings) else 0.0


def check(capture: Path, phases: list[tuple[str, float, float]], config: Config, expected: dict[str, tuple[set[str], set[str]]] = EXPECTED) -> list[str]:
    """Replay the capture; in the steady part of each phase (after one window and `for`), every excluded
    condition must be inactive, and every expected one active (from rise_seconds later). Returns the violations."""
    if not phases:
        return ["no phase marks: the workload did not run"]
    readings = list(read_readings(capture))
    settle = config.window_seconds + 4
    rise = settle + rise_seconds(readings)
    problems: list[str] = []
    seen: dict[str, int] = {}

    def on_tick(snapshot):  # type: ignore[no-untyped-def]
        phase = next(((n, s, e) for n, s, e in phases if s + settle <= snapshot.timestamp <= e - 1), None)
        if phase is None:
            return
        name = phase[0]
        want, never = expected[name]
        states = {v.condition: v.state for v in snapshot.verdicts}
        seen[name] = seen.get(name, 0) + 1
        for condition in want if snapshot.timestamp >= phase[1] + rise else ():
            if states.get(condition) != "active":
                problems.append(f"{name} at +{snapshot.timestamp - phase[1]:.0f}s: {condition} is {states.get(condition)}, expected active")
        for condition in never:
            if states.get(condition) == "active":
                problems.append(f"{name} at +{snapshot.timestamp - phase[1]:.0f}s: {condition} is active, expected not")

    replay(readings, config, on_tick)
    for name, _, _ in phases:
        if name in expected and not seen.get(name):
            problems.append(f"{name}: no steady evaluation inside the phase (too short for the window?)")
    return problems


def check_causes(capture: Path, phases: list[tuple[str, float, float]], config: Config) -> list[str]:
    """check() with CAUSES_EXPECTED, and each phase's cause reported by its condition at every steady tick."""
    problems = check(capture, phases, config, CAUSES_EXPECTED)
    settle = config.window_seconds + 4

    def on_tick(snapshot):  # type: ignore[no-untyped-def]
        phase = next((n for n, s, e in phases if s + settle <= snapshot.timestamp <= e - 1), None)
        if phase in CAUSES:
            condition, cause = CAUSES[phase]
            verdict = next(v for v in snapshot.verdicts if v.condition == condition)
            if verdict.active and verdict.cause != cause:
                problems.append(f"{phase}: {condition} reports cause {verdict.cause}, expected {cause}")

    replay(list(read_readings(capture)), config, on_tick)
    return problems


# The real vLLM on the H200 (harness/gpu/real_vllm.py's scenarios, their captures in tests/data/real-vllm-h200-*):
ALL = {c.id for c in CONDITIONS}
# phase -> (active at every steady tick, never active), measured against the truth in harness/gpu/real_vllm.py
CONTENTION = {"contended": ({"gpu_starved"}, set())}  # what `make scenarios` reports on (the tests below judge it)
HUNG_KERNEL = {"hung": ({"engine_wedged"}, set())}
KV_THRASH = {"thrash": ({"kv_cache_saturated", "queue_backlog", "preemption_storm"}, set())}
SERVING = {
    "idle": (set(), ALL),
    # 2 of 32 running, SMs at ~0.04, the engine core's main thread at ~0.98 of a core: starvation leads,
    # underload is suppressed by it (one story), nothing fragments, random prompts are no cache fault
    "underload": ({"gpu_starved"}, {"client_underload", "kv_fragmentation_suspected", "prefix_cache_ineffective", "kv_cache_saturated"}),
    "kv_saturation": (
        {"kv_cache_saturated", "preemption_storm", "ttft_high"},
        {"kv_fragmentation_suspected", "prefix_cache_ineffective", "client_underload", "compute_bound", "memory_bandwidth_bound"},
    ),
    "recovery": (set(), ALL),
}
CPU_BOUND = {"cpu_bound": ({"gpu_starved"}, {"compute_bound", "memory_bandwidth_bound", "kv_fragmentation_suspected", "prefix_cache_ineffective"})}
GPU_HEAVY = {
    "prefill_heavy": ({"compute_bound"}, {"gpu_starved", "memory_bandwidth_bound", "gpu_busy_not_computing", "prefix_cache_ineffective"}),
    # eager decode of a 1B model at ~94 sequences: kernel launches, not DRAM, are the limit (SM ~0.1, DRAM ~0.06)
    "decode_heavy": ({"gpu_starved"}, {"compute_bound", "memory_bandwidth_bound", "prefix_cache_ineffective"}),
}
