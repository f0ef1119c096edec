"""Each demand-side verdict takes its cause from the layer where its fix is (the queue from the GPU, the token budget,
the API server; TTFT split into time outside the engine, queue and prefill), and says plainly what it ruled out."""

from __future__ import annotations

from vllm_triage.diagnosis.conditions import CONDITIONS_BY_ID
from vllm_triage.diagnosis.engine import actions_for
from vllm_triage.diagnosis.judge import Judge

QUEUE = {"requests_waiting_nonempty_ratio": 1.0, "requests_waiting_mean": 75.0, "requests_running_mean": 300.0, "max_num_seqs": 512.0}


def judged(condition: str, signals: dict[str, float | None]) -> Judge:
    c = CONDITIONS_BY_ID[condition]
    j = Judge(signals, {t.name: t.default for t in c.thresholds}, "tiny/0")
    assert c.predicate(j).holds
    return j


def test_a_queue_beside_a_gpu_at_its_compute_limit_is_gpu_compute_with_the_replicas():
    """Measured on the H200: tensor activity 0.82, SM 0.92, DRAM 0.23, requests waiting while KV had room and running
    stayed under max_num_seqs: the cause was `unknown` before."""
    j = judged(
        "queue_backlog",
        QUEUE
        | {
            "kv_cache_usage_ratio_mean": 0.3,
            "gpu_tensor_active_ratio_mean": 0.82,
            "gpu_sm_active_ratio_mean": 0.92,
            "gpu_dram_bandwidth_utilization_ratio_mean": 0.23,
        },
    )
    assert j.cause == "gpu_compute"
    assert any(a.startswith("2 replicas of this size") for a in j.advice), j.advice


def test_a_queue_behind_a_full_token_budget_is_token_budget_with_the_budget_to_set():
    signals = QUEUE | {"requests_running_mean": 20.0, "tokens_per_step_mean": 250.0, "max_num_batched_tokens": 256.0, "prompt_tokens_mean": 900.0}
    signals["tokens_per_step_to_budget_ratio"] = 250.0 / 256.0
    j = judged("queue_backlog", signals)
    assert j.cause == "token_budget"
    assert any(a.startswith("--max-num-batched-tokens 1024 (now 256)") for a in j.advice), j.advice


def test_a_queue_no_layer_explains_says_what_was_ruled_out():
    j = judged(
        "queue_backlog", QUEUE | {"kv_cache_usage_ratio_mean": 0.3, "gpu_tensor_active_ratio_mean": 0.2, "host_engine_core_busiest_thread_cpu_ratio": 0.4}
    )
    assert j.cause == "unknown"
    text = next(e.text for e in j.evidence if e.text.startswith("no clear bottleneck"))
    assert "KV usage 0.30" in text and "tensor activity 0.20" in text and "API server's thread not read" in text, text


def test_ttft_spent_outside_the_engine_in_a_saturated_api_server_is_the_api_server():
    """Measured on the H200: TTFT p95 4.6 s with vLLM's queue time ~0 and prefill 0.014 s; the API server's thread 0.99."""
    signals = {"ttft_seconds_observations": 900.0, "ttft_seconds_p95": 4.6, "ttft_seconds_mean": 3.0, "queue_time_seconds_mean": 0.0}
    signals |= {"prefill_time_seconds_mean": 0.014, "ttft_outside_engine_seconds_mean": 2.986, "host_api_server_busiest_thread_cpu_ratio_recent": 0.99}
    assert judged("ttft_high", signals).cause == "api_server"
    assert judged("ttft_high", signals | {"host_api_server_busiest_thread_cpu_ratio_recent": 0.3}).cause == "frontend"
    queued = signals | {"queue_time_seconds_mean": 2.9, "ttft_outside_engine_seconds_mean": 0.086}
    assert judged("ttft_high", queued).cause == "queueing"


def test_the_observed_causes_action_comes_first_and_the_others_are_marked():
    actions = CONDITIONS_BY_ID["queue_backlog"].next_actions
    ordered = actions_for(actions, "concurrency_cap")
    assert ordered[0].startswith("cause=concurrency_cap:")
    assert all(a.startswith("(other cause) cause=") for a in ordered[1:]), ordered
    assert actions_for(actions, None) == actions


ITL = {"inter_token_latency_seconds_observations": 5000.0, "inter_token_latency_seconds_p95": 0.198}


def test_itl_of_steps_that_carry_prefill_chunks_is_prefill_chunks_measured_on_the_h200():
    """The compute_limit capture's saturated phase: steps of 8,200 tokens for 283 running sequences, 175 ms each, ITL
    p50 175 ms: every decode waits for the prompts prefilled in its step, though tensor activity is at the limit too."""
    capture = ITL | {
        "inter_token_latency_seconds_p50": 0.175,
        "engine_step_seconds_mean": 0.175,
        "tokens_per_step_mean": 8200.0,
        "requests_running_mean": 283.0,
        "gpu_tensor_active_ratio_mean": 0.82,
        "prefill_time_seconds_mean": 0.37,
        "prompt_tokens_mean": 1200.0,
    }
    j = judged("itl_high", capture)
    assert j.cause == "prefill_chunks"
    assert "97% prefill" in " ".join(e.text for e in j.evidence)
    # the same steps carrying only decodes: the GPU's compute is what sets the step
    assert judged("itl_high", capture | {"tokens_per_step_mean": 283.0}).cause == "gpu_compute"


def test_itl_far_above_the_engine_step_is_spent_outside_the_engine():
    outside = ITL | {"inter_token_latency_seconds_p50": 0.12, "engine_step_seconds_mean": 0.01, "tokens_per_step_mean": 300.0, "requests_running_mean": 300.0}
    assert judged("itl_high", outside | {"host_api_server_busiest_thread_cpu_ratio_recent": 0.99}).cause == "api_server"
    assert judged("itl_high", outside | {"host_api_server_busiest_thread_cpu_ratio_recent": 0.3}).cause == "frontend"
    unexplained = judged("itl_high", outside | {"engine_step_seconds_mean": 0.11})
    assert unexplained.cause == "unknown" and "no clear bottleneck" in " ".join(e.text for e in unexplained.evidence)


def test_weights_offloaded_from_a_gpu_with_room_for_them_are_said_with_the_utilization_that_keeps_the_kv_cache():
    """--cpu-offload-gb 1 with the GPU's memory half free (--gpu-memory-utilization 0.5 on 80 GiB): the weights fit."""
    gib = 2**30
    serving = {"cpu_offload_gib": 1.0, "gpu_memory_utilization": 0.5, "gpu_pcie_busiest_direction_ratio": 0.6}
    j = judged("feature_ineffective", serving | {"gpu_memory_free_bytes": 40.0 * gib, "gpu_memory_free_ratio": 0.5})
    assert j.cause == "cpu_offload"
    assert j.advice == [
        "drop --cpu-offload-gb 1 and raise --gpu-memory-utilization from 0.50 to 0.51: the GPU has room for the weights, and reading them "
        "over PCIe slows every step"
    ]
    texts = [e.text for e in j.evidence]
    assert any("keeps 40.0 GiB free (NVML): 40.0x the weights" in t for t in texts) and any("PCIe carries 60% of the link" in t for t in texts), texts
    # a model that does not fit otherwise: the offload is what lets it serve
    c = CONDITIONS_BY_ID["feature_ineffective"]
    full = Judge(serving | {"gpu_memory_free_bytes": 0.5 * gib, "gpu_memory_free_ratio": 0.006}, {t.name: t.default for t in c.thresholds}, "tiny/0")
    assert not c.predicate(full).holds and full.cause is None
    without = Judge(serving | {"cpu_offload_gib": 0.0, "gpu_memory_free_bytes": 40.0 * gib}, {t.name: t.default for t in c.thresholds}, "tiny/0")
    assert not c.predicate(without).holds and any("no --cpu-offload-gb" in e.text for e in without.evidence)
