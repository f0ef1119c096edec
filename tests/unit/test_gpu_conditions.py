"""Both sides of the GPU conditions that the H200 could not be driven into on demand (a degraded
PCIe link, hardware clock brakes), on GPU readings written in the source's own format."""

from __future__ import annotations

import dataclasses

from vllm_triage.config_loader import load
from vllm_triage.diagnosis.engine import Engine
from vllm_triage.model import CLOCK_EVENT_REASONS, GPU_SOURCE, Reading, make_labels
from vllm_triage.pipeline import evaluate
from vllm_triage.store import Store


def gpu_reading(t: float, util: float, gen: int = 5, width: int = 16, reasons: tuple[str, ...] = (), sm: float | None = None) -> Reading:
    labels = {"gpu": "0", "uuid": "GPU-test"}
    values = {
        "gpu_utilization_ratio": util,
        "gpu_pcie_link_generation": gen,
        "gpu_pcie_link_generation_max": 5,
        "gpu_pcie_link_width": width,
        "gpu_pcie_link_width_max": 16,
    }
    if sm is not None:
        values["gpu_sm_active_ratio"] = sm
    samples = {(name, make_labels(labels)): float(v) for name, v in values.items()}
    for reason in CLOCK_EVENT_REASONS:
        samples[("gpu_clock_event_active", make_labels({**labels, "reason": reason}))] = 1.0 if reason in reasons else 0.0
    return Reading(GPU_SOURCE, t, True, samples)


def run(readings_per_second, seconds: int = 40):
    config = load(env={})
    settings = {cid: dataclasses.replace(s, window_seconds=20, for_seconds=0, clear_seconds=0) for cid, s in config.conditions.items()}
    engine = Engine(settings, 20)
    store = Store(120)
    snapshot = None
    for t in range(seconds):
        store.add(readings_per_second(t))
        snapshot = evaluate(engine, store, float(t))
    assert snapshot is not None
    return {v.condition: v for v in snapshot.verdicts}


def test_link_below_max_while_busy_is_degraded():
    verdicts = run(lambda t: gpu_reading(t, util=0.95, gen=4, width=16))
    assert verdicts["pcie_link_degraded"].state == "active"
    assert verdicts["pcie_link_degraded"].scopes == ("gpu:0",)


def test_link_downtrained_at_idle_is_normal():
    verdicts = run(lambda t: gpu_reading(t, util=0.0, gen=1, width=16))
    v = verdicts["pcie_link_degraded"]
    assert v.state == "inactive" and any("downtrain at idle" in e.text for e in v.evidence)


def test_narrow_link_while_busy_is_degraded_too():
    assert run(lambda t: gpu_reading(t, util=0.9, gen=5, width=8))["pcie_link_degraded"].state == "active"


def test_hardware_slowdown_most_of_the_window_is_throttling():
    verdicts = run(lambda t: gpu_reading(t, util=0.9, reasons=("hw_slowdown",) if t % 4 else ()))
    assert verdicts["gpu_throttled"].state == "active"


def test_sw_power_cap_alone_is_not_throttling():
    verdicts = run(lambda t: gpu_reading(t, util=1.0, reasons=("sw_power_cap",)))
    v = verdicts["gpu_throttled"]
    assert v.state == "inactive" and any("SW power cap" in e.text for e in v.evidence)


def test_a_brief_thermal_event_is_not_throttling():
    verdicts = run(lambda t: gpu_reading(t, util=0.9, reasons=("hw_thermal_slowdown",) if t % 10 == 0 else ()))
    assert verdicts["gpu_throttled"].state == "inactive"


def test_without_gpm_busy_not_computing_is_unknown_not_false():
    verdicts = run(lambda t: gpu_reading(t, util=1.0))  # no gpu_sm_active_ratio: an older GPU
    v = verdicts["gpu_busy_not_computing"]
    assert v.state == "unknown" and "gpu_sm_active_ratio_mean" in v.missing
