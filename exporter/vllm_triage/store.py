"""Ring buffers of Readings per source, indexed once on arrival so that window math is cheap.

The store also keeps each source's health (up, last error, cumulative error counts by reason);
it is derived from the Readings alone, so a replay reproduces it exactly.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from .model import Labels, Reading, SourceHealth, bucket_bound
from .scope import AGGREGATE_SCOPE, Scope, scope_of


class Series(NamedTuple):  # a tuple: made for every sample of every reading, so made cheaply
    scope: Scope
    labels: Labels
    value: float
    le: float | None = None  # a histogram bucket's upper bound, parsed once on arrival


@lru_cache(maxsize=16384)  # labels are shared tuples (make_labels): read once per label set (32 engines fit), not per reading
def _scope_and_bound(labels: Labels, bucket: bool) -> tuple[Scope, float | None]:
    return scope_of(labels), bucket_bound(next((v for k, v in labels if k == "le"), None)) if bucket else None


@dataclass(frozen=True)
class Frame:
    """One ok Reading, its samples grouped by metric name, and by scope then name. A frame stays in the
    windows of many ticks: what is derived from it alone is kept in `memo` and computed once."""

    timestamp: float
    by_name: dict[str, tuple[Series, ...]]
    by_scope: dict[Scope, dict[str, tuple[Series, ...]]]
    meta: Mapping[str, object]
    memo: dict[tuple[object, ...], object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_reading(cls, reading: Reading) -> Frame:
        grouped: dict[str, list[Series]] = {}
        scoped: dict[Scope, dict[str, list[Series]]] = {}
        for (name, labels), value in reading.samples.items():
            scope, le = _scope_and_bound(labels, name.endswith("_bucket"))
            series = Series(scope, labels, value, le)
            grouped.setdefault(name, []).append(series)
            scoped.setdefault(scope, {}).setdefault(name, []).append(series)
        by_scope = {scope: {k: tuple(v) for k, v in names.items()} for scope, names in scoped.items()}
        return cls(reading.timestamp, {k: tuple(v) for k, v in grouped.items()}, by_scope, reading.meta)

    def holds(self, scope: Scope) -> bool:
        """Whether any series of the frame is the scope's own (not only its engine's shared ones)."""
        if scope is AGGREGATE_SCOPE:
            return bool(self.by_name)
        if scope.kind == "gpu_group":
            return any(member in self.by_scope for member in scope.members)
        return scope in self.by_scope

    def series(self, name: str, scope: Scope) -> tuple[Series, ...]:
        """The series of `name` that belong to `scope`: all of them for the aggregate, else the scope's
        own plus its engine's shared ones. An index lookup, so judging many engines stays linear."""
        if scope is AGGREGATE_SCOPE:
            return self.by_name.get(name, ())
        key = ("series", name, scope)
        found = self.memo.get(key)
        if found is None:
            if scope.kind == "gpu_group":
                found = tuple(s for member in scope.members for s in self.by_scope.get(member, {}).get(name, ()))
            else:
                own = self.by_scope.get(scope)
                found = own.get(name, ()) if own is not None else ()
                for shared in scope.shared:
                    found += self.by_scope.get(shared, {}).get(name, ())
                if own is None:
                    # Not remembered for a scope the frame does not hold: an engine under a model name new since this
                    # frame would otherwise grow the memo of every frame in the window, tick after tick, under churn.
                    return found
            self.memo[key] = found
        return found  # type: ignore[return-value]


class _SourceState:
    def __init__(self, name: str) -> None:
        self.name = name
        self.frames: deque[Frame] = deque()
        self.timestamps: deque[float] = deque()
        self.latest: Reading | None = None
        self.failed: deque[Reading] = deque()  # the horizon's failed readings, without their samples: evidence for a bundle
        self.last_success: float | None = None
        self.failing_since: float | None = None  # start of the current run of failed readings
        self.last_error: str | None = None
        self.last_error_reason: str | None = None
        self.errors_total: dict[str, int] = {}


class Store:
    """Keeps `horizon_seconds` of frames per source (a source in `horizons` its own); older frames are
    dropped as new ones arrive."""

    def __init__(self, horizon_seconds: float, max_frames: int = 5000, horizons: dict[str, float] | None = None) -> None:
        self.horizon_seconds = horizon_seconds
        self.horizons = dict(horizons or {})
        self.max_frames = max_frames
        self._sources: dict[str, _SourceState] = {}

    def add(self, reading: Reading) -> None:
        state = self._sources.get(reading.source)
        if state is None:
            state = self._sources[reading.source] = _SourceState(reading.source)
        if state.latest is not None and reading.timestamp < state.latest.timestamp:
            # A capture can hold readings slightly out of order; keep windows monotonic.
            return
        frame = Frame.from_reading(reading) if reading.ok else None  # first: nothing is recorded if it fails
        state.latest = reading
        # A page with refused series counts each reason (vllm_triage_source_errors_total{reason}).
        reasons = set(reading.vllm_meta().get("dropped", ())) or ({reading.error_reason} if reading.error_reason else set())
        for reason in reasons:
            state.errors_total[reason] = state.errors_total.get(reason, 0) + 1
        if reading.error_reason:
            state.last_error = reading.error
            state.last_error_reason = reading.error_reason
        if frame is not None:
            state.failing_since = None
            state.last_success = reading.timestamp
            state.frames.append(frame)
            state.timestamps.append(reading.timestamp)
        else:
            if state.failing_since is None:
                state.failing_since = reading.timestamp
            state.failed.append(replace(reading, samples={}) if reading.samples else reading)
        cutoff = reading.timestamp - self.horizons.get(reading.source, self.horizon_seconds)
        while state.frames and (state.timestamps[0] < cutoff or len(state.frames) > self.max_frames):
            state.frames.popleft()
            state.timestamps.popleft()
        while state.failed and (state.failed[0].timestamp < cutoff or len(state.failed) > self.max_frames):
            state.failed.popleft()

    def sources(self) -> list[str]:
        return sorted(self._sources)

    def recall_success(self, source: str, at: float) -> None:
        """A success before this store began (what the sidecar's state file kept across its restart), for a source that
        has not succeeded since: it is judged as one that answered before, not as one that has never answered."""
        state = self._sources.get(source)
        if state is not None and state.last_success is None:
            state.last_success = at

    def take_history(self, other: Store, sources: tuple[str, ...]) -> None:
        """Continue from `other`'s readings of these sources (a reloaded config: the windows stay full);
        this store's horizons apply from the next reading on."""
        self._sources.update({name: state for name, state in other._sources.items() if name in sources})

    def latest(self, source: str) -> Reading | None:
        state = self._sources.get(source)
        return state.latest if state else None

    def last_success(self, source: str) -> float | None:
        state = self._sources.get(source)
        return state.last_success if state else None

    def failing_since(self, source: str) -> float | None:
        state = self._sources.get(source)
        return state.failing_since if state else None

    def readings(self, names: frozenset[str] | None = None) -> list[Reading]:
        """Every source's kept readings again (only the samples named in `names`, when given), oldest first: what the
        in-memory window holds (the live incident page, the incident bundle), its failed scrapes included: a replay of
        them sees the outage the sidecar saw."""
        found = [
            Reading(
                state.name,
                frame.timestamp,
                True,
                {(name, s.labels): s.value for name, series in frame.by_name.items() if names is None or name in names for s in series},
                meta=dict(frame.meta),
            )
            for state in self._sources.values()
            for frame in state.frames
        ]
        found += (reading for state in self._sources.values() for reading in state.failed)
        return sorted(found, key=lambda r: r.timestamp)

    def window(self, source: str, start: float, end: float) -> list[Frame]:
        """Ok frames with start <= timestamp <= end, oldest first."""
        state = self._sources.get(source)
        if state is None:
            return []
        lo = bisect.bisect_left(state.timestamps, start)
        hi = bisect.bisect_right(state.timestamps, end)
        return [state.frames[i] for i in range(lo, hi)]

    def health(self, source: str) -> SourceHealth:
        state = self._sources.get(source)
        if state is None or state.latest is None:
            return SourceHealth(source, None, None, None, None, 0.0, {})
        return SourceHealth(
            source=source,
            up=state.latest.ok,
            last_error=state.last_error,
            last_error_reason=state.last_error_reason,
            last_success_timestamp=state.last_success,
            collect_duration_seconds=state.latest.duration_seconds,
            errors_total=dict(state.errors_total),
            failing_since=state.failing_since,
        )
