"""Hand-written vLLM /metrics pages for unit tests, in today's names or V0's.

They carry only the families the conditions read; the real 0.32.0 pages are in ../shared/fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_triage.model import VLLM_SOURCE, Reading
from vllm_triage.sources.vllm import parse_page

TTFT_BOUNDS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFILL_BOUNDS = (*TTFT_BOUNDS, 20.0, 40.0, 80.0)


@dataclass
class Counters:
    """Cumulative counters of a fake engine; tests advance them between pages."""

    preemptions: float = 0.0
    finished: float = 0.0
    errors: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    ttft: list[float] = field(default_factory=list)  # every observation so far
    prefill: list[float] = field(default_factory=list)  # request prefill times so far (the histogram appears with the first)
    itl: list[float] = field(default_factory=list)  # inter-token latencies so far (likewise)
    prompt_lengths: list[float] = field(default_factory=list)  # prompt tokens of finished requests (likewise)
    steps: float = 0.0  # engine steps so far (vllm:iteration_tokens_total's count; the histogram appears with the first)
    step_tokens: float = 0.0  # tokens of those steps


def page(
    running: float,
    waiting: float,
    kv: float,
    c: Counters,
    v0: bool = False,
    model: str = "m",
    engine: str = "0",
    blocks: int = 1000,
    block_size: int = 16,
    deferred: float | None = None,  # of the waiting, deferred by vLLM (num_requests_waiting_by_reason, 0.26+)
) -> str:
    labels = f'model_name="{model}"' if v0 else f'engine="{engine}",model_name="{model}"'
    kv_name = "vllm:gpu_cache_usage_perc" if v0 else "vllm:kv_cache_usage_perc"
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}",
        f"# TYPE {kv_name} gauge",
        f"{kv_name}{{{labels}}} {kv}",
        "# TYPE vllm:num_preemptions counter",
        f"vllm:num_preemptions_total{{{labels}}} {c.preemptions}",
        f"vllm:num_preemptions_created{{{labels}}} 1.7e9",
        "# TYPE vllm:request_success counter",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {c.finished - c.errors}',
        f'vllm:request_success_total{{{labels},finished_reason="error"}} {c.errors}',
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{labels}}} {c.prompt_tokens}",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{labels}}} {c.generation_tokens}",
    ]
    lines += _histogram("vllm:time_to_first_token_seconds", labels, c.ttft, TTFT_BOUNDS)
    if deferred is not None:
        lines.append("# TYPE vllm:num_requests_waiting_by_reason gauge")
        lines.append(f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {waiting - deferred}')
        lines.append(f'vllm:num_requests_waiting_by_reason{{{labels},reason="deferred"}} {deferred}')
    if c.prefill:
        lines += _histogram("vllm:request_prefill_time_seconds", labels, c.prefill, PREFILL_BOUNDS)
    if c.itl:
        lines += _histogram("vllm:inter_token_latency_seconds", labels, c.itl, TTFT_BOUNDS)
    if c.steps:
        lines.append("# TYPE vllm:iteration_tokens_total histogram")
        lines.append(f'vllm:iteration_tokens_total_bucket{{{labels},le="+Inf"}} {c.steps}')
        lines.append(f"vllm:iteration_tokens_total_sum{{{labels}}} {c.step_tokens}")
        lines.append(f"vllm:iteration_tokens_total_count{{{labels}}} {c.steps}")
    if c.prompt_lengths:
        lines += _histogram("vllm:request_prompt_tokens", labels, c.prompt_lengths, (100.0, 1000.0, 10000.0))
    if not v0:
        lines.append("# TYPE vllm:cache_config_info gauge")
        lines.append(f'vllm:cache_config_info{{block_size="{block_size}",enable_prefix_caching="True",engine="{engine}",num_gpu_blocks="{blocks}"}} 1.0')
    return "\n".join(lines) + "\n"


def _histogram(name: str, labels: str, observations: list[float], bounds: tuple[float, ...]) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    for bound in bounds:
        count = sum(1 for x in observations if x <= bound)
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {len(observations)}')
    lines.append(f"{name}_sum{{{labels}}} {sum(observations)}")
    lines.append(f"{name}_count{{{labels}}} {len(observations)}")
    return lines


def reading(t: float, text: str) -> Reading:
    samples, facts = parse_page(text)
    return Reading(VLLM_SOURCE, t, True, samples, meta=facts)


def failed(t: float, reason: str = "connect") -> Reading:
    return Reading(VLLM_SOURCE, t, False, error=f"cannot reach vLLM ({reason})", error_reason=reason)
