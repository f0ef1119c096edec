"""What users wait for: time to the first token, between tokens, and requests that fail."""

from __future__ import annotations

from ..condition import Condition, Threshold
from ..judge import Judge, Term
from .queueing import BATCHED_TOKENS_STEP, GPU_LIMIT_THRESHOLDS, gpu_limit


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
    outside, ttft = j.signals.get("ttft_outside_engine_seconds_mean"), j.signals.get("ttft_seconds_mean")
    if term.holds and queue is not None and prefill is not None:
        # TTFT = time outside the engine (vLLM stamps arrival in the API server) + its queue time + its prefill time
        parts = {"queueing": queue, "prefill": prefill, "outside": outside or 0.0}
        largest = max(parts, key=lambda k: parts[k])
        split = f"mean TTFT {ttft or 0.0:.3f} s = {outside or 0.0:.3f} s outside the engine + {queue:.3f} s queued + {prefill:.3f} s prefill"
        if largest != "outside":
            j.cause = largest
            j.note(f"cause {largest} dominates: {split}", "queue_time_seconds_mean", queue)
        else:
            api = j.signals.get("host_api_server_busiest_thread_cpu_ratio_recent")
            saturated = api is not None and api >= j.thresholds["api_server_thread_min"]
            j.cause = "api_server" if saturated else "frontend"
            j.note(
                f"cause {j.cause}: {split}: the time is spent before the engine sees the request"
                + (
                    f", and the API server's busiest thread uses {api:.2f} of a core (tokenising, detokenising, one SSE chunk per token)"
                    if saturated
                    else " (tokenising, the API server's event loop, the input queue; its busiest thread "
                    + ("is not visible)" if api is None else f"uses {api:.2f} of a core)")
                ),
                "ttft_outside_engine_seconds_mean",
                outside,
            )
    return term


TTFT_HIGH = Condition(
    id="ttft_high",
    precedence=130,
    layer="1",
    severity="warning",
    summary="Time to first token p95 is above the SLO",
    meaning="Users wait too long for the first token; the cause says whether queueing or prefill dominates.",
    next_actions=(
        "cause=queueing: requests wait in vLLM's queue: queue_backlog's cause says for what (KV, the cap, the GPU, the budget).",
        "cause=prefill: long prompts; enable chunked prefill and prefix caching, cap --max-num-batched-tokens.",
        "cause=api_server: the time is spent before the engine, in a saturated API server: raise --api-server-count (gpu_starved's "
        "advice computes N); fewer streamed chunks or logprobs per request.",
        "cause=frontend: the time is spent before the engine while the API server's thread is not saturated: tokenisation of "
        "long prompts, a blocked event loop, a proxy or the client's network; py-spy the API server.",
    ),
    predicate=_ttft_high,
    reads=(
        "ttft_seconds_p95",
        "queue_time_seconds_mean",
        "prefill_time_seconds_mean",
        "ttft_seconds_observations",
        "ttft_seconds_mean",
        "ttft_outside_engine_seconds_mean",
        "host_api_server_busiest_thread_cpu_ratio_recent",
    ),
    thresholds=(
        Threshold("ttft_p95_max_seconds", 2.0, "TTFT p95 SLO in seconds"),
        Threshold("api_server_thread_min", 0.85, "cause api_server (time outside the engine) when the API server's busiest thread is at least this", 0.0, 1.0),
    ),
    causes=("queueing", "prefill", "api_server", "frontend"),
    # p95 over the window's requests already asks for a sustained excess: 30 s on top is 34-46 s from onset on the
    # H200 captures. It adds one verdict there, true: after a 40 s hung kernel, the requests that waited behind it.
    for_seconds=30,
)


def _itl_high(j: Judge) -> Term:
    seen = _with_observations(j, "inter_token_latency_seconds_observations", "inter-token latencies")
    if seen is not True:
        return Term(seen, 0.0)
    high = j.compare("inter_token_latency_seconds_p95", ">", "itl_p95_max_seconds", "inter-token latency p95", " s")
    if high.holds:
        _itl_cause(j)
    return high


def _itl_cause(j: Judge) -> None:
    """ITL against the engine's own step: a token streams once per step, so an ITL well above the step time is spent
    outside the engine; inside, a step is long because prefill chunks ride in it or because the GPU is at its limit.
    Outside only when above the window's mean step and its last 10 s' too: under a load ramping up, most tokens
    streamed in the newest, longest steps, and the window's mean step is the short ones' (itl_high read `frontend`
    for 6 s of the compute_limit capture's ramp, its steps growing from 63 to 175 ms)."""
    s, t = j.signals, j.thresholds
    itl, step = s.get("inter_token_latency_seconds_p50"), s.get("engine_step_seconds_mean")
    per_step, running = s.get("tokens_per_step_mean"), s.get("requests_running_mean")
    recent_step = s.get("engine_step_seconds_recent") or 0.0
    if itl is not None and step and itl >= t["outside_engine_factor"] * max(step, recent_step):
        api = s.get("host_api_server_busiest_thread_cpu_ratio_recent")
        j.cause = "api_server" if api is not None and api >= t["api_server_thread_min"] else "frontend"
        j.note(
            f"cause {j.cause}: ITL p50 {itl * 1000:.0f} ms against {step * 1000:.0f} ms per engine step: tokens wait outside the engine"
            + (f"; the API server's busiest thread uses {api:.2f} of a core" if api is not None else ""),
            "engine_step_seconds_mean",
            step,
        )
        return
    prefill_share = (per_step - running) / per_step if per_step and running is not None and per_step > running else 0.0
    p95 = s.get("inter_token_latency_seconds_p95")
    spikes = itl is not None and p95 is not None and s.get("prefill_time_seconds_mean") and p95 >= t["spike_factor"] * itl
    if (step and prefill_share >= t["prefill_share_of_step_min"]) or spikes:
        j.cause = "prefill_chunks"
        if step and prefill_share >= t["prefill_share_of_step_min"]:
            j.note(
                f"cause prefill_chunks: steps carry {per_step:.0f} tokens for {running:.0f} running sequences ({prefill_share:.0%} prefill) "
                f"and take {step * 1000:.0f} ms each: every decode waits for the prompts prefilled beside it",
                "tokens_per_step_mean",
                per_step,
            )
        else:
            j.note(
                f"cause prefill_chunks: ITL p95 {p95 or 0.0:.3f} s against p50 {itl or 0.0:.3f} s: the slow steps are those that carry a prefill chunk",
                "inter_token_latency_seconds_p95",
                p95,
            )
        _advise_batched_tokens(j)
    elif (gpu := next(((kind, limit) for kind in ("gpu_compute", "gpu_bandwidth") if (limit := gpu_limit(j, kind)) is not None), None)) is not None:
        j.cause = gpu[0]
        j.note(f"cause {gpu[0]}: {gpu[1]}: each decode step of {running or 0.0:.0f} sequences is as fast as the GPU allows")
    else:
        j.cause = "unknown"
        checked = f"engine step {step * 1000:.0f} ms" if step else "no engine step rate"
        j.note(f"no clear bottleneck: {checked}, {prefill_share:.0%} of a step is prefill, the GPU is not at a compute or bandwidth limit")


def _advise_batched_tokens(j: Judge) -> None:
    """The --max-num-batched-tokens that keeps a step with a prefill chunk within the ITL SLO: decode steps take
    the ITL's median, and a chunk adds its tokens x the prefill time per prompt token observed."""
    s = j.signals
    median, prefill, prompt = s.get("inter_token_latency_seconds_p50"), s.get("prefill_time_seconds_mean"), s.get("prompt_tokens_mean")
    slo = j.thresholds["itl_p95_max_seconds"]
    if median is None or prefill is None or not prompt or median >= slo:
        return
    per_token = prefill / prompt
    chunk = int((slo - median) / per_token) // BATCHED_TOKENS_STEP * BATCHED_TOKENS_STEP
    if chunk >= BATCHED_TOKENS_STEP:
        j.advise(
            f"--max-num-batched-tokens {chunk}: decode steps take {median * 1000:.0f} ms (ITL p50) and prefill costs "
            f"{per_token * 1e6:.0f} us per prompt token ({prefill:.3f} s for {prompt:.0f} tokens on average), so a chunk of "
            f"{chunk} tokens keeps a step within the {slo * 1000:.0f} ms SLO; longer prompts then take more steps to start."
        )


ITL_HIGH = Condition(
    id="itl_high",
    precedence=140,
    layer="1+3",
    severity="warning",
    summary="Inter-token latency p95 is above the SLO",
    meaning="Tokens stream slowly once generation started.",
    next_actions=(
        "cause=prefill_chunks: prompts are prefilled in the same steps as decodes: lower --max-num-batched-tokens (the advice "
        "computes it) or split prefill and decode (disaggregated serving); TTFT rises as ITL falls.",
        "cause=gpu_compute: each step is as fast as the GPU computes: lower --max-num-seqs to trade throughput for latency, or add replicas.",
        "cause=gpu_bandwidth: decode is memory-bound: fp8 weights or KV cache, speculative decoding, a smaller batch.",
        "cause=api_server: tokens wait in a saturated API server: raise --api-server-count; fewer streamed chunks or logprobs.",
        "cause=frontend: tokens wait outside the engine while the API server's thread is not saturated: the proxy, the "
        "client's reading, the event loop; py-spy the API server.",
        "cause=unknown: read gpu_starved and preemption_storm; take a torch profiler trace (`vllm-triage trace`).",
    ),
    predicate=_itl_high,
    reads=(
        "inter_token_latency_seconds_p95",
        "inter_token_latency_seconds_p50",
        "engine_step_seconds_mean",
        "engine_step_seconds_recent",
        "inter_token_latency_seconds_observations",
        "tokens_per_step_mean",
        "requests_running_mean",
        "host_api_server_busiest_thread_cpu_ratio_recent",
        "gpu_tensor_active_ratio_mean",
        "gpu_sm_active_ratio_mean",
        "gpu_dram_bandwidth_utilization_ratio_mean",
        "prefill_time_seconds_mean",
        "prompt_tokens_mean",
    ),
    dont=("Worker CPU near 100 % is not a CPU bottleneck: workers spin while they wait on the GPU.",),
    thresholds=(
        Threshold("itl_p95_max_seconds", 0.1, "inter-token latency p95 SLO in seconds"),
        Threshold("outside_engine_factor", 1.5, "cause api_server or frontend when ITL p50 is at least this many engine steps"),
        Threshold("prefill_share_of_step_min", 0.5, "cause prefill_chunks when prefill tokens are at least this share of a step's tokens", 0.0, 1.0),
        Threshold("spike_factor", 3.0, "... or when ITL p95 is at least this many times its p50 while prompts are prefilled (slow steps among fast ones)"),
        Threshold("api_server_thread_min", 0.85, "cause api_server (not frontend) when the API server's busiest thread is at least this", 0.0, 1.0),
        *GPU_LIMIT_THRESHOLDS,
    ),
    causes=("prefill_chunks", "gpu_compute", "gpu_bandwidth", "api_server", "frontend", "unknown"),
    # As ttft_high: 48 s from onset on the H200's compute_limit capture (78 s at 60); its predicate holds in no other capture.
    for_seconds=30,
)


def _request_errors(j: Judge) -> Term:
    finished = j.value("finished_requests_per_second")
    if finished is not None and finished <= 0:
        return j.fact(False, "no request finished in the window", "finished_requests_per_second", finished)
    return j.compare("request_error_ratio", ">", "error_ratio_max", "share of requests finished with an error", upper=1.0)


REQUEST_ERRORS = Condition(
    id="request_errors",
    precedence=30,
    layer="1",
    severity="warning",
    summary="Requests finish with errors",
    meaning="A share of requests ends with finished_reason=error.",
    next_actions=("Read vLLM's logs; correlate with preemptions and out-of-memory events.",),
    predicate=_request_errors,
    reads=("request_error_ratio", "finished_requests_per_second"),
    thresholds=(Threshold("error_ratio_max", 0.01, "share of finished requests with an error above this", 0.0, 1.0),),
    clear_seconds=120,
)
