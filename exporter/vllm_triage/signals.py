"""Window math and the table of layer-1 signals. Pure functions of the store and the clock.

A signal value of None means "cannot be computed" (metric absent, fewer than two frames in the
window, no observations for a quantile); conditions turn that into `unknown` or say why not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .model import VLLM_SOURCE, Labels
from .store import Frame, Store, in_scope


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
        return histogram_quantile(q, self.buckets) if self.count > 0 else None

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

    def scopes(self) -> list[str]:
        if not self.frames:
            return []
        seen = {s.scope for series in self.frames[-1].by_name.values() for s in series}
        named = {scope for scope in seen if not scope.startswith("/")}
        return sorted(named or seen)

    def has(self, name: str) -> bool:
        return any(name in frame.by_name for frame in self.frames)

    def gauge_points(self, name: str, scope: str, combine: Callable[[list[float]], float] = sum) -> list[float]:
        """One value per frame: the scope's series combined (summed, or the max for ratios)."""
        key = ("gauge", name, scope, combine)
        cached = self._cache.get(key)
        if cached is None:
            points: list[float] = []
            for frame in self.frames:
                values = [s.value for s in frame.by_name.get(name, ()) if in_scope(s.scope, scope)]
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
            for s in frame.by_name.get(name, ()):
                if in_scope(s.scope, scope) and (where is None or where(s.labels)):
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
                for s in frame.by_name.get(name + "_bucket", ()):
                    if in_scope(s.scope, scope):
                        le = _label(s.labels, "le")
                        if le is None:
                            continue
                        per_bucket.setdefault(s.labels, []).append((frame.timestamp, s.value))
                        bound_of[s.labels] = float(le)
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
            for s in frame.by_name.get(name, ()):
                if in_scope(s.scope, scope):
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
    return _ratio(running * (prompt + generated / 2), usage * capacity)


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
            (("quantile", str(q)),),
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
        "kv_live_token_ratio",
        "kv_live_token_ratio",
        "Tokens the running requests hold (running x (mean prompt + mean output / 2)) / KV tokens in use.",
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

SIGNAL_IDS = frozenset(s.id for s in SIGNALS)


def compute_signals(view: WindowView, scope: str, max_num_seqs: int | None) -> dict[str, float | None]:
    """Every signal of the table for one scope, in table order (later ones may read earlier ones)."""
    values: dict[str, float | None] = {}
    ctx = SignalContext(view, scope, max_num_seqs, values)
    for signal in SIGNALS:
        value = signal.compute(ctx)
        values[signal.id] = None if value is None or math.isnan(value) else value
    return values


def vllm_window(store: Store, now: float, window_seconds: float) -> WindowView:
    return WindowView(store.window(VLLM_SOURCE, now - window_seconds, now))
