"""Features vLLM was started with that do not pay: prefix caching that stopped hitting or never hit, speculative
decoding that is not accepted, CUDA graphs turned off while the GPU waits for the host, KV offloading that stores
and never loads back, weights offloaded to host memory from a GPU with room for them."""

from __future__ import annotations

from ..condition import Condition, Threshold
from ..judge import Judge, Term, all_of, sm_activity_words


def _prefix_cache_in_use(j: Judge) -> Term:
    """Prefix caching on and looked up: holds, or the term that says why not."""
    enabled = j.value("prefix_caching_enabled")
    on = j.fact(None if enabled is None else enabled > 0, f"prefix caching is {'on' if enabled else 'off'}", "prefix_caching_enabled", enabled)
    if on.holds is not True:
        return on
    return j.compare("prefix_cache_queries_per_second", ">", "queries_per_second_min", "prefix-cache queries per second")


def _prefix_cache_ineffective(j: Judge) -> Term:
    in_use = _prefix_cache_in_use(j)
    if in_use.holds is not True:
        return in_use
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
    meaning=(
        "The prefix cache has hit since vLLM started but now almost never does: pressure evicts cached blocks before reuse, "
        "or the traffic changed. From vLLM 0.11.1 its hit and query counters leave out a preempted request's recompute "
        "(vllm#25787); before, a thrashing server counted its own recompute as hits (preemption_storm beside it says so)."
    ),
    next_actions=(
        "The cache hit before and stopped: KV pressure evicts the shared prefixes (see kv_cache_saturated), or the "
        "traffic changed (a new system prompt, a router that no longer keeps a user's requests on this replica).",
        "Never judged on a cache that never hit: feature_ineffective says that one (a shared prefix shorter than a block, or unique prompts).",
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


BUSY_THREAD_MIN = 0.5  # of a core: an engine core thread this busy is said to spend it launching kernels


def _cuda_graphs_off(j: Judge) -> Term:
    """CUDA graphs turned off on vLLM's command line while it serves and its GPU waits: each step's kernels are launched
    one by one from Python, where a graph would replay them in one launch."""
    graphs = j.signals.get("cuda_graphs_enabled")
    if graphs is None:
        return j.fact(False, "whether vLLM captures CUDA graphs cannot be read: its command line is not visible (the process source)", "cuda_graphs_enabled")
    if graphs > 0:
        return j.fact(False, "CUDA graphs are on: vLLM's command line does not turn them off", "cuda_graphs_enabled", graphs)
    if j.signals.get("gpu_sm_activity_ratio") is None:
        return j.fact(False, "CUDA graphs are off, but no GPU reading says whether the GPU waits for the host", "gpu_sm_activity_ratio")
    off = all_of(
        j.fact(True, "CUDA graphs are off: --enforce-eager (or cudagraph_mode NONE) on vLLM's command line", "cuda_graphs_enabled", graphs),
        j.compare("requests_running_mean", ">", "running_min", "requests running (window mean)"),
        j.compare("gpu_sm_activity_ratio", "<", "graphs_sm_activity_max", sm_activity_words(j), upper=1.0),
    )
    if off.holds:
        j.cause = "cuda_graphs"
        engine = j.signals.get("host_engine_core_busiest_thread_cpu_ratio_recent")
        if engine is not None and engine >= BUSY_THREAD_MIN:  # an idle thread launches nothing: no such claim
            j.note(
                f"the engine core's busiest thread uses {engine:.2f} of a core launching each step's kernels",
                "host_engine_core_busiest_thread_cpu_ratio_recent",
                engine,
            )
        j.advise("drop --enforce-eager: vLLM then captures CUDA graphs of its decode batch sizes and replays each step in one launch")
    return off


def _kv_offload_unused(j: Judge) -> Term:
    """KV offloading that copies the GPU's KV blocks out to CPU memory and has not once loaded one back since vLLM
    started: what it stores is never asked for again (prompts that do not return once they leave the GPU's cache)."""
    stores = j.signals.get("kv_offload_store_bytes_per_second")
    if stores is None:
        return j.fact(False, "KV offloading is off (vLLM exports no offload counters)", "kv_offload_store_bytes_per_second")
    unused = all_of(
        j.compare("kv_offload_store_bytes_per_second", ">", "offload_stores_min", "bytes offloaded from the GPU's KV cache per second"),
        j.compare("kv_offload_loads_since_start_bytes", "<=", "offload_loads_max", "bytes loaded back from the offload tier since vLLM started"),
    )
    if unused.holds:
        size = j.signals.get("kv_offload_size_gib")
        if size:
            j.note(f"--kv-offloading-size {size:g}: {size:g} GiB of host memory hold blocks no request has come back for", "kv_offload_size_gib", size)
        if j.signals.get("prefix_caching_enabled") == 0:
            j.note("prefix caching is off: offloaded blocks are found again by prefix match", "prefix_caching_enabled", 0.0)
            j.advise("turn prefix caching back on (drop --no-enable-prefix-caching): offloaded blocks are found again by prefix match")
        else:
            j.advise("drop --kv-offloading-size (or the offloading connector) where prompts do not return: each copy out costs PCIe bandwidth and host memory")
    return unused


GIB = 2**30


def _cpu_offload_unneeded(j: Judge) -> Term:
    """--cpu-offload-gb on a GPU that keeps more memory free than the weights it leaves in host memory: every forward
    pass reads those weights over PCIe (vLLM's UVA offloader), and the GPU had room for them."""
    offload = j.signals.get("cpu_offload_gib")
    if offload is None:
        return j.fact(False, "whether vLLM offloads weights cannot be read: its command line is not visible (the process source)", "cpu_offload_gib")
    if offload <= 0:
        return j.fact(False, "no --cpu-offload-gb on vLLM's command line: every weight is on the GPU", "cpu_offload_gib", offload)
    free = j.signals.get("gpu_memory_free_bytes")
    if free is None:
        return j.fact(None, f"--cpu-offload-gb {offload:g}, but no GPU reading says whether the GPU has room for those weights", "gpu_memory_free_bytes")
    room = free / (offload * GIB)
    unneeded = all_of(
        j.fact(
            True,
            f"--cpu-offload-gb {offload:g}: vLLM is asked to keep {offload:g} GiB of weights per GPU in host memory, read over PCIe at every forward pass",
            "cpu_offload_gib",
            offload,
        ),
        j.fact(
            room >= j.thresholds["offload_room_min"],
            f"the GPU keeps {free / GIB:.1f} GiB free (NVML): {room:.1f}x the weights it offloads",
            "gpu_memory_free_bytes",
            free,
        ),
    )
    if unneeded.holds:
        pcie = j.signals.get("gpu_pcie_busiest_direction_ratio")
        cost = "reading them over PCIe slows every step"
        if pcie is not None and pcie >= j.thresholds["offload_pcie_min"]:
            j.note(
                f"PCIe carries {pcie:.0%} of the link in its busier direction (window mean): the weights cross it at every step",
                "gpu_pcie_busiest_direction_ratio",
                pcie,
            )
        elif pcie is not None:
            # measured so on an H100 with vLLM 0.26: the same GPU memory and PCIe traffic with and without the flag
            cost = "the flag holds host memory and saves the GPU nothing it needed"
            j.note(
                f"PCIe carries only {pcie:.1%} of the link (window mean): no weights are seen crossing it, so the flag holds host "
                "memory and saves the GPU nothing",
                "gpu_pcie_busiest_direction_ratio",
                pcie,
            )
        utilization, free_ratio = j.signals.get("gpu_memory_utilization"), j.signals.get("gpu_memory_free_ratio")
        raised = ""
        if utilization is not None and free_ratio:
            # the KV cache keeps its size when vLLM's share of the GPU grows by what the weights take back
            raised = f" and raise --gpu-memory-utilization from {utilization:.2f} to {utilization + offload * GIB * free_ratio / free:.2f}"
        j.advise(f"drop --cpu-offload-gb {offload:g}{raised}: the GPU has room for the weights, and {cost}")
    return unneeded


def _feature_ineffective(j: Judge) -> Term:
    # Several can hold at once (an eager server that offloads): graphs lead, the costliest measured (--cpu-offload-gb cost
    # an eager 1B model nothing measurable on an H100), and the others' notes and advice stand beside them.
    graphs = _cuda_graphs_off(j)
    weights = _cpu_offload_unneeded(j)
    offload = _kv_offload_unused(j)
    if graphs.holds:
        return graphs
    if weights.holds:
        j.cause = "cpu_offload"
        return weights
    if offload.holds:
        j.cause = "kv_offload"
        return offload
    in_use = _prefix_cache_in_use(j)
    if in_use.holds is not True:
        return in_use
    # A cache that hit before and stopped is prefix_cache_ineffective's (eviction, changed traffic); this one never did.
    never = j.compare("prefix_cache_hits_since_start", "<=", "hits_since_start_max", "prefix-cache hits (tokens) since vLLM started")
    if never.holds is not True:
        return never
    j.cause = "prefix_caching"
    block = j.signals.get("block_size_tokens")
    size = f"{block:.0f}" if block is not None else "--block-size"
    j.note(
        f"vLLM caches whole blocks of {size} tokens: prompts that share fewer than {size} tokens from their start (a short system "
        f"prompt) never hit, and unique prompts never do",
        "block_size_tokens",
        block,
    )
    prompt = j.signals.get("prompt_tokens_mean")
    if prompt is not None:
        j.note(f"prompts are {prompt:.0f} tokens long on average", "prompt_tokens_mean", prompt)
    if block is not None and block > 16:
        j.advise(f"--block-size 16 (now {block:.0f}): a shared prefix of 16 tokens or more is then cached, where the GPU backend allows it")
    return never


FEATURE_INEFFECTIVE = Condition(
    id="feature_ineffective",
    precedence=195,
    layer="1",
    severity="info",
    summary=(
        "A feature of vLLM does not pay: prefix caching has never hit, KV offloading never loads back, CUDA graphs are off "
        "while the GPU waits, or weights are offloaded to a GPU with room for them"
    ),
    meaning=(
        "prefix_caching: prefix caching is on and every prompt is looked up, but not one token has been served from the "
        "cache since vLLM started. vLLM caches whole KV blocks: a prefix shared by the prompts but shorter than one block "
        "(--block-size) is never reused, so the feature costs its hashing and saves nothing. Unique prompts give the same "
        "picture. vLLM 0.11.1 and later do not count a preempted request's recompute as hits (vllm#25787: measured, no hit "
        "at about 5 preemptions a second on 0.32); older versions do, which can hide a cache that never shared a prefix. "
        "cuda_graphs: vLLM's command line turns CUDA graphs off (--enforce-eager) while it serves and its GPU's "
        "SMs are mostly idle: every step launches each kernel from Python. Where its command line is not visible, this "
        "cannot be read, and the verdict says so. kv_offload: KV offloading (--kv-offloading-size, or an offloading "
        "connector) copies the GPU's KV blocks out to CPU memory, and not one has been loaded back since vLLM started: "
        "the prompts do not return once they leave the GPU's cache, so every copy costs PCIe bandwidth and host memory "
        "and saves nothing. cpu_offload: --cpu-offload-gb asks vLLM to keep part of the weights in host memory, read "
        "over PCIe at every forward pass, while the GPU keeps more memory free than those weights take: the flag saves "
        "GPU memory that was not needed, and either slows every step (PCIe busy) or does nothing but hold host memory "
        "(PCIe quiet, as measured with vLLM 0.26 on an H100)."
    ),
    next_actions=(
        "cause=prefix_caching: Where the prompts share a system prompt or a document, make the shared part at least one "
        "block: lower --block-size (16 on GPUs) or put more of what is shared at the start of the prompt.",
        "cause=prefix_caching: Where the prompts share nothing, prefix caching cannot help: --no-enable-prefix-caching saves its bookkeeping.",
        "cause=cuda_graphs: Drop --enforce-eager (or cudagraph_mode NONE): CUDA graphs replay a decode step in one launch. "
        "Startup takes longer and the graphs hold some GPU memory; keep eager mode only to debug.",
        "cause=cpu_offload: Drop --cpu-offload-gb where the GPU keeps more memory free than the weights it leaves in host "
        "memory (the advice computes the --gpu-memory-utilization that keeps the KV cache's size): vLLM reads those "
        "weights over PCIe at every forward pass. Keep it only where the model does not fit otherwise.",
        "cause=kv_offload: Where prompts do not come back (unique requests, no chat history or shared documents), drop "
        "--kv-offloading-size: offloading pays only for prompts that return after the GPU's cache evicted them. Where "
        "they do come back, check that prefix caching is on (offloaded blocks are found by prefix match) and that they "
        "return within what the offload size holds.",
    ),
    predicate=_feature_ineffective,
    reads=(
        "prefix_cache_hits_since_start",
        "prefix_cache_queries_per_second",
        "prefix_caching_enabled",
        "block_size_tokens",
        "prompt_tokens_mean",
        "cuda_graphs_enabled",
        "requests_running_mean",
        "gpu_sm_activity_ratio",
        "gpu_sm_activity_from_gpm",
        "host_engine_core_busiest_thread_cpu_ratio_recent",
        "kv_offload_store_bytes_per_second",
        "kv_offload_loads_since_start_bytes",
        "kv_offload_size_gib",
        "cpu_offload_gib",
        "gpu_memory_free_bytes",
        "gpu_memory_free_ratio",
        "gpu_memory_utilization",
        "gpu_pcie_busiest_direction_ratio",
    ),
    thresholds=(
        Threshold("queries_per_second_min", 0.0, "prefix-cache queries per second above this"),
        Threshold("hits_since_start_max", 0.0, "prefix-cache hits since vLLM started at most this"),
        Threshold("running_min", 0.0, "cuda_graphs: mean running requests above this (serving)"),
        Threshold("graphs_sm_activity_max", 0.4, "cuda_graphs: GPU SM activity below this (the GPU waits for the host)", 0.0, 1.0),
        Threshold("offload_stores_min", 0.0, "kv_offload: bytes offloaded per second above this (offloading at work)"),
        Threshold("offload_loads_max", 0.0, "kv_offload: bytes loaded back since vLLM started at most this"),
        Threshold("offload_room_min", 1.0, "cpu_offload: the GPU's free memory over the weights --cpu-offload-gb leaves in host memory at or above this"),
        Threshold(
            "offload_pcie_min",
            0.05,
            "cpu_offload: PCIe (busier direction, share of the link) at or above which offloaded weights are said to cross it",
            0.0,
            1.0,
        ),
    ),
    causes=("cuda_graphs", "cpu_offload", "kv_offload", "prefix_caching"),
    for_seconds=300,
    clear_seconds=60,
    dont=("Do not turn prefix caching off before checking how long the shared part of the prompts is: one block more and it pays.",),
)
