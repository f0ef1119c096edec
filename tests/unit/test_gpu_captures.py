"""The GPU verdicts on real readings: captures recorded on an NVIDIA H200 under workloads whose
bottleneck is known (tests/gpu/workloads.py), replayed here where no GPU exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_triage.capture import read_readings
from vllm_triage.config import load
from vllm_triage.daemon import replay

from tests.gpu.truth import check, read_phases, replay_config

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
    assert last.signals["gpu:0"]["gpu_sm_activity_from_gpm"] == 1.0


def test_sw_power_cap_under_a_matmul_is_not_throttling(tmp_path):
    last = snapshot_at_end_of("compute", tmp_path)
    assert last.signals["gpu:0"]["gpu_clock_event_sw_power_cap_ratio"] > 0.9  # set nearly all the time ...
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
    snapshot = Engine(load(env={}).conditions, 60).evaluate(store, reading.timestamp)
    states = {v.condition: v for v in snapshot.verdicts}
    assert states["compute_bound"].state == "unknown"
    assert any("source gpu is down" in m for m in states["compute_bound"].missing)
    assert states["kv_cache_saturated"].state == "inactive"
    underload = states["client_underload"]
    assert any("GPU evidence unavailable" in e.text for e in underload.evidence)
