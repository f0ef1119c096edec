"""Window maths over one source's frames (counter increases across resets, histogram deltas and
bounded quantiles), and the signal-table machinery: SignalDef, and compute_signals over one table."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..model import Labels
from ..scope import parse_scope, shared_scopes
from ..store import Frame, Store


def label_value(labels: Labels, key: str) -> str | None:
    for k, v in labels:
        if k == key:
            return v
    return None


def counter_increase(points: Iterable[tuple[float, float]]) -> float:
    """Sum of step increases. A decrease means the counter restarted: that step starts a new
    baseline (contributes nothing) rather than producing a negative or inflated increase."""
    total = 0.0
    previous: float | None = None
    for _, value in points:
        if previous is not None and value >= previous:
            total += value - previous
        previous = value
    return total


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper_bound, count) buckets."""
    if not buckets:
        return None
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total <= 0 or not math.isinf(buckets[-1][0]):
        return None
    rank = q * total
    lower_bound = 0.0
    lower_count = 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):
                return lower_bound  # the highest finite bound is the best we can say
            if count == lower_count:
                return upper_bound
            return lower_bound + (upper_bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = upper_bound, count
    return lower_bound


@dataclass(frozen=True)
class HistogramDelta:
    buckets: list[tuple[float, float]]  # cumulative (le, increase)
    sum: float
    count: float

    def quantile(self, q: float) -> float | None:
        """histogram_quantile, bounded by Markov's inequality for non-negative observations: at most
        mean / (1 - q). Interpolating inside a wide first bucket invents values (a real queue time of
        15 us read as p50 0.15 s, p95 0.285 s); the bound keeps them within what the mean allows."""
        if self.count <= 0:
            return None
        estimate = histogram_quantile(q, self.buckets)
        mean = self.mean()
        if estimate is None or mean is None or mean < 0 or q >= 1:
            return estimate
        return min(estimate, mean / (1 - q))

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None


class WindowView:
    """The frames of one source over one window, with per-tick caching of derived values."""

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames
        self._cache: dict[tuple[object, ...], object] = {}

    @property
    def span_seconds(self) -> float:
        return self.frames[-1].timestamp - self.frames[0].timestamp if len(self.frames) >= 2 else 0.0

    def covers_everything(self, scope: str) -> bool:
        """Whether every series of the window belongs to `scope` (one engine, one GPU): then the
        aggregate's signals are the scope's, and need not be computed twice."""
        allowed = {scope, *shared_scopes(scope)}
        return all(seen in allowed for frame in self.frames for seen in frame.by_scope)

    def scopes(self) -> list[str]:
        if not self.frames:
            return []
        seen = {s.scope for series in self.frames[-1].by_name.values() for s in series}
        named = {scope for scope in seen if parse_scope(scope).kind != "shared"}
        return sorted(named or seen)

    def gauge_points(self, name: str, scope: str, combine: Callable[[list[float]], float] = sum) -> list[float]:
        """One value per frame: the scope's series combined (summed, or the max for ratios)."""
        key = ("gauge", name, scope, combine)
        cached = self._cache.get(key)
        if cached is None:
            points: list[float] = []
            for frame in self.frames:
                values = [s.value for s in frame.series(name, scope)]
                if values:
                    points.append(combine(values))
            self._cache[key] = cached = points
        assert isinstance(cached, list)
        return cached

    def increase(self, name: str, scope: str, where: Callable[[Labels], bool] | None = None) -> float | None:
        """Increase of a counter (summed over the scope's series) across the window."""
        key = ("increase", name, scope, where)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        per_series: dict[Labels, list[tuple[float, float]]] = {}
        for frame in self.frames:
            for s in frame.series(name, scope):
                if where is None or where(s.labels):
                    per_series.setdefault(s.labels, []).append((frame.timestamp, s.value))
        result: float | None
        if len(self.frames) < 2 or not per_series:
            result = None
        else:
            result = sum(counter_increase(points) for points in per_series.values())
        self._cache[key] = result
        return result

    def rate(self, name: str, scope: str, where: Callable[[Labels], bool] | None = None) -> float | None:
        increase = self.increase(name, scope, where)
        if increase is None or self.span_seconds <= 0:
            return None
        return increase / self.span_seconds

    def histogram(self, name: str, scope: str) -> HistogramDelta | None:
        key = ("histogram", name, scope)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        result: HistogramDelta | None = None
        if len(self.frames) >= 2:
            per_bucket: dict[Labels, list[tuple[float, float]]] = {}
            bound_of: dict[Labels, float] = {}
            for frame in self.frames:
                for s in frame.series(name + "_bucket", scope):
                    if s.le is not None:
                        per_bucket.setdefault(s.labels, []).append((frame.timestamp, s.value))
                        bound_of[s.labels] = s.le
            if per_bucket:
                by_bound: dict[float, float] = {}
                for labels, points in per_bucket.items():
                    bound = bound_of[labels]
                    by_bound[bound] = by_bound.get(bound, 0.0) + counter_increase(points)
                result = HistogramDelta(
                    buckets=sorted(by_bound.items()),
                    sum=self.increase(name + "_sum", scope) or 0.0,
                    count=self.increase(name + "_count", scope) or 0.0,
                )
        self._cache[key] = result
        return result

    def latest_labels(self, name: str, scope: str) -> dict[str, str] | None:
        """Labels of an info-style gauge (e.g. cache_config_info) in the newest frame that has it."""
        for frame in reversed(self.frames):
            for s in frame.series(name, scope):
                return dict(s.labels)
        return None


@dataclass(frozen=True)
class SignalDef:
    id: str
    family: str  # exported as <its table's prefix><family> (exposition.SIGNAL_TABLES)
    help: str
    compute: Callable[[SignalContext], float | None]
    extra_labels: tuple[tuple[str, str], ...] = ()


@dataclass
class SignalContext:
    view: WindowView
    scope: str
    max_num_seqs: int | None
    values: dict[str, float | None]  # signals already computed for this scope (dependencies)


def safe_ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def mean_of(values: list[float]) -> float:
    return sum(values) / len(values)


def compute_signals(view: WindowView, scope: str, max_num_seqs: int | None, table: tuple[SignalDef, ...]) -> dict[str, float | None]:
    """Every signal of a table for one scope, in table order (later ones may read earlier ones)."""
    values: dict[str, float | None] = {}
    ctx = SignalContext(view, scope, max_num_seqs, values)
    for signal in table:
        value = signal.compute(ctx)
        # A signal no arithmetic downstream can use (NaN, ±Inf from an overflow) is "cannot be computed".
        values[signal.id] = value if value is not None and math.isfinite(value) else None
    return values


def window(store: Store, source: str, now: float, window_seconds: float) -> WindowView:
    return WindowView(store.window(source, now - window_seconds, now))
