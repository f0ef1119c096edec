"""Features vLLM was started with that do not pay: prefix caching that does not hit, speculative decoding
that is not accepted."""

from __future__ import annotations

from ..condition import Condition, Threshold
from ..judge import Judge, Term


def _prefix_cache_ineffective(j: Judge) -> Term:
    enabled = j.value("prefix_caching_enabled")
    on = j.fact(None if enabled is None else enabled > 0, f"prefix caching is {'on' if enabled else 'off'}", "prefix_caching_enabled", enabled)
    if on.holds is not True:
        return on
    queried = j.compare("prefix_cache_queries_per_second", ">", "queries_per_second_min", "prefix-cache queries per second")
    if queried.holds is not True:
        return queried
    # Only a cache that has hit before and stopped hitting is ineffective; one that never hit serves
    # prompts that share no prefix (random or unique prompts), which is expected, not a fault.
    ever = j.value("prefix_cache_hits_since_start")
    if ever is not None and ever <= 0:
        return j.fact(False, "no prompt has reused a cached prefix since vLLM started: expected for unique prompts", "prefix_cache_hits_since_start", ever)
    computed = j.signals.get("prompt_tokens_local_compute_ratio")
    if computed is not None:
        j.note(f"{computed:.0%} of the window's prompt tokens were computed here, not served from a cache", "prompt_tokens_local_compute_ratio", computed)
    external = j.signals.get("external_prefix_cache_hit_ratio")
    if external is not None:
        j.note(f"the external prefix cache (KV connector) hit {external:.0%} of its queries", "external_prefix_cache_hit_ratio", external)
    if j.signals.get("prompt_tokens_cached_ratio") is not None:  # token-level, local and external caches (vLLM 0.11+)
        return j.compare("prompt_tokens_cached_ratio", "<", "hit_ratio_max", "share of prompt tokens served from a cache", upper=1.0)
    return j.compare("prefix_cache_hit_ratio", "<", "hit_ratio_max", "prefix-cache hit ratio", upper=1.0)


PREFIX_CACHE_INEFFECTIVE = Condition(
    id="prefix_cache_ineffective",
    precedence=190,
    layer="1",
    severity="info",
    summary="Prefix caching stopped hitting",
    meaning="The prefix cache has hit since vLLM started but now almost never does: pressure evicts cached blocks before reuse, or the traffic changed.",
    next_actions=(
        "The cache hit before and stopped: KV pressure evicts the shared prefixes (see kv_cache_saturated), or the "
        "traffic changed (a new system prompt, a router that no longer keeps a user's requests on this replica).",
        "Never judged on a cache that never hit: that is expected for unique prompts.",
    ),
    predicate=_prefix_cache_ineffective,
    reads=(
        "prompt_tokens_cached_ratio",
        "prefix_cache_hit_ratio",
        "prefix_cache_queries_per_second",
        "prefix_caching_enabled",
        "prefix_cache_hits_since_start",
        "prompt_tokens_local_compute_ratio",
        "external_prefix_cache_hit_ratio",  # only where a KV connector shares a cache: last, the drill-down shows the first
    ),
    thresholds=(
        Threshold("queries_per_second_min", 0.0, "prefix-cache queries per second above this"),
        Threshold("hit_ratio_max", 0.05, "hit ratio below this", 0.0, 1.0),
    ),
    for_seconds=300,
    clear_seconds=300,
)


def _spec_decode_ineffective(j: Judge) -> Term:
    if j.signals.get("spec_decode_drafts_per_second") is None:
        return j.fact(False, "speculative decoding is off (vLLM exports no draft counters)", "spec_decode_drafts_per_second")
    drafting = j.compare("spec_decode_drafts_per_second", ">", "drafts_per_second_min", "drafts proposed per second")
    if drafting.holds is not True:
        return drafting
    low = j.compare("spec_decode_acceptance_ratio", "<", "acceptance_ratio_max", "accepted / proposed draft tokens", upper=1.0)
    yielded = j.signals.get("spec_decode_tokens_per_draft")
    if yielded is not None:
        j.note(f"each verification step yields {yielded:.2f} tokens (1 is what decoding without a draft gives)", "spec_decode_tokens_per_draft", yielded)
    return low


SPEC_DECODE_INEFFECTIVE = Condition(
    id="spec_decode_ineffective",
    precedence=180,
    layer="1",
    severity="info",
    summary="Speculative decoding's drafts are mostly rejected: it costs more than it saves",
    meaning=(
        "Each draft costs a pass of the draft model and a verification of all its tokens by the target model; when few "
        "draft tokens are accepted, decoding is slower than without speculation (higher inter-token latency, less throughput)."
    ),
    next_actions=(
        "Lower num_speculative_tokens in --speculative-config (fewer wasted tokens per draft).",
        "Use a draft aligned with the target (same family, distilled; EAGLE heads trained for it); n-gram drafts only for repetitive text.",
        "Compare inter-token latency with speculative decoding off for this traffic; keep it only where acceptance is high.",
    ),
    predicate=_spec_decode_ineffective,
    reads=("spec_decode_acceptance_ratio", "spec_decode_drafts_per_second", "spec_decode_tokens_per_draft"),
    thresholds=(
        Threshold("drafts_per_second_min", 0.1, "drafts proposed per second above this (speculation in use)"),
        Threshold("acceptance_ratio_max", 0.3, "accepted / proposed draft tokens below this", 0.0, 1.0),
    ),
    for_seconds=120,
    clear_seconds=120,
)
