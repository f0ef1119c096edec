"""vLLM's queue: requests waiting, and why (capacity, caps, budgets, the GPU's limits), or too few requests sent."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..condition import FROZEN, Condition, Threshold
from ..judge import Judge, Term, all_of, sm_activity_words
from .capacity import ADVICE_READS, advise_capacity


def _queue_backlog(j: Judge) -> Term:
    backlog = j.compare("requests_waiting_nonempty_ratio", ">=", "waiting_share_min", "share of the window's readings with requests waiting", upper=1.0)
    if backlog.holds and (low := j.signals.get("requests_waiting_min")) == 0:
        j.note("vLLM's waiting gauge read 0 at some readings of the window: under KV thrash it collapses between scrapes", "requests_waiting_min", low)
    deferred, waiting = j.signals.get("requests_waiting_deferred_mean"), j.signals.get("requests_waiting_mean")
    if backlog.holds and deferred is not None and waiting and deferred >= j.thresholds["deferred_share_for_deferred_cause"] * waiting:
        # vLLM says why they wait (0.26+): deferred requests are not held up by capacity, so no capacity cause applies
        j.cause = "deferred"
        j.note(
            f"cause deferred: {deferred:.1f} of {waiting:.1f} waiting requests are deferred by vLLM (LoRA budget, KV transfer, grammar), "
            "not waiting for capacity",
            "requests_waiting_deferred_mean",
            deferred,
        )
    elif backlog.holds:
        capacity = j.signals.get("requests_waiting_capacity_mean")
        if capacity is not None:
            j.note(f"vLLM says {capacity:.1f} of the waiting requests wait for capacity", "requests_waiting_capacity_mean", capacity)
        usage = j.signals.get("kv_cache_usage_ratio_mean")
        peak = j.signals.get("kv_cache_usage_ratio_max")
        running = j.signals.get("requests_running_mean")
        max_seqs = j.signals.get("max_num_seqs")
        preemptions = j.signals.get("preemptions_per_second")
        if preemptions is not None and preemptions >= j.thresholds["preemptions_for_capacity_cause"]:
            j.cause = "kv_capacity"
            j.note(
                f"cause kv_capacity: vLLM preempts {preemptions:.2f} requests per second: it preempts only when no KV block is free",
                "preemptions_per_second",
                preemptions,
            )
            advise_capacity(j)
        elif (
            usage is not None
            and peak is not None
            and usage >= j.thresholds["kv_usage_for_capacity_cause"]
            and peak >= min(j.thresholds["kv_peak_for_capacity_cause"], (j.signals.get("kv_cache_one_block_below_full_ratio") or 1.0) - 1e-9)
        ):
            j.cause = "kv_capacity"
            j.note(
                f"cause kv_capacity: KV cache usage averages {usage:.2f} and reached {peak:.2f}: requests wait for KV blocks",
                "kv_cache_usage_ratio_mean",
                usage,
            )
            advise_capacity(j)
        elif (limit := gpu_limit(j, "gpu_compute")) is not None and not _budget_before_compute(j):
            j.cause = "gpu_compute"
            j.note(f"cause gpu_compute: {limit}: the GPU computes at its limit while requests wait; more sequences or tokens per step add no FLOPs")
            _advise_replicas(j, "the GPU's compute")
        elif (
            running is not None
            and max_seqs is not None
            and (running >= j.thresholds["running_ratio_for_cap_cause"] * max_seqs or (j.signals.get("requests_running_max") or 0.0) >= max_seqs)
        ):
            # at the cap on average, or at it at all while the queue held (a queue that formed within the window)
            j.cause = "concurrency_cap"
            j.note(
                f"cause concurrency_cap: {running:.1f} running on average (at most {j.signals.get('requests_running_max') or 0.0:.0f}), "
                f"at max_num_seqs {max_seqs:.0f}",
                "requests_running_mean",
                running,
            )
            fit = j.signals.get("kv_requests_that_fit")
            if fit is not None and fit > max_seqs:
                j.advise(f"--max-num-seqs {fit:.0f}: the KV cache holds {fit:.0f} requests of the observed length, the cap admits {max_seqs:.0f}.")
        elif (full := j.signals.get("tokens_per_step_to_budget_ratio")) is not None and full >= j.thresholds["budget_ratio_for_cause"]:
            j.cause = "token_budget"
            budget = j.signals.get("max_num_batched_tokens") or 0.0
            per_step = j.signals.get("tokens_per_step_mean") or 0.0
            j.note(
                f"cause token_budget: steps carry {per_step:.0f} tokens on average of the {budget:.0f} --max-num-batched-tokens allows ({full:.0%}): "
                "every step is full, and prompts wait for the budget",
                "tokens_per_step_to_budget_ratio",
                full,
            )
            prompt = j.signals.get("prompt_tokens_mean")
            if prompt:
                wanted = max(2 * budget, math.ceil(prompt / BATCHED_TOKENS_STEP) * BATCHED_TOKENS_STEP)
                j.advise(
                    f"--max-num-batched-tokens {wanted:.0f} (now {budget:.0f}): a prompt of {prompt:.0f} tokens on average takes "
                    f"{math.ceil(prompt / budget):.0f} steps to prefill at {budget:.0f}; a larger budget admits more prompts per step "
                    "(watch ITL: a step with a long prefill chunk delays every decode in it)."
                )
        elif (limit := gpu_limit(j, "gpu_bandwidth")) is not None:
            j.cause = "gpu_bandwidth"
            j.note(f"cause gpu_bandwidth: {limit}: decode is memory-bound at this batch while requests wait")
            _advise_replicas(j, "the GPU's memory bandwidth")
        elif (
            (core := j.signals.get("host_engine_core_busiest_thread_cpu_ratio")) is not None
            and core >= j.thresholds["scheduler_thread_min"]
            and ((utilization := j.signals.get("gpu_utilization_ratio_mean")) is None or utilization < j.thresholds["kernel_resident_max"])
        ):
            j.cause = "scheduler_bound"
            j.note(f"cause scheduler_bound: the engine core's busiest thread uses {core:.2f} of a core", "host_engine_core_busiest_thread_cpu_ratio", core)
        elif (api := j.signals.get("host_api_server_busiest_thread_cpu_ratio")) is not None and api >= j.thresholds["scheduler_thread_min"]:
            j.cause = "api_server"
            j.note(f"cause api_server: the API server's busiest thread uses {api:.2f} of a core", "host_api_server_busiest_thread_cpu_ratio", api)
        else:
            j.cause = "unknown"
            j.note("no clear bottleneck: " + _ruled_out(j))
    return backlog


def _budget_before_compute(j: Judge) -> bool:
    """Steps pinned at --max-num-batched-tokens while the tensor cores have compute to spare: the budget limits each step
    before the GPU does (bigger steps run the GEMMs more efficiently). Measured on the H200's 70B-shaped layers: tensor
    activity 0.58-0.62 at 256-token steps, 0.82 at 8,192-token steps at the compute limit."""
    full = j.signals.get("tokens_per_step_to_budget_ratio")
    tensor = j.signals.get("gpu_tensor_active_ratio_mean")
    return full is not None and full >= j.thresholds["budget_ratio_for_cause"] and (tensor is None or tensor < j.thresholds["budget_tensor_saturated_min"])


# Where the GPU layer explains a queue or a slow step (queue_backlog's and itl_high's gpu_compute and gpu_bandwidth causes).
# vLLM schedules prefill in chunks of at most --max-num-batched-tokens per step, beside the decodes.
BATCHED_TOKENS_STEP = 256


GPU_LIMIT_THRESHOLDS = (
    Threshold("gpu_tensor_min", 0.6, "cause gpu_compute when tensor-core activity is at or above this", 0.0, 1.0),
    Threshold("gpu_sm_min", 0.8, "... or SM activity at or above this with DRAM bandwidth below gpu_dram_min", 0.0, 1.0),
    Threshold("gpu_dram_min", 0.7, "cause gpu_bandwidth when DRAM bandwidth is at or above this (tensor cores below half gpu_tensor_min)", 0.0, 1.0),
)


def gpu_limit(j: Judge, kind: str) -> str | None:
    """Where the GPU layer explains a queue: its compute at the limit (tensor cores, or SMs busy with DRAM to spare) or
    its memory bandwidth at the limit with idle tensor cores; the words that say so, else None."""
    tensor, sm, dram = (j.signals.get(f"gpu_{name}_ratio_mean") for name in ("tensor_active", "sm_active", "dram_bandwidth_utilization"))
    t = j.thresholds
    if kind == "gpu_compute":
        if tensor is not None and tensor >= t["gpu_tensor_min"]:
            return f"tensor-core activity {tensor:.2f} (>= {t['gpu_tensor_min']:g})"
        if sm is not None and dram is not None and sm >= t["gpu_sm_min"] and dram < t["gpu_dram_min"]:
            return f"SM activity {sm:.2f} (>= {t['gpu_sm_min']:g}) with DRAM bandwidth at {dram:.2f}"
        return None
    if dram is not None and dram >= t["gpu_dram_min"] and (tensor is None or tensor < t["gpu_tensor_min"] / 2):
        return f"DRAM bandwidth utilisation {dram:.2f} (>= {t['gpu_dram_min']:g}) with tensor-core activity {0.0 if tensor is None else tensor:.2f}"
    return None


def _advise_replicas(j: Judge, limit: str) -> None:
    """Replicas that serve the observed demand when one replica's GPU is the limit: each serves what runs now."""
    running, waiting = j.signals.get("requests_running_mean"), j.signals.get("requests_waiting_mean")
    if running and waiting is not None and running > 0:
        replicas = math.ceil((running + waiting) / running)
        j.advise(
            f"{replicas} replicas of this size serve the observed demand: {running:.1f} running + {waiting:.1f} waiting = "
            f"{running + waiting:.1f} requests, {running:.1f} at a time per replica at {limit}'s limit (or a faster GPU, or tensor parallelism)."
        )


def _ruled_out(j: Judge) -> str:
    """What a queue_backlog without a cause was checked against, each with its reading."""
    s = j.signals
    checked = []
    for what, signal, fmt in (
        ("KV usage", "kv_cache_usage_ratio_mean", "{:.2f}"),
        ("running / max_num_seqs", "running_to_max_num_seqs_ratio", "{:.2f}"),
        ("tokens per step / budget", "tokens_per_step_to_budget_ratio", "{:.2f}"),
        ("tensor activity", "gpu_tensor_active_ratio_mean", "{:.2f}"),
        ("SM activity", "gpu_sm_active_ratio_mean", "{:.2f}"),
        ("DRAM bandwidth", "gpu_dram_bandwidth_utilization_ratio_mean", "{:.2f}"),
        ("engine core's thread", "host_engine_core_busiest_thread_cpu_ratio", "{:.2f} of a core"),
        ("API server's thread", "host_api_server_busiest_thread_cpu_ratio", "{:.2f} of a core"),
    ):
        value = s.get(signal)
        checked.append(f"{what} {fmt.format(value)}" if value is not None else f"{what} not read")
    return "checked and ruled out: " + ", ".join(checked)


QUEUE_BACKLOG = Condition(
    id="queue_backlog",
    precedence=70,
    precedence_by_cause=(("concurrency_cap", 45), ("token_budget", 46)),
    suppressed_by=(FROZEN,),
    notes=("max_num_seqs",),
    layer="1",
    severity="warning",
    summary="Requests wait in vLLM's queue for most of the window",
    meaning=(
        "Requests waited at most readings of the window: demand exceeds what the server admits. A single reading of 0 does "
        "not empty a queue (vLLM's gauge collapses between scrapes under KV thrash)."
    ),
    next_actions=(
        "cause=kv_capacity: KV cache is the limit; see kv_cache_saturated's actions.",
        "cause=concurrency_cap: running reached max_num_seqs; raise --max-num-seqs if KV cache allows.",
        "cause=gpu_compute: the GPU computes at its limit: add replicas (the advice counts them), tensor parallelism or a faster GPU; "
        "raising --max-num-seqs or the token budget adds no FLOPs.",
        "cause=token_budget: every step is full: raise --max-num-batched-tokens (the advice computes it); long prompts take several steps each.",
        "cause=gpu_bandwidth: decode is memory-bound: fp8 weights or KV cache, speculative decoding, more replicas.",
        "cause=scheduler_bound: the engine core's thread is saturated: see gpu_starved.",
        "cause=api_server: the API server's thread is saturated: raise --api-server-count (see gpu_starved).",
        "cause=deferred: vLLM defers them (vllm:num_requests_waiting_by_reason): LoRA budget (raise --max-loras), "
        "KV transfer from a prefill instance (check the connector), structured-output grammar compilation.",
        "cause=unknown: no clear bottleneck: the evidence lists what was checked and ruled out; take a torch profiler trace "
        "(`vllm-triage trace`) and read vLLM's log for the scheduler's view.",
    ),
    predicate=_queue_backlog,
    reads=(
        "requests_waiting_nonempty_ratio",
        "requests_waiting_mean",
        "requests_running_mean",
        "requests_running_max",
        "requests_waiting_min",
        "preemptions_per_second",
        "requests_waiting_deferred_mean",
        "requests_waiting_capacity_mean",
        "kv_cache_usage_ratio_mean",
        "kv_cache_usage_ratio_max",
        "kv_cache_one_block_below_full_ratio",
        "max_num_seqs",
        "host_engine_core_busiest_thread_cpu_ratio",
        "host_api_server_busiest_thread_cpu_ratio",
        "gpu_tensor_active_ratio_mean",
        "gpu_sm_active_ratio_mean",
        "gpu_dram_bandwidth_utilization_ratio_mean",
        "gpu_utilization_ratio_mean",
        "tokens_per_step_to_budget_ratio",
        "tokens_per_step_mean",
        "max_num_batched_tokens",
        "running_to_max_num_seqs_ratio",
        *ADVICE_READS,
    ),
    dont=("Do not raise --max-num-seqs when the cause is kv_capacity: more sequences compete for the same blocks.",),
    thresholds=(
        Threshold("waiting_share_min", 0.6, "share of the window's readings with requests waiting at or above this", 0.0, 1.0),
        Threshold("preemptions_for_capacity_cause", 0.1, "preemptions per second at or above which the cause is kv_capacity (no free block)"),
        Threshold("kv_usage_for_capacity_cause", 0.8, "KV usage window mean at or above which the cause is kv_capacity", 0.0, 1.0),
        Threshold("kv_peak_for_capacity_cause", 0.95, "... and KV usage window peak at or above this", 0.0, 1.0),
        Threshold("running_ratio_for_cap_cause", 0.9, "else mean running / max_num_seqs at or above which the cause is concurrency_cap", 0.0, 1.0),
        Threshold(
            "scheduler_thread_min", 0.85, "else the engine core's busiest thread (share of a core) at or above which the cause is scheduler_bound", 0.0, 1.0
        ),
        *GPU_LIMIT_THRESHOLDS,
        Threshold("budget_ratio_for_cause", 0.85, "cause token_budget when mean tokens per step / --max-num-batched-tokens is at or above this", 0.0, 1.0),
        Threshold(
            "budget_tensor_saturated_min",
            0.75,
            "steps at the token budget are its cause before the GPU's compute unless tensor-core activity is at or above this",
            0.0,
            1.0,
        ),
        Threshold(
            "kernel_resident_max",
            0.5,
            "cause scheduler_bound only while util.gpu is below this: a saturated thread beside a GPU with a kernel resident longer spins in its syncs",
            0.0,
            1.0,
        ),
        Threshold(
            "deferred_share_for_deferred_cause",
            0.5,
            "first: deferred / waiting (vLLM's waiting_by_reason) at or above which the cause is deferred",
            0.0,
            1.0,
        ),
    ),
    causes=("kv_capacity", "gpu_compute", "concurrency_cap", "token_budget", "gpu_bandwidth", "scheduler_bound", "api_server", "deferred", "unknown"),
    # The window share already asks for 36 s of queueing in the last minute; the `for` adds persistence on top, so a
    # queue that never empties is reported 0.6 W + 15 s after it formed, at the first 5 s tick after that (51-56 s; the
    # H200 captures read at 5 s: bench.detection_latency). A `for` a whole number of ticks: 16 s was 20 at a 5 s tick
    # and put the compute_limit capture's queue at 60 s; 20 s put it at 62 s at 4 s; 30 s added no verdict that 20 s
    # does not.
    for_seconds=15,
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
    terms = [
        j.compare("running_to_max_num_seqs_ratio", "<", "running_ratio_max", "mean running / max_num_seqs", upper=1.0),
        j.compare("requests_waiting_max", "<=", "waiting_max", "requests waiting (window maximum)"),
    ]
    if j.signals.get("gpu_sm_activity_ratio") is not None:
        terms.append(j.compare("gpu_sm_activity_ratio", "<", "sm_activity_max", sm_activity_words(j), upper=1.0))
    else:
        j.note("GPU evidence unavailable: judged on vLLM's metrics alone")
    return all_of(*terms)


def _requests_queue(signals: Mapping[str, float | None]) -> str | None:
    """Requests waiting on average contradict underload: the server turns work away."""
    waiting = signals.get("requests_waiting_mean")
    return f"{waiting:.1f} requests waiting on average: the server, not the clients, is the limit" if waiting is not None and waiting >= 1 else None


CLIENT_UNDERLOAD = Condition(
    id="client_underload",
    precedence=170,
    suppressed_by=(
        FROZEN,
        ("gpu_starved", "pending work with idle SMs and a saturated host thread is starvation, not underload"),
        ("queue_backlog", "requests wait in the queue: the server, not the clients, is the limit"),
    ),
    notes=("max_num_seqs",),
    layer="1+3",
    severity="info",
    summary="Clients send too little concurrency to keep vLLM busy",
    meaning="Few requests run at once and none wait: the server is not the bottleneck.",
    next_actions=(
        "Raise client concurrency (or batch requests) before tuning vLLM.",
        "Check the load balancer spreads requests over fewer replicas if this persists.",
    ),
    predicate=_client_underload,
    reads=(
        "running_to_max_num_seqs_ratio",
        "requests_waiting_max",
        "gpu_sm_activity_ratio",
        "requests_running_mean",
        "finished_requests_per_second",
        "requests_waiting_mean",
        "gpu_sm_activity_from_gpm",
    ),
    contradicted=_requests_queue,
    dont=("Do not tune vLLM first: it is waiting for work.",),
    thresholds=(
        Threshold("running_ratio_max", 0.25, "mean running / max_num_seqs below this", 0.0, 1.0),
        Threshold("waiting_max", 0.0, "waiting requests (window maximum) at most this"),
        Threshold("sm_activity_max", 0.5, "GPU SM activity below this (when GPU readings exist)", 0.0, 1.0),
    ),
    for_seconds=120,
    clear_seconds=60,
)
