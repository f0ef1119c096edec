"""Window maths over one source's frames (counter increases across resets, histogram deltas and
bounded quantiles), and the signal-table machinery: SignalDef, and compute_signals over one table."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise, takewhile
from typing import TypeVar, cast

from ..model import Labels
from ..scope import Scope
from ..store import Frame, Store


def label_value(labels: Labels, key: str) -> str | None:
    for k, v in labels:
        if k == key:
            return v
    return None


def counter_step(previous: float, value: float) -> float:
    """A counter's increase from one reading to the next. A decrease means the counter restarted: that
    step starts a new baseline (contributes nothing) rather than a negative or inflated increase."""
    return value - previous if value >= previous else 0.0


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


# A stall is judged from 20 s (engine_wedged): its last 10 s lie inside it.
RECENT_SECONDS = 10.0
T = TypeVar("T")
# A histogram's running counts per bound, the bounds of the frame's step, and the first frame with those bounds.
Totals = tuple[dict[float, float], frozenset[float], float]


class WindowView:
    """The frames of one source over one window, with per-tick caching of derived values."""

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames
        self._cache: dict[tuple[object, ...], object] = {}

    def once(self, key: tuple[object, ...], compute: Callable[[], T]) -> T:
        """compute(), derived from this window once a tick, for every signal that asks for it under `key`."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]  # type: ignore[return-value]

    def recent(self) -> WindowView:
        """The window's last RECENT_SECONDS: what the process and the GPU do now, inside a stall that the whole
        window's mean would mix with the minutes before it."""
        return self.once(("recent",), lambda: WindowView([f for f in self.frames if f.timestamp >= self.frames[-1].timestamp - RECENT_SECONDS]))

    @property
    def span_seconds(self) -> float:
        return self.frames[-1].timestamp - self.frames[0].timestamp if len(self.frames) >= 2 else 0.0

    def covers_everything(self, scope: Scope) -> bool:
        """Whether every series of the window belongs to `scope` (one engine, one GPU): then the
        aggregate's signals are the scope's, and need not be computed twice."""
        allowed = {scope, *scope.shared}
        return all(seen in allowed for frame in self.frames for seen in frame.by_scope)

    def scopes(self) -> list[Scope]:
        if not self.frames:
            return []
        seen = {s.scope for series in self.frames[-1].by_name.values() for s in series}
        named = {scope for scope in seen if scope.kind != "shared"}
        return sorted(named or seen)

    def _frames_of(self, scope: Scope) -> tuple[int, list[Frame]]:
        """Where the scope first appears in the window, and the frames from there on. Before it the scope did not
        exist (an engine under a model name that is new since): nothing of it is computed or remembered in those
        frames, or a page whose model names change at every scrape would grow every frame's memo by each later
        scope, tick after tick. A scope's steps into its first frame count nothing, as before any series of it."""
        found = self._cache.get(("since", scope))
        if found is None:
            start = next((i for i, frame in enumerate(self.frames) if frame.holds(scope)), len(self.frames))
            self._cache[("since", scope)] = found = (start, self.frames[start:] if start else self.frames)
        return found  # type: ignore[return-value]

    def gauge_points(self, name: str, scope: Scope, combine: Callable[[list[float]], float] = sum) -> list[float]:
        """One value per frame: the scope's series combined (summed, or the max for ratios). Only the window's newest
        frame keeps the points, of the frames back to the oldest start any window asked for: the next tick takes
        them from the frame before, cuts them where that start has moved to and adds its own point, copying lists in
        C rather than asking every frame of the window again."""
        key = ("gauge", name, scope, combine)
        cached = self._cache.get(key)
        if cached is None:
            frames = self.frames
            if not frames:
                return []
            newest = frames[-1]
            run = cast("_Points | None", newest.memo.get(key))
            if run is None:
                # the newest frame before it that kept the points (a source read more often than the tick: not the
                # one just before), which gives them up
                index = len(frames) - 2
                while index >= 0 and key not in frames[index].memo:
                    index -= 1
                if index < 0:
                    run = (newest.timestamp, [], [])
                    index = len(frames) - 2
                else:
                    before = cast("_Points", frames[index].memo.pop(key))
                    # the oldest start, moved on as far as the clock did, but not past the frames added below
                    covered = min(before[0] + newest.timestamp - frames[index].timestamp, frames[index + 1].timestamp)
                    first = bisect_left(before[1], covered)
                    run = (covered, before[1][first:], before[2][first:])
                for frame in frames[index + 1 :]:
                    point = _gauge_point(frame, name, scope, combine)
                    if point is not None:
                        run[1].append(frame.timestamp)
                        run[2].append(point)
                newest.memo[key] = run
            start = frames[0].timestamp
            if run[0] > start:  # a longer window than the points cover: its older frames' points go in front
                covered = run[0]
                points = ((f.timestamp, _gauge_point(f, name, scope, combine)) for f in takewhile(lambda f: f.timestamp < covered, frames))
                older = [(t, point) for t, point in points if point is not None]
                newest.memo[key] = run = (start, [t for t, _ in older] + run[1], [v for _, v in older] + run[2])
            self._cache[key] = cached = run[2][bisect_left(run[1], start) :]
        assert isinstance(cached, list)
        return cached

    def increase(self, name: str, scope: Scope, where: Callable[[Labels], bool] | None = None) -> float | None:
        """Increase of a counter (summed over the scope's series) across the window."""
        key = ("increase", name, scope, where)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        result: float | None = None
        frames = self._frames_of(scope)[1]
        if len(frames) >= 2:

            def advance(total: object, previous: Frame, frame: Frame) -> tuple[float, float | None]:
                increase, seen = _counter_step(previous, frame, name, scope, where)
                before, last_seen = cast("tuple[float, float | None]", total)
                return before + increase, frame.timestamp if seen else last_seen

            first, last = _running_totals(frames, ("counter_total", name, scope, where), (0.0, None), advance)
            (first_total, _), (last_total, last_seen) = cast("tuple[float, float | None]", first), cast("tuple[float, float | None]", last)
            if (last_seen is not None and last_seen >= frames[1].timestamp) or any(where is None or where(s.labels) for s in frames[0].series(name, scope)):
                result = last_total - first_total
        elif len(self.frames) >= 2 and frames and any(where is None or where(s.labels) for s in frames[0].series(name, scope)):
            result = 0.0  # first seen in the newest frame: no step of it yet
        self._cache[key] = result
        return result

    def step_increases(self, name: str, scope: Scope) -> list[float] | None:
        """The counter's increase (summed over the scope's series) from each frame to the next; None when no
        frame has it."""
        key = ("steps", name, scope)
        if key not in self._cache:
            start, frames = self._frames_of(scope)
            steps = [_counter_step(previous, frame, name, scope, None) for previous, frame in pairwise(frames)]
            seen = any(s for _, s in steps) or bool(frames and frames[0].series(name, scope))
            self._cache[key] = [0.0] * start + [increase for increase, _ in steps] if seen else None
        return self._cache[key]  # type: ignore[return-value]

    def rate(self, name: str, scope: Scope, where: Callable[[Labels], bool] | None = None) -> float | None:
        increase = self.increase(name, scope, where)
        if increase is None or self.span_seconds <= 0:
            return None
        return increase / self.span_seconds

    def histogram(self, name: str, scope: Scope) -> HistogramDelta | None:
        key = ("histogram", name, scope)
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        result: HistogramDelta | None = None
        start, frames = self._frames_of(scope)
        if len(self.frames) >= 2 and frames:

            def advance(total: object, previous: Frame, frame: Frame) -> Totals:
                # Per frame: the counts so far, the bounds its step had and since when. Frames share what did
                # not change (the layout object; the counts when no bucket moved): a frame keeps little more.
                counts, layout, since = cast("Totals", total)
                step = _bucket_step(previous, frame, name + "_bucket", scope)
                if step.keys() != layout:
                    layout, since = frozenset(step), frame.timestamp
                elif not any(step.values()):
                    return counts, layout, since
                counts = dict(counts)
                for bound, increase in step.items():
                    counts[bound] = counts.get(bound, 0.0) + increase
                return counts, layout, since

            totals_key = ("bucket_totals", name, scope)
            first, last = _running_totals(frames, totals_key, ({}, frozenset(), frames[0].timestamp), advance)
            first_counts, (last_counts, bounds, since) = cast("Totals", first)[0], cast("Totals", last)
            if start:  # the scope's first frame is a step into its bounds, counting nothing
                bounds = frozenset(s.le for f in frames for s in f.series(name + "_bucket", scope) if s.le is not None)
            elif since > frames[1].timestamp:  # the layout changed inside the window: its bounds are every step's
                bounds = frozenset(s.le for f in frames[1:] for s in f.series(name + "_bucket", scope) if s.le is not None)
            by_bound = {bound: last_counts.get(bound, 0.0) - first_counts.get(bound, 0.0) for bound in bounds}
            if by_bound:
                result = HistogramDelta(
                    buckets=sorted(by_bound.items()),
                    sum=self.increase(name + "_sum", scope) or 0.0,
                    count=self.increase(name + "_count", scope) or 0.0,
                )
        self._cache[key] = result
        return result

    def latest_labels(self, name: str, scope: Scope) -> dict[str, str] | None:
        """Labels of an info-style gauge (e.g. cache_config_info) in the newest frame that has it."""
        for frame in reversed(self.frames):
            for s in frame.series(name, scope):
                return dict(s.labels)
        return None


# A window's increase is the sum of its steps from one frame to the next. A step depends on its two frames
# only, so the sum is a difference of running totals that each frame keeps: a tick adds only the newest step.
# A counter's step is kept too (step_increases reads the steps one by one); a histogram's is not.


def _running_totals(frames: list[Frame], key: tuple[object, ...], zero: object, advance: Callable[[object, Frame, Frame], object]) -> tuple[object, object]:
    """The running total at the window's first and last frame. Each frame's memo holds (where its run
    started, the frame it follows, its total). A run starts at a frame that had no total yet and is only
    ever extended forward over the store's frames, so any two totals of one run differ by exactly the steps
    between them, whatever windows asked in between: only the frames after the newest one of the head's run
    are computed (at a tick, the new frame). Steps that are all zero leave the total bit for bit equal: a
    counter that stood still has an increase of exactly 0."""
    head = frames[0]
    entry = cast("tuple[float, float | None, object] | None", head.memo.get(key))
    if entry is None:
        head.memo[key] = entry = (head.timestamp, None, zero)
    run, _, first = entry
    index = len(frames) - 1
    while index > 0:  # the newest frame that already holds a total of this run
        found = frames[index].memo.get(key)
        if found is not None and found[0] == run and found[1] == frames[index - 1].timestamp:  # type: ignore[index]
            break
        index -= 1
    total = first if index == 0 else frames[index].memo[key][2]  # type: ignore[index]
    for previous, frame in pairwise(frames[index:]):
        total = advance(total, previous, frame)
        frame.memo[key] = (run, previous.timestamp, total)
    return first, total


def _counter_step(previous: Frame, frame: Frame, name: str, scope: Scope, where: Callable[[Labels], bool] | None) -> tuple[float, bool]:
    """(increase of the scope's series from `previous` to `frame`, whether `frame` has any)."""
    key = ("counter_step", name, scope, where, previous.timestamp)
    step = frame.memo.get(key)
    if step is None:
        before = {s.labels: s.value for s in previous.series(name, scope)}
        increase, seen = 0.0, False
        for s in frame.series(name, scope):
            if where is None or where(s.labels):
                seen = True
                old = before.get(s.labels)
                if old is not None:
                    increase += counter_step(old, s.value)
        frame.memo[key] = step = (increase, seen)
    return step  # type: ignore[return-value]


def _bucket_step(previous: Frame, frame: Frame, name: str, scope: Scope) -> dict[float, float]:
    """Increase per bucket bound of the scope's `name` series from `previous` to `frame` (not kept: only
    the running totals built from it are)."""
    before = {s.labels: s.value for s in previous.series(name, scope)}
    by_bound: dict[float, float] = {}
    for s in frame.series(name, scope):
        if s.le is not None:
            old = before.get(s.labels)
            by_bound[s.le] = by_bound.get(s.le, 0.0) + (counter_step(old, s.value) if old is not None else 0.0)
    return by_bound


# A frame's points of one gauge: (the oldest window start they cover, the timestamps of the frames with a point, the
# points), sorted by timestamp.
_Points = tuple[float, list[float], list[float]]


def _gauge_point(frame: Frame, name: str, scope: Scope, combine: Callable[[list[float]], float]) -> float | None:
    values = [s.value for s in frame.series(name, scope)]
    return combine(values) if values else None


Compute = Callable[["SignalContext"], "float | None"]
_C = TypeVar("_C", bound=Compute)


def reads(*samples: str) -> Callable[[_C], _C]:
    """Declares the samples (today's names; a histogram's with its suffixes) a signal's computation reads from the
    window, on the function itself: a source that parses only what its signals read (the vLLM source) derives that
    from its table (SignalDef.samples), and a test replays real captures to check that no signal reads more."""

    def declare(compute: _C) -> _C:
        vars(compute)["samples"] = samples  # kept on the function: a wrapper would cost a call per signal and tick
        return compute

    return declare


@dataclass(frozen=True)
class SignalDef:
    id: str
    family: str  # exported as <its table's prefix><family> (exposition.SIGNAL_TABLES)
    help: str
    compute: Compute
    extra_labels: tuple[tuple[str, str], ...] = ()

    @property
    def samples(self) -> tuple[str, ...]:
        """The window samples its computation declared it reads (`reads`); none when it reads only facts and
        signals computed before it."""
        return tuple(vars(self.compute).get("samples", ()))


@dataclass(frozen=True)
class ServerFacts:
    """What signals read beside the window: facts about the server that its metrics do not carry."""

    max_num_seqs: int | None = None
    peak_flops_per_second: float | None = None  # per GPU, dense bf16 (hardware.GPU_PEAKS)
    peak_memory_bytes_per_second: float | None = None
    # Each tensor-parallel group's GPUs (their scopes) as the rank map places its ranks: one engine's group is not
    # compared with another engine's. Empty where the rank map places none.
    gpu_groups: tuple[tuple[Scope, ...], ...] = ()
    # From vLLM's command line where the host view shows it (None: not visible, or not given there).
    max_num_batched_tokens: int | None = None
    api_server_count: int | None = None
    cuda_graphs: bool | None = None  # False where the command line turns them off (--enforce-eager, cudagraph_mode NONE)
    cpu_offload_gib: float | None = None  # --cpu-offload-gb: the weights kept in host memory per GPU (0 without it)


@dataclass
class SignalContext:
    view: WindowView
    scope: Scope
    facts: ServerFacts
    values: dict[str, float | None]  # signals already computed for this scope (dependencies)


def safe_ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def mean_of(values: list[float]) -> float:
    return sum(values) / len(values)


def compute_signals(view: WindowView, scope: Scope, facts: ServerFacts, table: tuple[SignalDef, ...]) -> dict[str, float | None]:
    """Every signal of a table for one scope, in table order (later ones may read earlier ones)."""
    values: dict[str, float | None] = {}
    ctx = SignalContext(view, scope, facts, values)
    for signal in table:
        value = signal.compute(ctx)
        # A signal no arithmetic downstream can use (NaN, ±Inf from an overflow) is "cannot be computed".
        values[signal.id] = value if value is not None and math.isfinite(value) else None
    return values


def window(store: Store, source: str, now: float, window_seconds: float) -> WindowView:
    return WindowView(store.window(source, now - window_seconds, now))
