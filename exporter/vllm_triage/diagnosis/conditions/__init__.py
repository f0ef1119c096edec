"""The condition table (shared/DIAGNOSIS.md as data), one module per layer: vllm.py (layer 1), host.py (1+3), gpu.py (3).

The engine, /diagnosis, the CLI report, the alert rules, dashboards and runbooks all derive from CONDITIONS.
Thresholds, windows and `for`/`clear_for` durations are defaults that the config file overrides per condition.
"""

from __future__ import annotations

from ..condition import Condition, ConditionSettings, Threshold, default_settings
from . import gpu, host, vllm

__all__ = ["CONDITIONS", "CONDITIONS_BY_ID", "PRECEDENCE", "SUPPRESSED_BY", "Condition", "ConditionSettings", "Threshold", "default_settings"]

CONDITIONS: tuple[Condition, ...] = vllm.CONDITIONS + host.CONDITIONS + gpu.CONDITIONS
CONDITIONS_BY_ID = {c.id: c for c in CONDITIONS}

# One story per server. The primary verdict is the first active one in this order: the one whose
# fix comes first (an unreachable or failing server before capacity, capacity before the host, the
# host before GPU efficiency, symptoms such as latency after their causes, informational last).
PRECEDENCE: tuple[str, ...] = (
    "vllm_unreachable",
    "engine_wedged",
    "request_errors",
    "kv_cache_saturated",
    "gpu_starved",
    "preemption_storm",
    "queue_backlog",
    "gpu_throttled",
    "pcie_link_degraded",
    "pcie_saturated",
    "gpu_busy_not_computing",
    "kv_fragmentation_suspected",
    "ttft_high",
    "itl_high",
    "memory_bandwidth_bound",
    "compute_bound",
    "client_underload",
    "spec_decode_ineffective",
    "prefix_cache_ineffective",
)
# condition -> (conditions whose holding explains its evidence, why): it does not hold then.
_FROZEN = ("engine_wedged", "the engine is hung: its gauges hold their last values and its GPU waits for nothing")
SUPPRESSED_BY: dict[str, tuple[tuple[str, str], ...]] = {
    "gpu_starved": (_FROZEN,),
    "queue_backlog": (_FROZEN,),
    "client_underload": (
        _FROZEN,
        ("gpu_starved", "pending work with idle SMs and a saturated host thread is starvation, not underload"),
        ("queue_backlog", "requests wait in the queue: the server, not the clients, is the limit"),
    ),
}
