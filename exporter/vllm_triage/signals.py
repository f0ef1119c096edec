"""Window math and the table of layer-1 signals. Pure functions of the store and the clock.

A signal value of None means "cannot be computed" (metric absent, fewer than two frames in the
window, no observations for a quantile); conditions turn that into `unknown` or say why not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .model import HISTOGRAM_SUFFIXES, Labels
from .store import Frame, Store, shared_scopes


def _label(labels: Labels, key: str) -> str | None:
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
        named = {scope for scope in seen if not scope.startswith("/")}
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


# ---------------------------------------------------------------------------------------------
# The signal table. Each signal is exported as family `vllm_triage_vllm_<family>` with the extra
# label(s) given, per engine (labels engine, model_name); the aggregate is shown in /diagnosis.


@dataclass(frozen=True)
class SignalDef:
    id: str
    family: str  # exported as vllm_triage_vllm_<family>
    help: str
    compute: Callable[[SignalContext], float | None]
    extra_labels: tuple[tuple[str, str], ...] = ()


@dataclass
class SignalContext:
    view: WindowView
    scope: str
    max_num_seqs: int | None
    values: dict[str, float | None]  # signals already computed for this scope (dependencies)


def _gauge_stat(metric: str, stat: str, combine: Callable[[list[float]], float] = sum) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points(metric, ctx.scope, combine)
        if not points:
            return None
        if stat == "mean":
            return sum(points) / len(points)
        return min(points) if stat == "min" else max(points)

    return compute


def _rate(metric: str, where: Callable[[Labels], bool] | None = None) -> Callable[[SignalContext], float | None]:
    return lambda ctx: ctx.view.rate(metric, ctx.scope, where)


def _quantile(metric: str, q: float) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        hist = ctx.view.histogram(metric, ctx.scope)
        return hist.quantile(q) if hist else None

    return compute


def _hist_mean(metric: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        hist = ctx.view.histogram(metric, ctx.scope)
        return hist.mean() if hist else None

    return compute


def _observations(metric: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        hist = ctx.view.histogram(metric, ctx.scope)
        return hist.count if hist else None

    return compute


def _is_error(labels: Labels) -> bool:
    return _label(labels, "finished_reason") == "error"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _error_ratio(ctx: SignalContext) -> float | None:
    errors = ctx.view.increase("vllm:request_success_total", ctx.scope, _is_error)
    finished = ctx.view.increase("vllm:request_success_total", ctx.scope)
    if finished is None:
        return None
    return _ratio(errors or 0.0, finished) if finished > 0 else 0.0


def _prefill_share(ctx: SignalContext) -> float | None:
    prefill = ctx.view.increase("vllm:request_prefill_time_seconds_sum", ctx.scope)
    decode = ctx.view.increase("vllm:request_decode_time_seconds_sum", ctx.scope)
    if prefill is None or decode is None:
        return None
    return _ratio(prefill, prefill + decode)


def _prefix_hit_ratio(ctx: SignalContext) -> float | None:
    return _ratio(
        ctx.view.increase("vllm:prefix_cache_hits_total", ctx.scope),
        ctx.view.increase("vllm:prefix_cache_queries_total", ctx.scope),
    )


def _preempted_per_finished(ctx: SignalContext) -> float | None:
    # Counted against at least one request: preemptions while nothing finishes is a storm too.
    preemptions = ctx.view.increase("vllm:num_preemptions_total", ctx.scope)
    finished = ctx.view.increase("vllm:request_success_total", ctx.scope)
    if preemptions is None or finished is None:
        return None
    return preemptions / max(finished, 1.0)


def _cache_config(ctx: SignalContext) -> dict[str, str] | None:
    return ctx.view.latest_labels("vllm:cache_config_info", ctx.scope)


def _int_label(labels: dict[str, str] | None, key: str) -> float | None:
    if not labels:
        return None
    try:
        return float(int(labels[key]))
    except (KeyError, ValueError):
        return None


def _block_size(ctx: SignalContext) -> float | None:
    return _int_label(_cache_config(ctx), "block_size")


def _kv_capacity_tokens(ctx: SignalContext) -> float | None:
    labels = _cache_config(ctx)
    tokens = _int_label(labels, "kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    blocks = _int_label(labels, "num_gpu_blocks")
    size = _int_label(labels, "block_size")
    return blocks * size if blocks is not None and size is not None else None


def _one_block_below_full(ctx: SignalContext) -> float | None:
    """KV usage with one block free: usage moves in steps of one block (of num_gpu_blocks - 1 usable:
    vLLM keeps one null block), so a saturated small cache may never be sampled at exactly 1.0."""
    blocks = _int_label(_cache_config(ctx), "num_gpu_blocks")
    return 1.0 - 1.0 / (blocks - 1) if blocks is not None and blocks > 2 else None


def _latest_total(metric: str) -> Callable[[SignalContext], float | None]:
    """A counter's value in the newest frame (since the server started)."""

    def compute(ctx: SignalContext) -> float | None:
        for frame in reversed(ctx.view.frames):
            values = [s.value for s in frame.series(metric, ctx.scope)]
            if values:
                return sum(values)
        return None

    return compute


def _prefix_caching_enabled(ctx: SignalContext) -> float | None:
    labels = _cache_config(ctx)
    if not labels or "enable_prefix_caching" not in labels:
        return None
    return 1.0 if labels["enable_prefix_caching"].lower() == "true" else 0.0


def _max_num_seqs(ctx: SignalContext) -> float | None:
    return float(ctx.max_num_seqs) if ctx.max_num_seqs else None


def _running_to_max(ctx: SignalContext) -> float | None:
    return _ratio(ctx.values.get("requests_running_mean"), ctx.values.get("max_num_seqs"))


def _kv_live_token_ratio(ctx: SignalContext) -> float | None:
    """Tokens the running requests can hold / KV tokens in use. Requests hold their prompt and, on
    average, half their eventual output; far less than the KV in use means blocks outlive tokens."""
    v = ctx.values
    running, prompt, generated = v.get("requests_running_mean"), v.get("prompt_tokens_mean"), v.get("generation_tokens_mean")
    usage, capacity = v.get("kv_cache_usage_ratio_mean"), v.get("kv_capacity_tokens")
    if None in (running, prompt, generated, usage, capacity):
        return None
    assert running is not None and prompt is not None and generated is not None and usage is not None and capacity is not None
    # An estimate from window means (lengths of the requests that finished, running and usage sampled
    # apart): it can read above 1 (1.06-1.25 on a real H200 engine), which is no news: capped at 1.
    ratio = _ratio(running * (prompt + generated / 2), usage * capacity)
    return None if ratio is None else min(ratio, 1.0)


def _kv_last_block_waste_ratio(ctx: SignalContext) -> float | None:
    """Half a block per running request is empty on average: that waste as a share of capacity."""
    v = ctx.values
    running, block, capacity = v.get("requests_running_mean"), v.get("block_size_tokens"), v.get("kv_capacity_tokens")
    if running is None or block is None or capacity is None:
        return None
    return _ratio(running * block / 2, capacity)


def _stats(metric: str, family: str, what: str, combine: Callable[[list[float]], float] = sum) -> list[SignalDef]:
    return [
        SignalDef(
            f"{family}_{stat}",
            family,
            f"{what}, {stat} over the window.",
            _gauge_stat(metric, stat, combine),
            (("stat", stat),),
        )
        for stat in ("mean", "min", "max")
    ]


def _quantiles(metric: str, family: str, what: str, qs: tuple[float, ...]) -> list[SignalDef]:
    return [
        SignalDef(
            f"{family}_p{int(q * 100)}",
            family,
            f"{what}, quantile over requests in the window (from histogram deltas).",
            _quantile(metric, q),
            # not `quantile`: Prometheus reserves that label for summaries (promtool check metrics refuses it on a gauge)
            (("percentile", f"{q * 100:g}"),),
        )
        for q in qs
    ] + [
        SignalDef(f"{family}_mean", family + "_mean", f"{what}, mean over the window.", _hist_mean(metric)),
        SignalDef(
            f"{family}_observations",
            family + "_observations",
            f"Number of {what.lower()} observations in the window.",
            _observations(metric),
        ),
    ]


SIGNALS: tuple[SignalDef, ...] = (
    *_stats("vllm:num_requests_running", "requests_running", "Requests running"),
    *_stats("vllm:num_requests_waiting", "requests_waiting", "Requests waiting"),
    *_stats("vllm:kv_cache_usage_perc", "kv_cache_usage_ratio", "KV cache usage (0..1)", max),
    SignalDef("preemptions_per_second", "preemptions_per_second", "Preemptions per second.", _rate("vllm:num_preemptions_total")),
    SignalDef(
        "preemptions_per_finished_request",
        "preemptions_per_finished_request_ratio",
        "Preemptions per finished request over the window.",
        _preempted_per_finished,
    ),
    SignalDef("prompt_tokens_per_second", "prompt_tokens_per_second", "Prompt tokens processed per second.", _rate("vllm:prompt_tokens_total")),
    SignalDef(
        "generation_tokens_per_second",
        "generation_tokens_per_second",
        "Generated tokens per second.",
        _rate("vllm:generation_tokens_total"),
    ),
    SignalDef(
        "finished_requests_per_second",
        "finished_requests_per_second",
        "Requests finished per second (any reason).",
        _rate("vllm:request_success_total"),
    ),
    SignalDef("request_error_ratio", "request_error_ratio", "Share of finished requests with finished_reason=error.", _error_ratio),
    *_quantiles("vllm:time_to_first_token_seconds", "ttft_seconds", "Time to first token", (0.5, 0.95, 0.99)),
    *_quantiles("vllm:inter_token_latency_seconds", "inter_token_latency_seconds", "Inter-token latency", (0.5, 0.95, 0.99)),
    *_quantiles("vllm:request_queue_time_seconds", "queue_time_seconds", "Queue time", (0.5, 0.95)),
    *_quantiles("vllm:request_prefill_time_seconds", "prefill_time_seconds", "Prefill time", (0.95,)),
    *_quantiles("vllm:e2e_request_latency_seconds", "e2e_latency_seconds", "End-to-end request latency", (0.5, 0.95)),
    SignalDef("prefill_time_share_ratio", "prefill_time_share_ratio", "Prefill time / (prefill + decode time).", _prefill_share),
    SignalDef("prefix_cache_hit_ratio", "prefix_cache_hit_ratio", "Prefix cache hits / queries.", _prefix_hit_ratio),
    SignalDef(
        "prefix_cache_queries_per_second",
        "prefix_cache_queries_per_second",
        "Prefix cache queries per second (tokens; blocks on old versions).",
        _rate("vllm:prefix_cache_queries_total"),
    ),
    SignalDef(
        "prompt_tokens_mean",
        "request_prompt_tokens_mean",
        "Mean prompt length of finished requests.",
        _hist_mean("vllm:request_prompt_tokens"),
    ),
    SignalDef(
        "generation_tokens_mean",
        "request_generation_tokens_mean",
        "Mean generated length of finished requests.",
        _hist_mean("vllm:request_generation_tokens"),
    ),
    SignalDef("tokens_per_step_mean", "tokens_per_step_mean", "Tokens per engine step, mean.", _hist_mean("vllm:iteration_tokens_total")),
    SignalDef("kv_capacity_tokens", "kv_capacity_tokens", "KV cache capacity in tokens (cache_config_info).", _kv_capacity_tokens),
    SignalDef("block_size_tokens", "kv_block_size_tokens", "KV block size in tokens (cache_config_info).", _block_size),
    SignalDef("prefix_caching_enabled", "prefix_caching_enabled", "1 when prefix caching is on.", _prefix_caching_enabled),
    SignalDef(
        "kv_cache_one_block_below_full_ratio",
        "kv_cache_one_block_below_full_ratio",
        "KV usage with exactly one block free (1 - 1 / usable blocks, from cache_config_info).",
        _one_block_below_full,
    ),
    SignalDef(
        "prefix_cache_hits_since_start",
        "prefix_cache_hits_since_start",
        "Prefix-cache hits (tokens) since vLLM started: 0 means no prompt ever shared a cached prefix.",
        _latest_total("vllm:prefix_cache_hits_total"),
    ),
    SignalDef(
        "kv_live_token_ratio",
        "kv_live_token_ratio",
        "Tokens the running requests hold (running x (mean prompt + mean output / 2)) / KV tokens in use; an estimate, capped at 1.",
        _kv_live_token_ratio,
    ),
    SignalDef(
        "kv_last_block_waste_ratio",
        "kv_last_block_waste_ratio",
        "Half-empty last blocks (running x block_size / 2) as a share of KV capacity.",
        _kv_last_block_waste_ratio,
    ),
    SignalDef("max_num_seqs", "max_num_seqs", "max_num_seqs in force (config, vLLM command line or vLLM default).", _max_num_seqs),
    SignalDef(
        "running_to_max_num_seqs_ratio",
        "running_to_max_num_seqs_ratio",
        "Mean running requests / max_num_seqs.",
        _running_to_max,
    ),
)


def _histogram(name: str) -> tuple[str, ...]:
    return tuple(name + suffix for suffix in HISTOGRAM_SUFFIXES)


# The vLLM samples (today's names) that SIGNALS and the vLLM source's facts read: the source parses
# only these (a real page's other ~half is skipped before the parser). Checked against what replaying the
# real captures reads (tests/unit/test_vllm_names.py): a sample a signal reads is never skipped.
VLLM_SAMPLES_READ: frozenset[str] = frozenset(
    (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_swapped",  # v0's only: the engine generation
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_decode_time_seconds_sum",
        *_histogram("vllm:time_to_first_token_seconds"),
        *_histogram("vllm:inter_token_latency_seconds"),
        *_histogram("vllm:request_queue_time_seconds"),
        *_histogram("vllm:request_prefill_time_seconds"),
        *_histogram("vllm:e2e_request_latency_seconds"),
        *_histogram("vllm:request_prompt_tokens"),
        *_histogram("vllm:request_generation_tokens"),
        *_histogram("vllm:iteration_tokens_total"),
    )
)


# ---------------------------------------------------------------------------------------------
# GPU signals (layer 3), per GPU scope `gpu:<index>`; the aggregate (scope "all") averages the
# watched GPUs frame by frame. Exported as vllm_triage_gpu_window_<family>{gpu,...}.

# Gen -> GB/s per lane per direction (DIAGNOSIS.md)
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
BUSY_UTILIZATION = 0.5  # util.gpu at or above which a GPU counts as busy (PCIe links downtrain at idle)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _frames(ctx: SignalContext, names: tuple[str, ...], reason: str | None = None) -> list[dict[str, float]]:
    """Per frame: each name's value, averaged over the scope's GPUs; frames lacking one are skipped."""
    rows = []
    for frame in ctx.view.frames:
        row = {}
        for name in names:
            values = [s.value for s in frame.series(name, ctx.scope) if reason is None or _label(s.labels, "reason") == reason]
            if not values:
                break
            row[name] = _mean(values)
        else:
            rows.append(row)
    return rows


def _gpu_stat(metric: str, stat: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points(metric, ctx.scope, _mean)
        if not points:
            return None
        if stat == "mean":
            return _mean(points)
        if stat == "cv":  # coefficient of variation: how much utilisation swings
            mean = _mean(points)
            return math.sqrt(_mean([(p - mean) ** 2 for p in points])) / mean if mean > 0 and len(points) > 1 else 0.0
        return min(points) if stat == "min" else max(points)

    return compute


def _sm_activity(ctx: SignalContext) -> float | None:
    """SM active from GPM when present; util.gpu otherwise (gpu_sm_activity_from_gpm says which)."""
    gpm = ctx.values.get("gpu_sm_active_ratio_mean")
    return gpm if gpm is not None else ctx.values.get("gpu_utilization_ratio_mean")


def _sm_activity_from_gpm(ctx: SignalContext) -> float | None:
    if ctx.values.get("gpu_utilization_ratio_mean") is None and ctx.values.get("gpu_sm_active_ratio_mean") is None:
        return None
    return 1.0 if ctx.values.get("gpu_sm_active_ratio_mean") is not None else 0.0


def _pcie_capacity(ctx: SignalContext) -> float | None:
    rows = _frames(ctx, ("gpu_pcie_link_generation", "gpu_pcie_link_width"))
    if not rows:
        return None
    row = rows[-1]
    per_lane = PCIE_LANE_BYTES_PER_SECOND.get(round(row["gpu_pcie_link_generation"]))
    return per_lane * row["gpu_pcie_link_width"] if per_lane else None


def _pcie_busiest_direction_ratio(ctx: SignalContext) -> float | None:
    capacity = ctx.values.get("gpu_pcie_link_capacity_bytes_per_second")
    tx = ctx.view.gauge_points("gpu_pcie_tx_bytes_per_second", ctx.scope, _mean)
    rx = ctx.view.gauge_points("gpu_pcie_rx_bytes_per_second", ctx.scope, _mean)
    if not capacity or not (tx or rx):
        return None
    return max(_mean(tx) if tx else 0.0, _mean(rx) if rx else 0.0) / capacity


def _link_degraded_while_busy(ctx: SignalContext) -> float | None:
    """Share of busy frames in which the link ran below its maximum generation or width."""
    names = ("gpu_utilization_ratio", "gpu_pcie_link_generation", "gpu_pcie_link_generation_max", "gpu_pcie_link_width", "gpu_pcie_link_width_max")
    busy = [r for r in _frames(ctx, names) if r["gpu_utilization_ratio"] >= BUSY_UTILIZATION]
    if not busy:
        return None
    degraded = [r for r in busy if r["gpu_pcie_link_generation"] < r["gpu_pcie_link_generation_max"] or r["gpu_pcie_link_width"] < r["gpu_pcie_link_width_max"]]
    return len(degraded) / len(busy)


def _busy_ratio(ctx: SignalContext) -> float | None:
    points = ctx.view.gauge_points("gpu_utilization_ratio", ctx.scope, _mean)
    return sum(1 for p in points if p >= BUSY_UTILIZATION) / len(points) if points else None


def _throttled_ratio(ctx: SignalContext) -> float | None:
    """Share of the window with a hardware/thermal brake set (SW power cap alone is normal at full load)."""
    per_reason = [_frames(ctx, ("gpu_clock_event_active",), reason) for reason in THROTTLE_REASONS]
    frames = max((len(rows) for rows in per_reason), default=0)
    if frames == 0:
        return None
    braked = [max(rows[i]["gpu_clock_event_active"] if i < len(rows) else 0.0 for rows in per_reason) for i in range(frames)]
    return _mean(braked)


def _reason_ratio(reason: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        rows = _frames(ctx, ("gpu_clock_event_active",), reason)
        return _mean([r["gpu_clock_event_active"] for r in rows]) if rows else None

    return compute


def _power_to_limit(ctx: SignalContext) -> float | None:
    rows = _frames(ctx, ("gpu_power_watts", "gpu_power_limit_watts"))
    rows = [r for r in rows if r["gpu_power_limit_watts"] > 0]
    return _mean([r["gpu_power_watts"] / r["gpu_power_limit_watts"] for r in rows]) if rows else None


def _gpu_stats(metric: str, family: str, what: str, stats: tuple[str, ...] = ("mean", "min", "max")) -> list[SignalDef]:
    return [SignalDef(f"{metric}_{stat}", family, f"{what}, {stat} over the window.", _gpu_stat(metric, stat), (("stat", stat),)) for stat in stats]


GPU_SIGNALS: tuple[SignalDef, ...] = (
    *_gpu_stats("gpu_utilization_ratio", "utilization_ratio", "util.gpu: share of time a kernel ran (0..1)", ("mean", "min", "max", "cv")),
    *_gpu_stats("gpu_sm_active_ratio", "sm_active_ratio", "GPM SM activity (0..1)", ("mean",)),
    *_gpu_stats("gpu_sm_occupancy_ratio", "sm_occupancy_ratio", "GPM SM occupancy (0..1)", ("mean",)),
    *_gpu_stats("gpu_tensor_active_ratio", "tensor_active_ratio", "GPM tensor-core activity (0..1)", ("mean",)),
    *_gpu_stats("gpu_dram_bandwidth_utilization_ratio", "dram_bandwidth_utilization_ratio", "GPM DRAM bandwidth utilisation (0..1)", ("mean",)),
    SignalDef("gpu_sm_activity_ratio", "sm_activity_ratio", "SM activity: GPM SM active, or util.gpu where GPM is missing.", _sm_activity),
    SignalDef(
        "gpu_sm_activity_from_gpm",
        "sm_activity_from_gpm",
        "1 when gpu_sm_activity_ratio comes from GPM, 0 for the util.gpu fallback.",
        _sm_activity_from_gpm,
    ),
    SignalDef(
        "gpu_pcie_link_capacity_bytes_per_second",
        "pcie_link_capacity_bytes_per_second",
        "PCIe capacity per direction at the current link generation and width.",
        _pcie_capacity,
    ),
    SignalDef(
        "gpu_pcie_busiest_direction_ratio",
        "pcie_busiest_direction_ratio",
        "Mean PCIe throughput of the busier direction / link capacity.",
        _pcie_busiest_direction_ratio,
    ),
    SignalDef("gpu_busy_ratio", "busy_ratio", "Share of the window with util.gpu >= 0.5.", _busy_ratio),
    SignalDef(
        "gpu_pcie_link_degraded_while_busy_ratio",
        "pcie_link_degraded_while_busy_ratio",
        "Share of busy samples with the PCIe link below its maximum generation or width.",
        _link_degraded_while_busy,
    ),
    SignalDef("gpu_throttled_ratio", "throttled_ratio", "Share of the window with HW slowdown, thermal or power-brake clock events.", _throttled_ratio),
    *(
        SignalDef(
            f"gpu_clock_event_{reason}_ratio",
            "clock_event_ratio",
            f"Share of the window with clock event reason {reason}.",
            _reason_ratio(reason),
            (("reason", reason),),
        )
        for reason in ("sw_power_cap", *THROTTLE_REASONS)
    ),
    SignalDef("gpu_power_to_limit_ratio", "power_to_limit_ratio", "Power draw / enforced power limit, mean.", _power_to_limit),
)


# ---------------------------------------------------------------------------------------------
# Host signals (layer 3): per role of vLLM's processes, exported as vllm_triage_process_window_<family>{role}.
ROLES = ("api_server", "engine_core", "worker")


def _role_cpu_cores(role: str) -> Callable[[SignalContext], float | None]:
    return lambda ctx: ctx.view.rate("process_cpu_seconds_total", f"role:{role}")


def _role_busiest_thread(role: str) -> Callable[[SignalContext], float | None]:
    """Window mean of the busiest thread's share of one core (1.0 = a saturated core)."""

    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points("process_busiest_thread_cpu_ratio", f"role:{role}", max)
        return _mean(points) if points else None

    return compute


def _cgroup_throttled_ratio(ctx: SignalContext) -> float | None:
    return _ratio(ctx.view.increase("process_cgroup_throttled_periods_total", ctx.scope), ctx.view.increase("process_cgroup_periods_total", ctx.scope))


HOST_SIGNALS: tuple[SignalDef, ...] = (
    *(SignalDef(f"host_{role}_cpu_cores", "cpu_cores", "CPU of the role's processes, in cores.", _role_cpu_cores(role), (("role", role),)) for role in ROLES),
    *(
        SignalDef(
            f"host_{role}_busiest_thread_cpu_ratio",
            "busiest_thread_cpu_ratio",
            "The role's busiest thread, share of one core (1.0 = saturated), window mean.",
            _role_busiest_thread(role),
            (("role", role),),
        )
        for role in ROLES
    ),
    SignalDef(
        "host_cgroup_throttled_ratio",
        "cgroup_throttled_ratio",
        "Share of CPU periods in which vLLM's container was throttled by its CPU limit.",
        _cgroup_throttled_ratio,
        (("role", "api_server"),),
    ),
)


def _role_gil_held(role: str) -> Callable[[SignalContext], float | None]:
    """The latest py-spy window's GIL-held ratio (windows are seconds long and minutes apart)."""

    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points("gil_held_ratio", f"role:{role}", max)
        return points[-1] if points else None

    return compute


GIL_SIGNALS: tuple[SignalDef, ...] = tuple(
    SignalDef(
        f"host_{role}_gil_held_ratio",
        "gil_held_ratio",
        "Share of the latest py-spy window in which a thread of the role's process held the GIL.",
        _role_gil_held(role),
        (("role", role),),
    )
    for role in ("api_server", "engine_core")
)


def compute_signals(view: WindowView, scope: str, max_num_seqs: int | None, table: tuple[SignalDef, ...] = SIGNALS) -> dict[str, float | None]:
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
