"""Layer-1 signals: vLLM's own metrics, per engine (scope `model/engine`), and the samples they read.
Each is exported as `vllm_triage_vllm_<family>` with its extra label(s), per engine (labels engine,
model_name); the aggregate is shown in /diagnosis."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..model import HISTOGRAM_SUFFIXES, Labels
from .window import SignalContext, SignalDef, label_value, reads, safe_ratio

CACHE_CONFIG = "vllm:cache_config_info"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"


def _histogram(name: str) -> tuple[str, ...]:
    return tuple(name + suffix for suffix in HISTOGRAM_SUFFIXES)


def _gauge_stat(metric: str, stat: str, combine: Callable[[list[float]], float] = sum) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points(metric, ctx.scope, combine)
        if not points:
            return None
        if stat == "mean":
            return sum(points) / len(points)
        return min(points) if stat == "min" else max(points)

    return reads(metric)(compute)


def _rate(metric: str, where: Callable[[Labels], bool] | None = None) -> Callable[[SignalContext], float | None]:
    return reads(metric)(lambda ctx: ctx.view.rate(metric, ctx.scope, where))


def _quantile(metric: str, q: float) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        hist = ctx.view.histogram(metric, ctx.scope)
        return hist.quantile(q) if hist else None

    return reads(*_histogram(metric))(compute)


def _hist_mean(metric: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        hist = ctx.view.histogram(metric, ctx.scope)
        return hist.mean() if hist else None

    return reads(*_histogram(metric))(compute)


def _observations(metric: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        hist = ctx.view.histogram(metric, ctx.scope)
        return hist.count if hist else None

    return reads(*_histogram(metric))(compute)


def _is_error(labels: Labels) -> bool:
    return label_value(labels, "finished_reason") == "error"


@reads("vllm:request_success_total")
def _error_ratio(ctx: SignalContext) -> float | None:
    errors = ctx.view.increase("vllm:request_success_total", ctx.scope, _is_error)
    finished = ctx.view.increase("vllm:request_success_total", ctx.scope)
    if finished is None:
        return None
    return safe_ratio(errors or 0.0, finished) if finished > 0 else 0.0


@reads("vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum")
def _prefill_share(ctx: SignalContext) -> float | None:
    prefill = ctx.view.increase("vllm:request_prefill_time_seconds_sum", ctx.scope)
    decode = ctx.view.increase("vllm:request_decode_time_seconds_sum", ctx.scope)
    if prefill is None or decode is None:
        return None
    return safe_ratio(prefill, prefill + decode)


@reads("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
def _prefix_hit_ratio(ctx: SignalContext) -> float | None:
    return safe_ratio(
        ctx.view.increase("vllm:prefix_cache_hits_total", ctx.scope),
        ctx.view.increase("vllm:prefix_cache_queries_total", ctx.scope),
    )


@reads("vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total")
def _prompt_tokens_cached_ratio(ctx: SignalContext) -> float | None:
    """Share of prompt tokens served from a cache (local prefix cache and external KV connectors), where
    vLLM counts them (vllm:prompt_tokens_cached_total, since ~0.11)."""
    return safe_ratio(ctx.view.increase("vllm:prompt_tokens_cached_total", ctx.scope), ctx.view.increase("vllm:prompt_tokens_total", ctx.scope))


PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # vllm:prompt_tokens_by_source_total{source}


def _prompt_share(source: str) -> Callable[[SignalContext], float | None]:
    """Share of the window's prompt tokens that came from one source (computed here, a local cache hit, a KV transfer)."""

    def of(labels: Labels) -> bool:  # made once: the per-frame steps are memoized by this function
        return label_value(labels, "source") == source

    def compute(ctx: SignalContext) -> float | None:
        return safe_ratio(
            ctx.view.increase("vllm:prompt_tokens_by_source_total", ctx.scope, of), ctx.view.increase("vllm:prompt_tokens_by_source_total", ctx.scope)
        )

    return reads("vllm:prompt_tokens_by_source_total")(compute)


def _hit_ratio(hits: str, queries: str) -> Callable[[SignalContext], float | None]:
    return reads(hits, queries)(lambda ctx: safe_ratio(ctx.view.increase(hits, ctx.scope), ctx.view.increase(queries, ctx.scope)))


@reads(WAITING)
def _waiting_nonempty_ratio(ctx: SignalContext) -> float | None:
    """Share of the window's readings in which requests waited. Under KV thrash vLLM's gauges collapse to 0 at
    single scrapes while the queue stays long: a queue is non-empty for a share of the window, not at every
    reading (its minimum says nothing then)."""
    points = ctx.view.gauge_points(WAITING, ctx.scope)
    return sum(1 for p in points if p > 0) / len(points) if points else None


def _waiting_for(reason: str) -> Callable[[SignalContext], float | None]:
    """Mean requests waiting for one reason (vllm:num_requests_waiting_by_reason: capacity | deferred)."""

    def compute(ctx: SignalContext) -> float | None:
        points = [
            sum(s.value for s in series if label_value(s.labels, "reason") == reason)
            for frame in ctx.view.frames
            if (series := frame.series("vllm:num_requests_waiting_by_reason", ctx.scope))
        ]
        return sum(points) / len(points) if points else None

    return reads("vllm:num_requests_waiting_by_reason")(compute)


SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


@reads(SPEC_ACCEPTED, SPEC_DRAFT_TOKENS)
def _spec_acceptance(ctx: SignalContext) -> float | None:
    return safe_ratio(ctx.view.increase(SPEC_ACCEPTED, ctx.scope), ctx.view.increase(SPEC_DRAFT_TOKENS, ctx.scope))


@reads(SPEC_ACCEPTED, SPEC_DRAFTS)
def _spec_tokens_per_draft(ctx: SignalContext) -> float | None:
    """Tokens each verification step yields: the accepted draft tokens plus the one the target model adds."""
    accepted = safe_ratio(ctx.view.increase(SPEC_ACCEPTED, ctx.scope), ctx.view.increase(SPEC_DRAFTS, ctx.scope))
    return None if accepted is None else 1.0 + accepted


@reads("vllm:num_preemptions_total", "vllm:request_success_total")
def _preempted_per_finished(ctx: SignalContext) -> float | None:
    # Counted against at least one request: preemptions while nothing finishes is a storm too.
    preemptions = ctx.view.increase("vllm:num_preemptions_total", ctx.scope)
    finished = ctx.view.increase("vllm:request_success_total", ctx.scope)
    if preemptions is None or finished is None:
        return None
    return preemptions / max(finished, 1.0)


def _cache_config(ctx: SignalContext) -> dict[str, str] | None:
    return ctx.view.latest_labels(CACHE_CONFIG, ctx.scope)


def _int_label(labels: dict[str, str] | None, key: str) -> float | None:
    if not labels:
        return None
    try:
        return float(int(labels[key]))
    except (KeyError, ValueError):
        return None


@reads(CACHE_CONFIG)
def _block_size(ctx: SignalContext) -> float | None:
    return _int_label(_cache_config(ctx), "block_size")


@reads(CACHE_CONFIG)
def _kv_capacity_tokens(ctx: SignalContext) -> float | None:
    labels = _cache_config(ctx)
    tokens = _int_label(labels, "kv_cache_size_tokens")
    if tokens is not None:
        return tokens
    blocks = _int_label(labels, "num_gpu_blocks")
    size = _int_label(labels, "block_size")
    return blocks * size if blocks is not None and size is not None else None


@reads(CACHE_CONFIG)
def _one_block_below_full(ctx: SignalContext) -> float | None:
    """KV usage with one block free: usage moves in steps of one block (of num_gpu_blocks - 1 usable:
    vLLM keeps one null block), so a saturated small cache may never be sampled at exactly 1.0."""
    blocks = _int_label(_cache_config(ctx), "num_gpu_blocks")
    return 1.0 - 1.0 / (blocks - 1) if blocks is not None and blocks > 2 else None


def _latest_total(metric: str, where: Callable[[Labels], bool] | None = None) -> Callable[[SignalContext], float | None]:
    """A counter's value in the newest frame that has it (since the server started), over the series `where` keeps."""

    def compute(ctx: SignalContext) -> float | None:
        for frame in reversed(ctx.view.frames):
            if metric not in frame.by_name:  # many versions export none of it: each frame is asked in a dict, not a scope
                continue
            values = [s.value for s in frame.series(metric, ctx.scope) if where is None or where(s.labels)]
            if values:
                return sum(values)
        return None

    return reads(metric)(compute)


# KV offloading (vLLM's OffloadingConnector: --kv-offloading-size, or --kv-transfer-config): bytes moved each way between
# the GPU's KV cache and the offload tier (CPU memory). vLLM 0.26 exports them under both names: the per-direction
# counters, and a deprecated one by transfer_type.
OFFLOAD_BYTES = {"store": "vllm:kv_offload_store_bytes_total", "load": "vllm:kv_offload_load_bytes_total"}
OFFLOAD_BYTES_BY_TYPE = "vllm:kv_offload_total_bytes_total"
OFFLOAD_HELP = (
    "KV cache bytes moved per second between the GPU and the offload tier (CPU memory): direction store (out of the GPU), "
    "load (back into it: a prompt's blocks found there)."
)


# The deprecated counter's series of each direction.
_BY_TYPE: dict[str, Callable[[Labels], bool]] = {
    "store": lambda labels: label_value(labels, "transfer_type") == "GPU_to_CPU",
    "load": lambda labels: label_value(labels, "transfer_type") == "CPU_to_GPU",
}


def _offload_rate(direction: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        rate = ctx.view.rate(OFFLOAD_BYTES[direction], ctx.scope)
        return rate if rate is not None else ctx.view.rate(OFFLOAD_BYTES_BY_TYPE, ctx.scope, _BY_TYPE[direction])

    return reads(OFFLOAD_BYTES[direction], OFFLOAD_BYTES_BY_TYPE)(compute)


_LOADS_TODAY, _LOADS_DEPRECATED = _latest_total(OFFLOAD_BYTES["load"]), _latest_total(OFFLOAD_BYTES_BY_TYPE, _BY_TYPE["load"])


@reads(OFFLOAD_BYTES["load"], OFFLOAD_BYTES_BY_TYPE)
def _offload_loads_since_start(ctx: SignalContext) -> float | None:
    """Bytes loaded back from the offload tier since vLLM started (the counter's newest value)."""
    today = _LOADS_TODAY(ctx)
    return today if today is not None else _LOADS_DEPRECATED(ctx)


@reads(CACHE_CONFIG)
def _kv_offload_gib(ctx: SignalContext) -> float | None:
    """The KV offloading size vLLM was started with (--kv-offloading-size, GiB; cache_config_info): 0 when off."""
    labels = _cache_config(ctx)
    if not labels or "kv_offloading_size" not in labels:
        return None
    return _float_label(labels, "kv_offloading_size") or 0.0


@reads(CACHE_CONFIG)
def _prefix_caching_enabled(ctx: SignalContext) -> float | None:
    labels = _cache_config(ctx)
    if not labels or "enable_prefix_caching" not in labels:
        return None
    return 1.0 if labels["enable_prefix_caching"].lower() == "true" else 0.0


def _max_num_seqs(ctx: SignalContext) -> float | None:
    return float(ctx.facts.max_num_seqs) if ctx.facts.max_num_seqs else None


@reads(*_histogram("vllm:iteration_tokens_total"))
def _steps_per_second(ctx: SignalContext) -> float | None:
    """Engine steps per second: each step observes vllm:iteration_tokens_total once. A counter does not collapse
    between scrapes as the gauges do, and stands still only when the engine does not step."""
    hist = ctx.view.histogram("vllm:iteration_tokens_total", ctx.scope)
    span = ctx.view.span_seconds if len(ctx.view.frames) >= 2 else 0.0
    return hist.count / span if hist is not None and span > 0 else None


@reads(*_histogram("vllm:iteration_tokens_total"))
def _step_seconds_recent(ctx: SignalContext) -> float | None:
    """Mean wall time per engine step over the window's last RECENT_SECONDS, while it steps: under a load that grew
    within the window, the steps most tokens streamed in are longer than the window's mean step."""
    recent = ctx.view.recent() if ctx.view.frames else None
    if recent is None or recent.span_seconds <= 0:
        return None
    steps = recent.increase("vllm:iteration_tokens_total_count", ctx.scope)
    return recent.span_seconds / steps if steps else None


def _ttft_outside_engine(ctx: SignalContext) -> float | None:
    """Mean TTFT less vLLM's own mean queue and prefill times: the time spent before the engine core saw the request
    (the API server tokenising, its event loop, the input queue). vLLM measures TTFT from the API server's arrival."""
    ttft, queue, prefill = (ctx.values.get(f"{name}_seconds_mean") for name in ("ttft", "queue_time", "prefill_time"))
    if ttft is None or queue is None or prefill is None:
        return None
    return max(0.0, ttft - queue - prefill)


def _running_to_max(ctx: SignalContext) -> float | None:
    return safe_ratio(ctx.values.get("requests_running_mean"), ctx.values.get("max_num_seqs"))


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
    ratio = safe_ratio(running * (prompt + generated / 2), usage * capacity)
    return None if ratio is None else min(ratio, 1.0)


def _float_label(labels: dict[str, str] | None, key: str) -> float | None:
    try:
        return float(labels[key]) if labels else None
    except (KeyError, ValueError):
        return None


@reads(CACHE_CONFIG)
def _gpu_memory_utilization(ctx: SignalContext) -> float | None:
    return _float_label(_cache_config(ctx), "gpu_memory_utilization")


@reads(CACHE_CONFIG)
def _kv_bytes_per_token(ctx: SignalContext) -> float | None:
    labels = _cache_config(ctx)
    return safe_ratio(_float_label(labels, "kv_cache_memory_bytes"), _float_label(labels, "kv_cache_size_tokens"))


@reads(CACHE_CONFIG)
def _requests_that_fit(ctx: SignalContext) -> float | None:
    """Requests of the observed mean length (prompt + output, from the finished ones) whose KV blocks fit in
    the cache at once: usable blocks / blocks per request (by tokens where the block count is unknown)."""
    v = ctx.values
    prompt, generated, capacity, block = v.get("prompt_tokens_mean"), v.get("generation_tokens_mean"), v.get("kv_capacity_tokens"), v.get("block_size_tokens")
    if prompt is None or generated is None or capacity is None or prompt + generated <= 0:
        return None
    blocks = _int_label(_cache_config(ctx), "num_gpu_blocks")
    if blocks is not None and block:
        return float((int(blocks) - 1) // math.ceil((prompt + generated) / block))  # vLLM keeps one null block
    return float(int(capacity // (prompt + generated)))


def _headroom(ctx: SignalContext) -> float | None:
    """How much more load the server takes, 0..1: 0 while requests wait (it is saturated whatever else
    says); else the smaller of the KV cache's free share and the free share of max_num_seqs (window means)."""
    v = ctx.values
    waiting, usage, running = v.get("requests_waiting_mean"), v.get("kv_cache_usage_ratio_mean"), v.get("running_to_max_num_seqs_ratio")
    if waiting is None or usage is None:
        return None
    if waiting > 0:
        return 0.0
    return max(0.0, min(1.0 - usage, 1.0 - running if running is not None else 1.0))


def _kv_last_block_waste_ratio(ctx: SignalContext) -> float | None:
    """Half a block per running request is empty on average: that waste as a share of capacity."""
    v = ctx.values
    running, block, capacity = v.get("requests_running_mean"), v.get("block_size_tokens"), v.get("kv_capacity_tokens")
    if running is None or block is None or capacity is None:
        return None
    return safe_ratio(running * block / 2, capacity)


TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def _token_steps(ctx: SignalContext) -> list[bool] | None:
    """Per step from one frame to the next: whether the engine produced a token (prompt tokens count when
    a request's prefill completes, generated tokens each decode step)."""
    steps = [ctx.view.step_increases(name, ctx.scope) for name in TOKEN_COUNTERS]
    known = [s for s in steps if s is not None]
    if not known or len(ctx.view.frames) < 2:
        return None
    return [any(s[i] > 0 for s in known) for i in range(len(ctx.view.frames) - 1)]


@reads(*TOKEN_COUNTERS)
def _seconds_since_last_token(ctx: SignalContext) -> float | None:
    """From the newest reading back to the last one that saw the token counters rise; the window's span
    when none did in it (at least that long)."""
    produced = _token_steps(ctx)
    if produced is None:
        return None
    frames = ctx.view.frames
    last = next((i + 1 for i in range(len(produced) - 1, -1, -1) if produced[i]), 0)
    return frames[-1].timestamp - frames[last].timestamp


def _pending(ctx: SignalContext, index: int) -> float:
    frame = ctx.view.frames[index]
    return sum(s.value for name in (RUNNING, WAITING) for s in frame.series(name, ctx.scope))


def _stall(ctx: SignalContext) -> tuple[float, float] | None:
    """(seconds, requests) of the stall up to the newest reading: since the earliest reading after the token
    counters (or the preemptions counter) last rose in which requests were pending that neither finished since nor
    left the later readings' counts, or from which on every reading had requests pending, and how many are unfinished."""
    produced = _token_steps(ctx)
    if produced is None:
        return None
    # A preemption is the scheduler at work: a KV thrash recomputing its preempted requests may produce no token for
    # a while (a 2-core CPU build, two servers saturated), but a hung engine preempts nothing. An engine step is work
    # too: a long prompt's prefill chunks step for seconds before its first token counts; a hung engine does not step.
    preempted = ctx.view.step_increases("vllm:num_preemptions_total", ctx.scope) or [0.0] * len(produced)
    stepped = ctx.view.step_increases("vllm:iteration_tokens_total_count", ctx.scope) or [0.0] * len(produced)
    frames = ctx.view.frames
    start = next((i + 1 for i in range(len(produced) - 1, -1, -1) if produced[i] or preempted[i] > 0 or stepped[i] > 0), 0)
    finished = ctx.view.step_increases("vllm:request_success_total", ctx.scope) or [0.0] * len(produced)
    stuck_at, stuck = None, 0.0
    finished_after = 0.0
    busy = True  # every reading from here to the newest had requests pending (the engine stood still with work)
    # Still in flight: at most what each later reading counted pending, less what finished after it. vLLM's counts come
    # only from the engine core's scheduler: a hung engine core sends none (its gauges stand still), so counts that fell
    # without as many finishes are requests a live scheduler dropped: clients that went away, whose aborts vLLM does not
    # count as finished (request_success_total{finished_reason="abort"} stays 0: vllm-project/vllm#31503).
    ceiling = math.inf
    for index in range(len(frames) - 1, start - 1, -1):  # newest first: the finishes after each reading accumulate
        pending = _pending(ctx, index)
        busy = busy and pending > 0
        ceiling = min(ceiling, pending - finished_after)
        left = ceiling
        if left > 0 or busy:
            stuck_at, stuck = index, max(stuck, left)
        if index > 0:
            finished_after += finished[index - 1]
    return (0.0, 0.0) if stuck_at is None else (frames[-1].timestamp - frames[stuck_at].timestamp, stuck)


@reads(RUNNING, WAITING)
def _requests_pending_latest(ctx: SignalContext) -> float | None:
    """Running plus waiting in the newest reading: frozen at their last values while the engine core is hung (it sends
    no new counts), what it counts again once it runs."""
    return _pending(ctx, len(ctx.view.frames) - 1) if ctx.view.frames else None


# What _stall reads: tokens, preemptions, engine steps and finishes step by step, and the requests pending.
_STALL_READS = (*TOKEN_COUNTERS, "vllm:num_preemptions_total", "vllm:iteration_tokens_total_count", "vllm:request_success_total", RUNNING, WAITING)


@reads(*_STALL_READS)
def _seconds_stalled(ctx: SignalContext) -> float | None:
    stall = ctx.view.once(("stall", ctx.scope), lambda: _stall(ctx))
    return None if stall is None else stall[0]


@reads(*_STALL_READS)
def _requests_stalled(ctx: SignalContext) -> float | None:
    stall = ctx.view.once(("stall", ctx.scope), lambda: _stall(ctx))
    return None if stall is None else stall[1]


FLOPS = "vllm:estimated_flops_per_gpu_total"
BYTES = ("vllm:estimated_read_bytes_per_gpu_total", "vllm:estimated_write_bytes_per_gpu_total")


def _estimated(metrics: tuple[str, ...]) -> Callable[[SignalContext], float | None]:
    """vLLM's estimate per GPU per second (--enable-mfu-metrics); None when vLLM does not fill it (its
    counters read 0 since the start: the flag is off)."""

    def compute(ctx: SignalContext) -> float | None:
        if not any(_latest_total(metric)(ctx) for metric in metrics):
            return None
        rates = [ctx.view.rate(metric, ctx.scope) for metric in metrics]
        return None if None in rates else sum(r for r in rates if r is not None)

    return reads(*metrics)(compute)


def _model_flops_utilization(ctx: SignalContext) -> float | None:
    return safe_ratio(ctx.values.get("model_flops_per_second"), ctx.facts.peak_flops_per_second)


def _model_bandwidth_utilization(ctx: SignalContext) -> float | None:
    return safe_ratio(ctx.values.get("model_memory_bytes_per_second"), ctx.facts.peak_memory_bytes_per_second)


def _arithmetic_intensity(ctx: SignalContext) -> float | None:
    return safe_ratio(ctx.values.get("model_flops_per_second"), ctx.values.get("model_memory_bytes_per_second"))


def _roofline_memory_bound(ctx: SignalContext) -> float | None:
    """1 when the work's FLOPs per byte sit below the GPU's ridge point (peak FLOP/s / peak bytes/s): the
    memory roof bounds it (decode); 0 when the compute roof does (prefill)."""
    intensity, ridge = (
        ctx.values.get("model_arithmetic_intensity_flops_per_byte"),
        safe_ratio(ctx.facts.peak_flops_per_second, ctx.facts.peak_memory_bytes_per_second),
    )
    return None if intensity is None or ridge is None else float(intensity < ridge)


def _roofline_attainment(ctx: SignalContext) -> float | None:
    """Model FLOP/s / what the roofline allows at the work's intensity (min(peak FLOP/s, intensity x peak
    bytes/s)): how close the server runs to its ceiling, whichever roof it is under."""
    intensity, peak, bandwidth = (
        ctx.values.get("model_arithmetic_intensity_flops_per_byte"),
        ctx.facts.peak_flops_per_second,
        ctx.facts.peak_memory_bytes_per_second,
    )
    if intensity is None or peak is None or bandwidth is None:
        return None
    return safe_ratio(ctx.values.get("model_flops_per_second"), min(peak, intensity * bandwidth))


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


VLLM_SIGNALS: tuple[SignalDef, ...] = (
    *_stats(RUNNING, "requests_running", "Requests running"),
    *_stats(WAITING, "requests_waiting", "Requests waiting"),
    *_stats("vllm:kv_cache_usage_perc", "kv_cache_usage_ratio", "KV cache usage (0..1)", max),
    SignalDef(
        "requests_waiting_nonempty_ratio",
        "requests_waiting_nonempty_ratio",
        "Share of the window's readings in which requests waited (a queue that a single zero reading does not empty).",
        _waiting_nonempty_ratio,
    ),
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
    SignalDef(
        "ttft_outside_engine_seconds_mean",
        "ttft_outside_engine_seconds_mean",
        "Mean TTFT less vLLM's mean queue and prefill times: seconds a request spends before the engine core sees it (the API server).",
        _ttft_outside_engine,
    ),
    SignalDef(
        "ttft_outside_engine_ratio",
        "ttft_outside_engine_ratio",
        "Share of the mean TTFT spent outside the engine (before its queue), 0..1.",
        lambda ctx: safe_ratio(ctx.values.get("ttft_outside_engine_seconds_mean"), ctx.values.get("ttft_seconds_mean")),
    ),
    SignalDef("prefill_time_share_ratio", "prefill_time_share_ratio", "Prefill time / (prefill + decode time).", _prefill_share),
    SignalDef("prefix_cache_hit_ratio", "prefix_cache_hit_ratio", "Prefix cache hits / queries.", _prefix_hit_ratio),
    SignalDef(
        "prompt_tokens_cached_ratio",
        "prompt_tokens_cached_ratio",
        "Share of prompt tokens served from a cache, local or external (vLLM 0.11+: vllm:prompt_tokens_cached_total).",
        _prompt_tokens_cached_ratio,
    ),
    *(
        SignalDef(
            f"prompt_tokens_{source}_ratio",
            "prompt_tokens_by_source_ratio",
            "Share of the window's prompt tokens by origin (vllm:prompt_tokens_by_source_total): computed here, a local cache hit, a KV transfer.",
            _prompt_share(source),
            (("source", source),),
        )
        for source in PROMPT_SOURCES
    ),
    SignalDef(
        "external_prefix_cache_hit_ratio",
        "external_prefix_cache_hit_ratio",
        "Hits / queries (tokens) of the external prefix cache shared across instances through a KV connector.",
        _hit_ratio("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"),
    ),
    SignalDef(
        "mm_cache_hit_ratio",
        "mm_cache_hit_ratio",
        "Hits / queries (items) of the multimodal input cache.",
        _hit_ratio("vllm:mm_cache_hits_total", "vllm:mm_cache_queries_total"),
    ),
    SignalDef(
        "requests_waiting_capacity_mean",
        "requests_waiting_by_reason_mean",
        "Requests waiting for scheduling capacity (KV blocks, batch slots), window mean (vLLM 0.26+).",
        _waiting_for("capacity"),
        (("reason", "capacity"),),
    ),
    SignalDef(
        "requests_waiting_deferred_mean",
        "requests_waiting_by_reason_mean",
        "Requests deferred by a transient constraint (LoRA budget, KV transfer, grammar compilation), window mean (vLLM 0.26+).",
        _waiting_for("deferred"),
        (("reason", "deferred"),),
    ),
    SignalDef(
        "spec_decode_drafts_per_second",
        "spec_decode_drafts_per_second",
        "Speculative-decoding drafts proposed per second (vllm:spec_decode_num_drafts_total, where speculative decoding is on).",
        _rate(SPEC_DRAFTS),
    ),
    SignalDef(
        "spec_decode_acceptance_ratio",
        "spec_decode_acceptance_ratio",
        "Accepted / proposed draft tokens over the window.",
        _spec_acceptance,
    ),
    SignalDef(
        "spec_decode_tokens_per_draft",
        "spec_decode_tokens_per_draft",
        "Tokens each verification step yields (1 + accepted draft tokens per draft).",
        _spec_tokens_per_draft,
    ),
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
    SignalDef(
        "engine_steps_per_second",
        "engine_steps_per_second",
        "Engine steps per second (observations of vllm:iteration_tokens_total): 0 while the engine does not step.",
        _steps_per_second,
    ),
    SignalDef(
        "engine_step_seconds_mean",
        "engine_step_seconds_mean",
        "Mean wall time per engine step (1 / steps per second), while it steps.",
        lambda ctx: 1.0 / steps if (steps := ctx.values.get("engine_steps_per_second")) else None,
    ),
    SignalDef(
        "engine_step_seconds_recent",
        "engine_step_seconds_recent",
        "Mean wall time per engine step over the window's last 10 s, while it steps.",
        _step_seconds_recent,
    ),
    SignalDef(
        "max_num_batched_tokens",
        "max_num_batched_tokens",
        "vLLM's --max-num-batched-tokens, the token budget of a step (from its command line; absent when not given there).",
        lambda ctx: float(ctx.facts.max_num_batched_tokens) if ctx.facts.max_num_batched_tokens else None,
    ),
    SignalDef(
        "tokens_per_step_to_budget_ratio",
        "tokens_per_step_to_budget_ratio",
        "Mean tokens per step / --max-num-batched-tokens: near 1, every step is full and prompts wait for the budget.",
        lambda ctx: safe_ratio(ctx.values.get("tokens_per_step_mean"), ctx.values.get("max_num_batched_tokens")),
    ),
    SignalDef(
        "api_server_count",
        "api_servers",
        "vLLM's --api-server-count (1 when the command line does not set it; absent without the host view).",
        lambda ctx: float(ctx.facts.api_server_count) if ctx.facts.api_server_count else None,
    ),
    SignalDef(
        "cuda_graphs_enabled",
        "cuda_graphs_enabled",
        "1 when vLLM captures CUDA graphs, 0 when its command line turns them off (--enforce-eager, or cudagraph_mode NONE in "
        "--compilation-config); absent without the host view.",
        lambda ctx: None if ctx.facts.cuda_graphs is None else float(ctx.facts.cuda_graphs),
    ),
    SignalDef(
        "cpu_offload_gib",
        "cpu_offload_gib",
        "vLLM's --cpu-offload-gb: GiB of weights per GPU kept in host memory and read over PCIe at every forward pass (0 "
        "without the flag; absent without the host view).",
        lambda ctx: ctx.facts.cpu_offload_gib,
    ),
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
        "kv_offload_size_gib",
        "kv_offload_size_gib",
        "KV offloading size vLLM was started with (--kv-offloading-size, GiB; 0: off; absent before vLLM exports it).",
        _kv_offload_gib,
    ),
    SignalDef(
        "kv_offload_store_bytes_per_second",
        "kv_offload_bytes_per_second",
        OFFLOAD_HELP,
        _offload_rate("store"),
        (("direction", "store"),),
    ),
    SignalDef(
        "kv_offload_load_bytes_per_second",
        "kv_offload_bytes_per_second",
        OFFLOAD_HELP,
        _offload_rate("load"),
        (("direction", "load"),),
    ),
    SignalDef(
        "kv_offload_loads_since_start_bytes",
        "kv_offload_loads_since_start_bytes",
        "KV cache bytes loaded back from the offload tier since vLLM started: 0 means nothing offloaded was ever reused.",
        _offload_loads_since_start,
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
    SignalDef(
        "window_span_seconds",
        "window_span_seconds",
        "Seconds between the window's first and newest reading (shorter than the window while readings are missing).",
        lambda ctx: ctx.view.span_seconds if len(ctx.view.frames) >= 2 else None,
    ),
    SignalDef(
        "seconds_since_last_token",
        "seconds_since_last_token",
        "Seconds since the engine last produced a token (prompt or generated); the window's span when it produced none in the window.",
        _seconds_since_last_token,
    ),
    SignalDef(
        "seconds_stalled_with_requests_pending",
        "seconds_stalled_with_requests_pending",
        "Seconds for which requests seen pending (running or waiting) after the token counters last rose have neither finished nor "
        "left vLLM's later counts while no token was produced, nothing was preempted and the engine did not step; 0 when tokens "
        "flow, the engine steps, or nothing is pending.",
        _seconds_stalled,
    ),
    SignalDef(
        "requests_pending_latest",
        "requests_pending_latest",
        "Requests running plus waiting in the newest reading (frozen while the engine core is hung).",
        _requests_pending_latest,
    ),
    SignalDef(
        "requests_stalled",
        "requests_stalled",
        "Requests seen pending since the token counters last rose that have neither finished nor left vLLM's counts since.",
        _requests_stalled,
    ),
    SignalDef(
        "model_flops_per_second",
        "model_flops_per_second",
        "Model FLOPs per second per GPU, vLLM's estimate (needs vLLM's --enable-mfu-metrics).",
        _estimated((FLOPS,)),
    ),
    SignalDef(
        "model_memory_bytes_per_second",
        "model_memory_bytes_per_second",
        "Bytes read and written per second per GPU, vLLM's estimate (needs --enable-mfu-metrics).",
        _estimated(BYTES),
    ),
    SignalDef(
        "model_flops_utilization_ratio",
        "model_flops_utilization_ratio",
        "Model FLOPs utilization: model FLOP/s / the GPU's dense bf16 peak (hardware table by NVML's GPU name).",
        _model_flops_utilization,
    ),
    SignalDef(
        "model_bandwidth_utilization_ratio",
        "model_bandwidth_utilization_ratio",
        "Model bytes/s / the GPU's peak memory bandwidth.",
        _model_bandwidth_utilization,
    ),
    SignalDef(
        "model_arithmetic_intensity_flops_per_byte",
        "model_arithmetic_intensity_flops_per_byte",
        "Model FLOPs per byte of memory traffic (below the GPU's ridge point: bandwidth-bound).",
        _arithmetic_intensity,
    ),
    SignalDef(
        "roofline_memory_bound",
        "roofline_memory_bound",
        "1 when the work sits under the memory roof (intensity below the GPU's ridge point: decode), 0 under the compute roof (prefill).",
        _roofline_memory_bound,
    ),
    SignalDef(
        "roofline_attainment_ratio",
        "roofline_attainment_ratio",
        "Model FLOP/s / the roofline's ceiling at the work's intensity: 1 = at the roof.",
        _roofline_attainment,
    ),
    SignalDef(
        "kv_requests_that_fit",
        "kv_requests_that_fit",
        "Requests of the observed mean length (prompt + output) whose KV blocks fit in the cache at once.",
        _requests_that_fit,
    ),
    SignalDef(
        "gpu_memory_utilization",
        "gpu_memory_utilization",
        "vLLM's --gpu-memory-utilization in force (cache_config_info).",
        _gpu_memory_utilization,
    ),
    SignalDef(
        "kv_bytes_per_token",
        "kv_bytes_per_token",
        "KV cache bytes per token (cache_config_info: kv_cache_memory_bytes / kv_cache_size_tokens, where vLLM exports both).",
        _kv_bytes_per_token,
    ),
    SignalDef("max_num_seqs", "max_num_seqs", "max_num_seqs in force (config, vLLM command line or vLLM default).", _max_num_seqs),
    SignalDef(
        "running_to_max_num_seqs_ratio",
        "running_to_max_num_seqs_ratio",
        "Mean running requests / max_num_seqs.",
        _running_to_max,
    ),
    SignalDef(
        "headroom_ratio",
        "headroom_ratio",
        "Load the server can still take (0 = saturated: requests wait; else the smaller free share of the KV cache and of "
        "max_num_seqs), window means: the autoscaling signal (the chart's KEDA ScaledObject scales on 1 - this).",
        _headroom,
    ),
)


# The vLLM samples (today's names) that the vLLM source parses: what VLLM_SIGNALS declare they read, and the one the
# source reads itself to tell vLLM's v0 engine (a real page's other ~half is skipped before the parser). Its consumers
# beside the signals (the envelope's cache config, a bundle's load shape, the incident page's plots) read no other.
VLLM_SAMPLES_READ: frozenset[str] = frozenset((*(sample for signal in VLLM_SIGNALS for sample in signal.samples), "vllm:num_requests_swapped"))
