"""What a change of vLLM's configuration did: the envelope after it against the one before it, at the same load
(envelope.py keeps both, across vLLM's restarts and the sidecar's own)."""

from __future__ import annotations

from ...model import VLLM_SOURCE
from ..condition import Condition, Threshold
from ..judge import Judge, Term, any_of


def _regression_after_change(j: Judge) -> Term:
    if j.signals.get("vllm_change_seconds") is None:
        return j.fact(False, "no change of vLLM's configuration seen with an envelope before it")
    if j.signals.get("vllm_change_throughput_ratio") is None:
        return j.fact(False, "vLLM's configuration changed; the load after it has not yet matched one before it (a minute of each)")
    load = j.signals.get("vllm_change_load_requests")
    at = f" at {load:.1f} requests in flight" if load is not None else ""
    slower = j.compare(
        "vllm_change_throughput_ratio",
        "<=",
        "throughput_ratio_max",
        f"output tokens per second per request in flight after the change, as a share of before it{at}",
        upper=0.0,
    )
    terms = [slower]
    if j.signals.get("vllm_change_itl_ratio") is not None:
        terms.append(j.compare("vllm_change_itl_ratio", ">=", "itl_ratio_min", f"inter-token latency after the change, as a multiple of before it{at}"))
    ttft = j.signals.get("vllm_change_ttft_ratio")
    if ttft is not None:
        j.note(f"time to first token after the change {ttft:.2f}x before it{at}", "vllm_change_ttft_ratio", ttft)
    return any_of(*terms)


REGRESSION_AFTER_CHANGE = Condition(
    id="regression_after_change",
    precedence=85,
    layer="1+3",
    severity="warning",
    summary="vLLM got slower after a change of its configuration",
    meaning=(
        "vLLM restarted with another command line, version or cache config, and at the same load (requests in flight) it "
        "now delivers fewer output tokens per second to each request, or a longer inter-token latency, than it did before "
        "the change. The evidence names what changed. A restart that changed nothing is never judged: the same "
        "configuration goes on with the same envelope."
    ),
    next_actions=(
        "Read what changed in the evidence and undo it (roll back) where the slowdown is not what the change was for: "
        "--enforce-eager turns CUDA graphs off, a lower --max-num-seqs or --max-num-batched-tokens admits less per step, a "
        "new version may change defaults.",
        "Where the change was wanted (less memory, another model length), size the replicas for the throughput it leaves.",
    ),
    predicate=_regression_after_change,
    # The envelope's ratios, then what it is made of (each exported: the drill-down shows the change in them).
    reads=(
        "vllm_change_throughput_ratio",
        "vllm_change_itl_ratio",
        "vllm_change_ttft_ratio",
        "vllm_change_load_requests",
        "vllm_change_seconds",
        "generation_tokens_per_second",
        "inter_token_latency_seconds_mean",
        "requests_running_mean",
        "requests_waiting_mean",
        "ttft_seconds_mean",
    ),
    thresholds=(
        Threshold("throughput_ratio_max", 0.8, "output tokens per second per request in flight after / before the change at most this", 0.0, 1.0),
        Threshold("itl_ratio_min", 1.25, "or inter-token latency after / before at least this", 1.0),
    ),
    for_seconds=10,
    clear_seconds=60,
    sources=(VLLM_SOURCE,),
    scope_kind="global",
    notes=("change",),
    dont=(
        "Do not compare throughput before and after a change at different loads: fewer requests in flight give each one "
        "more tokens per second, longer prompts fewer; the envelope compares only points within 20 % of the same load and 30 % "
        "of the same prompt length.",
    ),
)
