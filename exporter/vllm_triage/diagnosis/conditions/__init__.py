"""The condition table (docs/guide.md describes each), one module per layer: vllm.py (layer 1), host.py (1+3), gpu.py (3).

The engine, /diagnosis, the CLI report, the alert rules, dashboards and runbooks all derive from CONDITIONS.
Thresholds, windows and `for`/`clear_for` durations are defaults that the config file overrides per condition.
A condition is its entry in its layer's module (beside its predicate, listed in that module's CONDITIONS); its
precedence and what suppresses it are fields of the entry.
"""

from __future__ import annotations

from ..condition import Condition, ConditionSettings, Threshold, default_settings
from . import gpu, host, vllm

__all__ = ["CONDITIONS", "CONDITIONS_BY_ID", "PRECEDENCE", "Condition", "ConditionSettings", "Threshold", "default_settings"]

CONDITIONS: tuple[Condition, ...] = vllm.CONDITIONS + host.CONDITIONS + gpu.CONDITIONS
CONDITIONS_BY_ID = {c.id: c for c in CONDITIONS}
# One story per server: the primary verdict is the first active one in this order.
PRECEDENCE: tuple[str, ...] = tuple(c.id for c in sorted(CONDITIONS, key=lambda c: c.precedence))
