"""vLLM's KV cache: full, preempting, or fragmented (judged on its own /metrics, with the GPUs' memory beside it)."""

from __future__ import annotations

import math

from ..condition import Condition, Threshold
from ..judge import Judge, Term, all_of, any_of


def _kv_cache_saturated(j: Judge) -> Term:
    # Two ways to know the cache is full. Sampled: usage mostly high and full at least once, with someone
    # waiting or preempted (each preemption frees a whole request's blocks at once, so a full cache averages
    # 0.90-0.95 with dips). Invariant: vLLM preempts only when it cannot allocate a block, so sustained
    # preemptions while requests wait for capacity are saturation whatever the gauge reads; under thrash
    # the gauge reads 0 at some scrapes and 1.0 at others (window means of 0.64-0.71 on a real engine).
    usage = all_of(
        j.compare("kv_cache_usage_ratio_mean", ">=", "usage_min", "KV cache usage (window mean)", upper=1.0),
        j.compare(
            "kv_cache_usage_ratio_max", ">=", "usage_peak_min", "KV cache usage (window peak)", upper=1.0, limit=_full_within_a_block(j, "usage_peak_min")
        ),
    )
    pressure = any_of(
        j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)"),
        j.compare("preemptions_per_second", ">", "preemptions_per_second_min", "preemptions per second"),
    )
    sampled = all_of(usage, pressure)
    thrash = _preempting_while_waiting(j)
    verdict = any_of(sampled, thrash)
    if thrash.holds and not sampled.holds:
        low, mean = j.signals.get("kv_cache_usage_ratio_min"), j.signals.get("kv_cache_usage_ratio_mean")
        if low is not None and mean is not None:
            j.note(
                f"vLLM's KV usage gauge read {low:.2f} to full (mean {mean:.2f}) in the window, yet it preempted: it preempts only when "
                "no block is free, so the gauge is sampled between preemptions and understates the cache",
                "kv_cache_usage_ratio_min",
                low,
            )
    if verdict.holds:
        advise_capacity(j)
    return verdict


def _preempting_while_waiting(j: Judge) -> Term:
    """Preemptions at a sustained rate while requests wait (for capacity, where vLLM says why they wait)."""
    preempting = j.compare("preemptions_per_second", ">=", "thrash_preemptions_per_second_min", "preemptions per second (no free KV block each time)")
    if j.signals.get("requests_waiting_capacity_mean") is not None:
        waiting = j.compare("requests_waiting_capacity_mean", ">", "waiting_min", "requests waiting for capacity (window mean, vLLM's reason)")
    else:
        waiting = j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)")
    return all_of(preempting, waiting)


def advise_capacity(j: Judge) -> None:
    """The flag values the observed workload asks for, with their arithmetic: how many requests of the observed
    length the KV cache holds (--max-num-seqs), how many replicas hold the observed demand, and how much
    GPU memory NVML still sees free (--gpu-memory-utilization)."""
    s = j.signals
    fit, prompt, output = s.get("kv_requests_that_fit"), s.get("prompt_tokens_mean"), s.get("generation_tokens_mean")
    capacity, block, max_seqs = s.get("kv_capacity_tokens"), s.get("block_size_tokens"), s.get("max_num_seqs")
    running, waiting = s.get("requests_running_mean"), s.get("requests_waiting_mean")
    if fit is not None and fit >= 1 and prompt is not None and output is not None and capacity is not None:
        per_request = f"{math.ceil((prompt + output) / block):.0f} blocks of {block:.0f}" if block else f"{prompt + output:.0f} tokens"
        if max_seqs is not None and fit < max_seqs:
            j.advise(
                f"--max-num-seqs {fit:.0f}: the cache's {capacity:.0f} KV tokens hold {fit:.0f} requests of {prompt:.0f} prompt + "
                f"{output:.0f} output tokens ({per_request} each); with max_num_seqs {max_seqs:.0f} more are admitted than fit, "
                "and they are preempted and recomputed. At that cap none is preempted and the rest wait in the queue; fewer run "
                "at once, so compare tokens/s after the change (more KV, below, keeps both)."
            )
        if running is not None and waiting is not None and running + waiting > fit:
            replicas = math.ceil((running + waiting) / fit)
            j.advise(
                f"{replicas} replicas of this size hold the observed demand at once: {running:.1f} running + {waiting:.1f} waiting = "
                f"{running + waiting:.1f} requests in the system, {fit:.0f} fit in one replica's KV cache."
            )
    free, utilization = s.get("gpu_memory_free_ratio"), s.get("gpu_memory_utilization")
    if free is not None and utilization is not None and 1.0 - free < utilization - 0.02:
        # On the H200 lent here NVML read 2 % used under a vLLM holding 50 %: a view that misses vLLM's own
        # allocation says nothing about what is free beside it.
        j.note(f"no --gpu-memory-utilization advice: NVML reads {1 - free:.0%} used, less than the {utilization:.0%} vLLM reserves")
    elif free is not None and utilization is not None and free > 0.1:
        target = min(0.95, utilization + free - 0.05)
        j.advise(
            f"--gpu-memory-utilization {target:.2f} (now {utilization:.2f}): NVML shows {free:.0%} of the GPU's memory free; leaving 5 % "
            "spare, the rest goes to the KV cache (check that nothing else uses this GPU)."
        )


def _full_within_a_block(j: Judge, threshold: str) -> float | None:
    """A peak threshold no stricter than "one block free": usage moves in steps of one block, and a
    small saturated cache (47 blocks on a real H200 run: steps of 0.021) is rarely sampled at 1.0."""
    one_block = j.signals.get("kv_cache_one_block_below_full_ratio")
    if one_block is None or one_block >= j.thresholds[threshold]:
        return None
    j.note(f"full is judged within one KV block: {one_block:.3f} is one block below full", "kv_cache_one_block_below_full_ratio", one_block)
    return one_block - 1e-9


# What advise_capacity reads beside a condition's own evidence.
ADVICE_READS = (
    "kv_requests_that_fit",
    "prompt_tokens_mean",
    "generation_tokens_mean",
    "kv_capacity_tokens",
    "block_size_tokens",
    "gpu_memory_free_ratio",
    "gpu_memory_utilization",
)


_CAPACITY_ACTIONS = (
    "Capacity is the limit: lower --max-num-seqs or --max-num-batched-tokens.",
    "Raise --gpu-memory-utilization if GPU memory allows; use an fp8 KV cache (--kv-cache-dtype fp8).",
    "Enable prefix caching; route long-context requests elsewhere; add replicas.",
)


KV_CACHE_SATURATED = Condition(
    id="kv_cache_saturated",
    precedence=40,
    notes=("max_num_seqs",),
    layer="1",
    severity="warning",
    summary="KV cache is full and requests are queueing or being preempted",
    meaning="Every KV block is in use; new requests wait and running ones are preempted (recomputed on V1).",
    next_actions=_CAPACITY_ACTIONS,
    predicate=_kv_cache_saturated,
    reads=(
        "kv_cache_usage_ratio_mean",
        "kv_cache_usage_ratio_max",
        "requests_waiting_mean",
        "preemptions_per_second",
        "requests_waiting_capacity_mean",
        "kv_cache_usage_ratio_min",
        "kv_cache_one_block_below_full_ratio",
        "max_num_seqs",
        "requests_running_mean",
        *ADVICE_READS,
    ),
    dont=(
        "Do not judge by GPU memory used: vLLM preallocates gpu_memory_utilization of the card at start. KV usage is the signal.",
        "There is no vllm:cache_usage metric: it is vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before ~0.10).",
    ),
    thresholds=(
        Threshold("usage_min", 0.8, "KV usage window mean at or above this", 0.0, 1.0),
        Threshold("usage_peak_min", 0.99, "KV usage window maximum at or above this (the cache filled up)", 0.0, 1.0),
        Threshold("waiting_min", 0.0, "mean waiting requests above this"),
        Threshold("preemptions_per_second_min", 0.0, "preemptions per second above this"),
        Threshold(
            "thrash_preemptions_per_second_min",
            0.1,
            "or, whatever the usage gauge reads: preemptions per second at or above this while requests wait (vLLM preempts only when no block is free)",
        ),
    ),
    # The thrash path holds within seconds of the first preemptions and the sampled one needs most of the window full:
    # 30 s on top is 32-34 s from onset on the H200 captures, and the shorter `for` adds no verdict to any capture.
    for_seconds=30,
)


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


PREEMPTION_STORM = Condition(
    id="preemption_storm",
    precedence=60,
    layer="1",
    severity="warning",
    summary="vLLM is preempting requests at a high rate",
    meaning="Running requests lose their KV blocks to make room; V1 recomputes them, burning GPU time twice.",
    next_actions=(
        "KV thrashing: same levers as kv_cache_saturated (fewer concurrent sequences, more KV memory).",
        "V1 engines do not swap, they recompute: swap-space settings will not help.",
    ),
    predicate=_preemption_storm,
    reads=("preemptions_per_second", "preemptions_per_finished_request"),
    dont=(
        "Do not tune swap space: V1 engines recompute preempted requests, swap counters exist only on V0.",
        "Do not reach for --num-scheduler-steps: it exists only on old V0 engines (V1 has async scheduling).",
    ),
    thresholds=(
        Threshold("preemptions_per_second_max", 1.0, "preemptions per second above this"),
        Threshold("preemptions_per_finished_request_max", 0.05, "preemptions per finished request above this"),
    ),
    for_seconds=30,  # as kv_cache_saturated: the rate is over the window already
    clear_seconds=120,
)


def _kv_fragmentation_suspected(j: Judge) -> Term:
    usage = j.compare("kv_cache_usage_ratio_mean", ">=", "usage_min", "KV cache usage (window mean)", upper=1.0)
    live = j.compare("kv_live_token_ratio", "<", "live_token_ratio_max", "tokens the running requests hold / KV tokens in use", upper=1.0)
    waste = j.compare("kv_last_block_waste_ratio", ">=", "block_waste_ratio_min", "half-empty last blocks / KV capacity", upper=1.0)
    # Only evidence of fragmentation itself: the seeds' row "util.gpu < 30 % with a full cache" holds
    # for every CPU-bound engine (a real one on the H200: SM active 0.3 %, live tokens 0.93 of the
    # blocks in use) and is gpu_starved's story, not this one's.
    if usage.holds:
        j.cause = "live_tokens" if live.holds else "block_waste" if waste.holds else None
    return all_of(usage, any_of(live, waste))


KV_FRAGMENTATION_SUSPECTED = Condition(
    id="kv_fragmentation_suspected",
    precedence=120,
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
    reads=("kv_live_token_ratio", "kv_last_block_waste_ratio", "kv_cache_usage_ratio_mean"),
    dont=(
        "PagedAttention keeps external fragmentation near zero: restarting to 'compact' memory does not help.",
        "An idle GPU with a full KV cache is not fragmentation: the CPU side cannot feed the GPU (see gpu_starved).",
    ),
    thresholds=(
        Threshold("usage_min", 0.8, "KV usage window mean at or above this", 0.0, 1.0),
        Threshold("live_token_ratio_max", 0.5, "live tokens / KV tokens in use below this", 0.0, 1.0),
        Threshold("block_waste_ratio_min", 0.10, "last-block waste / capacity at or above this", 0.0, 1.0),
    ),
    for_seconds=120,
    clear_seconds=120,
    causes=("live_tokens", "block_waste"),
)
