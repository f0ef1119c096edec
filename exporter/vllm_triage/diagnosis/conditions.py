"""The condition table (shared/DIAGNOSIS.md as data).

The engine, /diagnosis, the CLI report, and later the alert rules, dashboards and runbooks all
derive from CONDITIONS. Thresholds, windows and `for`/`clear_for` durations are defaults that the
config file overrides per condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..model import VLLM_SOURCE
from .judge import Judge, Term, all_of, any_of


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    description: str
    minimum: float = 0.0
    maximum: float | None = None


@dataclass(frozen=True)
class Condition:
    id: str
    layer: str  # "1" vLLM metrics, "3" GPU/host, "1+3" both (DIAGNOSIS.md's layers)
    severity: str  # critical | warning | info
    summary: str
    meaning: str  # what it says about the server, for the report and the runbook
    next_actions: tuple[str, ...]
    predicate: Callable[[Judge], Term]
    thresholds: tuple[Threshold, ...] = ()
    for_seconds: float = 60.0
    clear_seconds: float = 60.0
    sources: tuple[str, ...] = (VLLM_SOURCE,)  # a source that is down makes the condition `unknown`
    causes: tuple[str, ...] = ()
    per_engine: bool = True  # evaluated per vLLM engine; active when any engine holds


def _vllm_unreachable(j: Judge) -> Term:
    down = j.value("vllm_down_seconds")
    if down is None:
        return j.fact(None, "vLLM has not been scraped yet", "vllm_down_seconds")
    return j.compare("vllm_down_seconds", ">", "down_seconds_min", "vLLM /metrics has been failing for", " s")


def _kv_cache_saturated(j: Judge) -> Term:
    usage = j.compare("kv_cache_usage_ratio_mean", ">=", "usage_min", "KV cache usage (window mean)", upper=1.0)
    pressure = any_of(
        j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)"),
        j.compare("preemptions_per_second", ">", "preemptions_per_second_min", "preemptions per second"),
    )
    return all_of(usage, pressure)


def _queue_backlog(j: Judge) -> Term:
    backlog = j.compare("requests_waiting_min", ">", "waiting_min", "requests waiting (window minimum)")
    if backlog.holds:
        usage = j.signals.get("kv_cache_usage_ratio_mean")
        running = j.signals.get("requests_running_max")
        max_seqs = j.signals.get("max_num_seqs")
        if usage is not None and usage >= j.thresholds["kv_usage_for_capacity_cause"]:
            j.cause = "kv_capacity"
            j.note(f"cause kv_capacity: KV cache usage averages {usage:.2f}: requests wait for KV blocks", "kv_cache_usage_ratio_mean", usage)
        elif running is not None and max_seqs is not None and running >= max_seqs:
            j.cause = "concurrency_cap"
            j.note(f"cause concurrency_cap: {running:.0f} running reached max_num_seqs {max_seqs:.0f}", "requests_running_max", running)
        else:
            j.cause = "unknown"
            j.note("cause unknown: KV cache has room and running is below max_num_seqs (host-layer evidence needed)")
    return backlog


def _preemption_storm(j: Judge) -> Term:
    return any_of(
        j.compare("preemptions_per_second", ">", "preemptions_per_second_max", "preemptions per second"),
        j.compare(
            "preemptions_per_finished_request",
            ">",
            "preemptions_per_finished_request_max",
            "preemptions per finished request",
        ),
    )


def _client_underload(j: Judge) -> Term:
    running = j.value("requests_running_mean")
    finished = j.value("finished_requests_per_second")
    if running is None and finished is None:
        return j.fact(None, "no running/finished request counts", "requests_running_mean")
    traffic = (running or 0) > 0 or (finished or 0) > 0
    if not traffic:
        j.fact(False, "no traffic in the window: the server is idle, not underloaded", "finished_requests_per_second", finished)
        return Term(False, 0.0)
    return all_of(
        j.compare("running_to_max_num_seqs_ratio", "<", "running_ratio_max", "mean running / max_num_seqs", upper=1.0),
        j.compare("requests_waiting_max", "<=", "waiting_max", "requests waiting (window maximum)"),
    )


def _with_observations(j: Judge, signal: str, what: str) -> bool | None:
    count = j.value(signal)
    if count is None:
        return None
    if count <= 0:
        j.fact(False, f"no {what} observed in the window", signal, count)
        return False
    return True


def _ttft_high(j: Judge) -> Term:
    seen = _with_observations(j, "ttft_seconds_observations", "first tokens")
    if seen is not True:
        return Term(seen, 0.0)
    term = j.compare("ttft_seconds_p95", ">", "ttft_p95_max_seconds", "TTFT p95", " s")
    queue, prefill = j.signals.get("queue_time_seconds_mean"), j.signals.get("prefill_time_seconds_mean")
    if term.holds and queue is not None and prefill is not None:
        j.cause = "queueing" if queue >= prefill else "prefill"
        j.note(
            f"{j.cause} dominates: mean queue time {queue:.3f} s vs mean prefill time {prefill:.3f} s",
            "queue_time_seconds_mean",
            queue,
        )
    return term


def _itl_high(j: Judge) -> Term:
    seen = _with_observations(j, "inter_token_latency_seconds_observations", "inter-token latencies")
    if seen is not True:
        return Term(seen, 0.0)
    return j.compare("inter_token_latency_seconds_p95", ">", "itl_p95_max_seconds", "inter-token latency p95", " s")


def _request_errors(j: Judge) -> Term:
    finished = j.value("finished_requests_per_second")
    if finished is not None and finished <= 0:
        return j.fact(False, "no request finished in the window", "finished_requests_per_second", finished)
    return j.compare("request_error_ratio", ">", "error_ratio_max", "share of requests finished with an error", upper=1.0)


def _prefix_cache_ineffective(j: Judge) -> Term:
    enabled = j.value("prefix_caching_enabled")
    on = j.fact(None if enabled is None else enabled > 0, f"prefix caching is {'on' if enabled else 'off'}", "prefix_caching_enabled", enabled)
    if on.holds is not True:
        return on
    queried = j.compare("prefix_cache_queries_per_second", ">", "queries_per_second_min", "prefix-cache queries per second")
    if queried.holds is not True:
        return queried
    return j.compare("prefix_cache_hit_ratio", "<", "hit_ratio_max", "prefix-cache hit ratio", upper=1.0)


def _kv_fragmentation_suspected(j: Judge) -> Term:
    usage = j.compare("kv_cache_usage_ratio_mean", ">=", "usage_min", "KV cache usage (window mean)", upper=1.0)
    live = j.compare("kv_live_token_ratio", "<", "live_token_ratio_max", "tokens the running requests hold / KV tokens in use", upper=1.0)
    waste = j.compare("kv_last_block_waste_ratio", ">=", "block_waste_ratio_min", "half-empty last blocks / KV capacity", upper=1.0)
    if usage.holds and (live.holds or waste.holds):
        j.cause = "live_tokens" if live.holds else "block_waste"
    return all_of(usage, any_of(live, waste))


_CAPACITY_ACTIONS = (
    "Capacity is the limit: lower --max-num-seqs or --max-num-batched-tokens.",
    "Raise --gpu-memory-utilization if GPU memory allows; use an fp8 KV cache (--kv-cache-dtype fp8).",
    "Enable prefix caching; route long-context requests elsewhere; add replicas.",
)

CONDITIONS: tuple[Condition, ...] = (
    Condition(
        id="vllm_unreachable",
        layer="1",
        severity="critical",
        summary="vLLM's /metrics endpoint is failing",
        meaning="The sidecar cannot read vLLM's metrics: the server is down, restarting, hung or unreachable.",
        next_actions=(
            "Is the server up? Check the pod's restarts and the vLLM container's logs.",
            "Look for OOM kills (kubectl describe pod; dmesg) and CUDA errors in the log.",
        ),
        predicate=_vllm_unreachable,
        thresholds=(Threshold("down_seconds_min", 0.0, "seconds of failed scrapes before the predicate holds"),),
        for_seconds=30,
        clear_seconds=30,
        sources=(),
        per_engine=False,
    ),
    Condition(
        id="kv_cache_saturated",
        layer="1",
        severity="critical",
        summary="KV cache is full and requests are queueing or being preempted",
        meaning="Every KV block is in use; new requests wait and running ones are preempted (recomputed on V1).",
        next_actions=_CAPACITY_ACTIONS,
        predicate=_kv_cache_saturated,
        thresholds=(
            Threshold("usage_min", 0.95, "KV usage window mean at or above this", 0.0, 1.0),
            Threshold("waiting_min", 0.0, "mean waiting requests above this"),
            Threshold("preemptions_per_second_min", 0.0, "preemptions per second above this"),
        ),
    ),
    Condition(
        id="queue_backlog",
        layer="1",
        severity="warning",
        summary="Requests wait in vLLM's queue throughout the window",
        meaning="The waiting queue never emptied during the window: demand exceeds what the server admits.",
        next_actions=(
            "cause=kv_capacity: KV cache is the limit; see kv_cache_saturated's actions.",
            "cause=concurrency_cap: running reached max_num_seqs; raise --max-num-seqs if KV cache allows.",
            "cause=unknown: check the host layer (engine core CPU, GIL) and the GPU layer.",
        ),
        predicate=_queue_backlog,
        thresholds=(
            Threshold("waiting_min", 0.0, "waiting requests (window minimum) above this"),
            Threshold("kv_usage_for_capacity_cause", 0.9, "KV usage at or above which the cause is kv_capacity", 0.0, 1.0),
        ),
        causes=("kv_capacity", "concurrency_cap", "unknown"),
    ),
    Condition(
        id="preemption_storm",
        layer="1",
        severity="warning",
        summary="vLLM is preempting requests at a high rate",
        meaning="Running requests lose their KV blocks to make room; V1 recomputes them, burning GPU time twice.",
        next_actions=(
            "KV thrashing: same levers as kv_cache_saturated (fewer concurrent sequences, more KV memory).",
            "V1 engines do not swap, they recompute: swap-space settings will not help.",
        ),
        predicate=_preemption_storm,
        thresholds=(
            Threshold("preemptions_per_second_max", 1.0, "preemptions per second above this"),
            Threshold("preemptions_per_finished_request_max", 0.05, "preemptions per finished request above this"),
        ),
        clear_seconds=120,
    ),
    Condition(
        id="client_underload",
        layer="1+3",
        severity="info",
        summary="Clients send too little concurrency to keep vLLM busy",
        meaning="Few requests run at once and none wait: the server is not the bottleneck.",
        next_actions=(
            "Raise client concurrency (or batch requests) before tuning vLLM.",
            "Check the load balancer spreads requests over fewer replicas if this persists.",
        ),
        predicate=_client_underload,
        thresholds=(
            Threshold("running_ratio_max", 0.25, "mean running / max_num_seqs below this", 0.0, 1.0),
            Threshold("waiting_max", 0.0, "waiting requests (window maximum) at most this"),
        ),
        for_seconds=120,
        clear_seconds=60,
    ),
    Condition(
        id="ttft_high",
        layer="1",
        severity="warning",
        summary="Time to first token p95 is above the SLO",
        meaning="Users wait too long for the first token; the cause says whether queueing or prefill dominates.",
        next_actions=(
            "cause=queueing: capacity; see queue_backlog and kv_cache_saturated.",
            "cause=prefill: long prompts; enable chunked prefill and prefix caching, cap --max-num-batched-tokens.",
        ),
        predicate=_ttft_high,
        thresholds=(Threshold("ttft_p95_max_seconds", 2.0, "TTFT p95 SLO in seconds"),),
        causes=("queueing", "prefill"),
    ),
    Condition(
        id="itl_high",
        layer="1+3",
        severity="warning",
        summary="Inter-token latency p95 is above the SLO",
        meaning="Tokens stream slowly once generation started.",
        next_actions=(
            "Batch too large for the GPU, memory-bound decode, preemptions, or a starved GPU: read the other conditions.",
            "Lower --max-num-seqs to trade throughput for latency.",
        ),
        predicate=_itl_high,
        thresholds=(Threshold("itl_p95_max_seconds", 0.1, "inter-token latency p95 SLO in seconds"),),
    ),
    Condition(
        id="request_errors",
        layer="1",
        severity="warning",
        summary="Requests finish with errors",
        meaning="A share of requests ends with finished_reason=error.",
        next_actions=("Read vLLM's logs; correlate with preemptions and out-of-memory events.",),
        predicate=_request_errors,
        thresholds=(Threshold("error_ratio_max", 0.01, "share of finished requests with an error above this", 0.0, 1.0),),
        clear_seconds=120,
    ),
    Condition(
        id="prefix_cache_ineffective",
        layer="1",
        severity="info",
        summary="Prefix caching is on but almost never hits",
        meaning="Prompts share no prefix, or pressure evicts cached blocks before reuse.",
        next_actions=(
            "Check whether prompts share a common prefix (system prompt, few-shot examples) at all.",
            "If they do, KV pressure evicts them: see kv_cache_saturated.",
        ),
        predicate=_prefix_cache_ineffective,
        thresholds=(
            Threshold("queries_per_second_min", 0.0, "prefix-cache queries per second above this"),
            Threshold("hit_ratio_max", 0.05, "hit ratio below this", 0.0, 1.0),
        ),
        for_seconds=300,
        clear_seconds=300,
    ),
    Condition(
        id="kv_fragmentation_suspected",
        layer="1+3",
        severity="warning",
        summary="KV blocks are held beyond the tokens that live in them",
        meaning=(
            "KV usage is high while the running requests account for far fewer tokens, or half-empty last "
            "blocks waste a noticeable share of capacity. PagedAttention keeps external fragmentation near zero: "
            "this is internal waste or retention."
        ),
        next_actions=(
            "Try a smaller --block-size; check long-tail request lengths.",
            "Check prefix-cache retention (cached blocks count as used).",
        ),
        predicate=_kv_fragmentation_suspected,
        thresholds=(
            Threshold("usage_min", 0.8, "KV usage window mean at or above this", 0.0, 1.0),
            Threshold("live_token_ratio_max", 0.5, "live tokens / KV tokens in use below this", 0.0, 1.0),
            Threshold("block_waste_ratio_min", 0.10, "last-block waste / capacity at or above this", 0.0, 1.0),
        ),
        for_seconds=120,
        clear_seconds=120,
        causes=("live_tokens", "block_waste"),
    ),
)

CONDITIONS_BY_ID = {c.id: c for c in CONDITIONS}
