"""The GPU verdicts on real readings: captures recorded on an NVIDIA H200 under workloads whose
bottleneck is known (harness/gpu/workloads.py), replayed here where no GPU exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from vllm_triage.config_loader import load
from vllm_triage.history.capture import read_readings
from vllm_triage.pipeline import evaluate, replay
from vllm_triage.scope import gpu_scope

from harness.gpu.truth import STARVED_EXPECTED, STARVED_REPLAY_CONFIG, check, check_causes, read_phases, replay_config

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURES = sorted(DATA.glob("gpu-h200-*.jsonl.gz"))


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_each_phase_gets_its_verdict_and_only_its_verdict(capture: Path, tmp_path):
    phases = read_phases(capture.with_name(capture.name.replace(".jsonl.gz", ".json")))
    assert phases, "the capture has no phase marks"
    problems = check(capture, phases, replay_config(tmp_path))
    assert not problems, "\n".join(problems[:20])


def snapshot_at_end_of(phase: str, tmp_path):
    """The last evaluation inside a phase of the H200 capture, replayed."""
    capture = DATA / "gpu-h200-phases.jsonl.gz"
    ends = {name: end for name, _, end in read_phases(DATA / "gpu-h200-phases.json")}
    snapshots = []
    replay([r for r in read_readings(capture) if r.timestamp <= ends[phase]], replay_config(tmp_path), snapshots.append)
    return snapshots[-1]


def test_util_gpu_100_percent_while_sms_idle_is_busy_not_computing(tmp_path):
    """The trap the seeds warn about, on the H200's own numbers: pinned copies read util.gpu ~1.0."""
    last = snapshot_at_end_of("copy_h2d", tmp_path)
    verdict = next(v for v in last.verdicts if v.condition == "gpu_busy_not_computing")
    assert verdict.state == "active"
    values = {e.signal: e.value for e in verdict.evidence}
    assert values["gpu_utilization_ratio_mean"] >= 0.95 and values["gpu_sm_active_ratio_mean"] <= 0.05
    assert last.signals[gpu_scope("0")]["gpu_sm_activity_from_gpm"] == 1.0


def test_sw_power_cap_under_a_matmul_is_not_throttling(tmp_path):
    last = snapshot_at_end_of("compute", tmp_path)
    assert last.signals[gpu_scope("0")]["gpu_clock_event_sw_power_cap_ratio"] > 0.9  # set nearly all the time ...
    assert next(v for v in last.verdicts if v.condition == "gpu_throttled").state == "inactive"  # ... and not a throttle


def test_without_a_gpu_the_gpu_conditions_are_unknown_and_the_rest_works():
    """This machine has no NVIDIA driver: the real NVML reports that, the source says so once."""
    from vllm_triage.sources.gpu import GpuSource

    reading = GpuSource().collect()
    assert not reading.ok
    assert reading.error_reason in ("no_driver", "no_library", "no_gpu")
    assert "NVML" in (reading.error or "") or "nvidia-ml-py" in (reading.error or "")
    from vllm_triage.diagnosis.engine import Engine
    from vllm_triage.store import Store

    from .pages import Counters, page
    from .pages import reading as vllm_reading

    store = Store(120)
    store.add(reading)
    store.add(vllm_reading(reading.timestamp - 2, page(2, 0, 0.2, Counters())))
    store.add(vllm_reading(reading.timestamp, page(2, 0, 0.2, Counters())))
    snapshot = evaluate(Engine(load(env={}).conditions, 60), store, reading.timestamp)
    states = {v.condition: v for v in snapshot.verdicts}
    assert states["compute_bound"].state == "unknown"
    assert any("source gpu is down" in m for m in states["compute_bound"].missing)
    assert states["kv_cache_saturated"].state == "inactive"
    underload = states["client_underload"]
    assert any("GPU evidence unavailable" in e.text for e in underload.evidence)


def test_gpu_starved_on_the_h200_names_the_engine_core_and_stays_silent_when_the_gpu_computes(tmp_path):
    """Recorded on the H200 (tests/gpu/test_gpu_live.py): a serving loop titled VLLM::EngineCore with 16
    requests in flight, first Python-bound between tiny kernels, then driving bf16 matmuls; its main
    thread is a saturated core in both phases."""
    capture, marks = DATA / "gpu-starved-h200.jsonl.gz", DATA / "gpu-starved-h200.json"
    config = replay_config(tmp_path, STARVED_REPLAY_CONFIG)
    phases = read_phases(marks)
    assert [name for name, _, _ in phases] == ["idle", "starved", "compute", "idle"]
    problems = check(capture, phases, config, STARVED_EXPECTED)
    assert not problems, "\n".join(problems[:20])
    end_of_starved = next(end for name, _, end in phases if name == "starved")
    snapshots = []
    replay([r for r in read_readings(capture) if r.timestamp <= end_of_starved], config, snapshots.append)
    verdict = next(v for v in snapshots[-1].verdicts if v.condition == "gpu_starved")
    texts = [e.text for e in verdict.evidence]
    named = [re.search(r'^engine_core 0 \(pid \d+\): busiest thread "python" \(main thread\) at ([\d.]+) of a core', t) for t in texts]
    assert any(m and float(m.group(1)) >= 0.85 for m in named), texts
    assert any("hot while holding the GIL: run_phase" in t and "(workloads.py)" in t for t in texts), texts


def test_each_starvation_and_compute_cause_is_named_on_the_h200(tmp_path):
    """Recorded on the H200 (tests/gpu/test_gpu_live.py -k compute_cause): the serving loop titled like the
    engine core starved by Python (GIL held), by launch overhead (GIL free), by pageable copies; fp32
    matmuls without TF32 on the CUDA cores, fp64 on the tensor cores; elementwise fp32 on DRAM; bursts."""
    capture = DATA / "gpu-causes-h200.jsonl.gz"
    problems = check_causes(capture, read_phases(DATA / "gpu-causes-h200.json"), replay_config(tmp_path, STARVED_REPLAY_CONFIG))
    assert not problems, "\n".join(problems[:20])
