"""The small vocabulary condition predicates are written in: compare a signal to a threshold,
record the evidence in words and numbers, combine with three-valued logic, grade a score.

Score convention (the `vllm_triage_condition_score` gauge): 0.5 means a term sits exactly at its
threshold, 1 far past it, 0 far from it; `all_of` takes the minimum, `any_of` the maximum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..model import Evidence, SourceHealth


@dataclass(frozen=True)
class Term:
    holds: bool | None
    score: float


UNKNOWN = Term(None, 0.0)


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def _grade(value: float, comparison: str, threshold: float, upper: float | None) -> float:
    """How far `value` is past (>0.5) or short of (<0.5) the threshold."""
    if comparison in (">", ">="):
        top = upper if upper is not None else max(2 * threshold, threshold + 1e-9)
        if threshold <= 0:
            return 1.0 if value > threshold else 0.0
        if value < threshold:
            return _clamp(0.5 * value / threshold)
        return _clamp(0.5 + 0.5 * (value - threshold) / max(top - threshold, 1e-9))
    # "<" / "<=": small is "past"
    top = upper if upper is not None else max(2 * threshold, threshold + 1e-9)
    if value <= threshold:
        return 1.0 if threshold <= 0 else _clamp(0.5 + 0.5 * (threshold - value) / threshold)
    return _clamp(0.5 - 0.5 * (value - threshold) / max(top - threshold, 1e-9))


_OPS = {
    ">": lambda v, t: v > t,
    ">=": lambda v, t: v >= t,
    "<": lambda v, t: v < t,
    "<=": lambda v, t: v <= t,
}


class Judge:
    """Collects evidence while a predicate runs over one scope's signals."""

    def __init__(
        self,
        signals: Mapping[str, float | None],
        thresholds: Mapping[str, float],
        scope: str,
        health: Mapping[str, SourceHealth] | None = None,
        active: bool = False,
        stuck: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        self.signals = signals
        self.stuck = stuck or {}  # role -> (place, frame) where its stack dump found it waiting
        self.active = active  # the condition is active now: a predicate may hold it on what keeps it true (a latch)
        self.health = health or {}
        self.thresholds = thresholds
        self.scope = scope
        self.evidence: list[Evidence] = []
        self.missing: list[str] = []
        self.cause: str | None = None
        self.advice: list[str] = []  # flag values computed from the observed workload, with their arithmetic

    def value(self, signal: str) -> float | None:
        value = self.signals.get(signal)
        if value is None and signal not in self.missing:
            self.missing.append(signal)
        return value

    def compare(self, signal: str, comparison: str, threshold: str, what: str, unit: str = "", upper: float | None = None, limit: float | None = None) -> Term:
        """`signal comparison thresholds[threshold]`, e.g. ("kv_cache_usage_ratio_mean", ">=", "usage_min");
        `limit` replaces the threshold's value where the evidence itself says what it must be (the text says so)."""
        if limit is None:
            limit = self.thresholds[threshold]
        else:
            threshold = f"{threshold}, adjusted"
        value = self.value(signal)
        if value is None:
            self.evidence.append(Evidence(signal, None, limit, comparison, None, f"{what}: no data", self.scope))
            return UNKNOWN
        holds = _OPS[comparison](value, limit)
        self.evidence.append(
            Evidence(
                signal,
                value,
                limit,
                comparison,
                holds,
                f"{what} {_fmt(value)}{unit} {'is' if holds else 'is not'} {comparison} {_fmt(limit)}{unit} ({threshold})",
                self.scope,
            )
        )
        return Term(holds, _grade(value, comparison, limit, upper))

    def note(self, text: str, signal: str = "", value: float | None = None) -> None:
        """Context a person needs that is not itself a test (the cause, a derived figure)."""
        self.evidence.append(Evidence(signal, value, None, "", None, text, self.scope))

    def advise(self, text: str) -> None:
        """A value to set, computed from what was observed, with the arithmetic that gives it."""
        self.advice.append(text)

    def fact(self, holds: bool | None, text: str, signal: str = "", value: float | None = None) -> Term:
        """A yes/no input that has no threshold (e.g. prefix caching is on)."""
        self.evidence.append(Evidence(signal, value, None, "", holds, text, self.scope))
        if holds is None:
            if signal and signal not in self.missing:
                self.missing.append(signal)
            return UNKNOWN
        return Term(holds, 1.0 if holds else 0.0)


def all_of(*terms: Term) -> Term:
    if any(t.holds is False for t in terms):
        return Term(False, min(t.score for t in terms))
    if any(t.holds is None for t in terms):
        return Term(None, min(t.score for t in terms))
    return Term(True, min(t.score for t in terms))


def any_of(*terms: Term) -> Term:
    if any(t.holds is True for t in terms):
        return Term(True, max(t.score for t in terms))
    if any(t.holds is None for t in terms):
        return Term(None, max(t.score for t in terms))
    return Term(False, max(t.score for t in terms))


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def sm_activity_words(j: Judge, over: str = "window mean") -> str:
    """How a verdict names the GPUs' SM activity it read: GPM's SM active, or util.gpu where the GPU has no GPM."""
    source = "GPM SM active" if j.signals.get("gpu_sm_activity_from_gpm") else "util.gpu (no GPM on this GPU)"
    return f"GPU SM activity, {source}, {over}"
