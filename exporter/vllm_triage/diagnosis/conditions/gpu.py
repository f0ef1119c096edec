"""Layer 3: the conditions judged per GPU on NVML/GPM readings, each entry beside its predicate."""

from __future__ import annotations

from collections.abc import Mapping

from ...model import GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE
from ..condition import Condition, Threshold
from ..judge import Judge, Term, all_of, any_of, sm_activity_words


def _gpu_busy_not_computing(j: Judge) -> Term:
    if j.signals.get("gpu_sm_active_ratio_mean") is None:
        return j.fact(None, "needs GPM SM activity: util.gpu alone cannot tell copying from computing", "gpu_sm_active_ratio_mean")
    return all_of(
        j.compare("gpu_utilization_ratio_mean", ">=", "utilization_min", "util.gpu (window mean)", upper=1.0),
        j.compare("gpu_sm_active_ratio_mean", "<=", "sm_active_max", "GPM SM active (window mean)", upper=1.0),
    )


GPU_BUSY_NOT_COMPUTING = Condition(
    id="gpu_busy_not_computing",
    precedence=110,
    suppressed_by=(("communication_bound", "in a tensor-parallel group the resident kernels are collectives waiting on the interconnect"),),
    layer="3",
    severity="warning",
    summary="The GPU looks busy (util.gpu) but its SMs are idle",
    meaning="util.gpu counts time any kernel or copy ran; GPM shows the SMs doing little: the GPU is moving data, not computing.",
    next_actions=(
        "Check PCIe traffic (pcie_saturated), CPU offloading (--cpu-offload-gb), KV offload, swap, unpinned host memory.",
        "Look for synchronisations and host<->device copies in a torch profiler trace.",
    ),
    predicate=_gpu_busy_not_computing,
    reads=("gpu_utilization_ratio_mean", "gpu_sm_active_ratio_mean"),
    dont=("Do not read util.gpu = 100 % as 'the GPU is saturated': it counts time any kernel or copy ran.",),
    thresholds=(
        Threshold("utilization_min", 0.9, "util.gpu window mean at or above this", 0.0, 1.0),
        Threshold("sm_active_max", 0.3, "GPM SM active window mean at or below this", 0.0, 1.0),
    ),
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
)


def _memory_bandwidth_bound(j: Judge) -> Term:
    return all_of(
        j.compare("gpu_dram_bandwidth_utilization_ratio_mean", ">=", "dram_min", "DRAM bandwidth utilisation (window mean)", upper=1.0),
        j.compare("gpu_tensor_active_ratio_mean", "<", "tensor_max", "tensor-core activity (window mean)", upper=1.0),
    )


MEMORY_BANDWIDTH_BOUND = Condition(
    id="memory_bandwidth_bound",
    precedence=150,
    layer="3",
    severity="info",
    summary="The GPU is limited by memory bandwidth",
    meaning="DRAM bandwidth is near its limit while tensor cores idle: typical of decode at small batch.",
    next_actions=(
        "Raise concurrency (bigger decode batches reuse each weight read), fp8 weights or KV cache, speculative decoding.",
        "Use Nsight Compute (ncu) for kernel detail.",
    ),
    predicate=_memory_bandwidth_bound,
    reads=("gpu_dram_bandwidth_utilization_ratio_mean", "gpu_tensor_active_ratio_mean"),
    thresholds=(
        Threshold("dram_min", 0.7, "DRAM bandwidth utilisation at or above this", 0.0, 1.0),
        Threshold("tensor_max", 0.3, "tensor-core activity below this", 0.0, 1.0),
    ),
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
)


def _compute_bound(j: Judge) -> Term:
    # At the limit over the window and still now: a window mean holds a minute of matmuls after they stopped.
    tensor = all_of(
        j.compare("gpu_tensor_active_ratio_mean", ">=", "tensor_min", "tensor-core activity (window mean)", upper=1.0),
        j.compare("gpu_tensor_active_ratio_recent", ">=", "tensor_min", "tensor-core activity (last 10 s)", upper=1.0),
    )
    cores = all_of(
        j.compare("gpu_sm_active_ratio_mean", ">=", "sm_active_min", "GPM SM active (window mean)", upper=1.0),
        j.compare("gpu_sm_active_ratio_recent", ">=", "sm_active_min", "GPM SM active (last 10 s)", upper=1.0),
        j.compare("gpu_dram_bandwidth_utilization_ratio_mean", "<", "dram_max", "DRAM bandwidth utilisation (window mean)", upper=1.0),
    )
    verdict = any_of(tensor, cores)
    if tensor.holds:
        j.cause = "tensor_cores"
    elif verdict.holds:
        j.cause = "cuda_cores"
        j.note("cause cuda_cores: the SMs are busy while the tensor cores idle: fp32 math without TF32 (or fp64 off the tensor path)")
    return verdict


COMPUTE_BOUND = Condition(
    id="compute_bound",
    precedence=160,
    layer="3",
    severity="info",
    summary="The GPU is doing useful work at its compute limit",
    meaning="Tensor cores or SMs are busy and memory bandwidth is not the limit.",
    next_actions=(
        "cause=tensor_cores: the GPU is the bottleneck and it is working: scale out (replicas, tensor parallelism) or use a faster GPU.",
        "cause=cuda_cores: move the math onto the tensor cores first: bf16/fp16 weights and activations, or TF32 for fp32 "
        "(torch.backends.cuda.matmul.allow_tf32 = True); only then scale out.",
    ),
    predicate=_compute_bound,
    reads=(
        "gpu_tensor_active_ratio_mean",
        "gpu_tensor_active_ratio_recent",
        "gpu_sm_active_ratio_mean",
        "gpu_sm_active_ratio_recent",
        "gpu_dram_bandwidth_utilization_ratio_mean",
    ),
    causes=("tensor_cores", "cuda_cores"),
    dont=("Do not chase CPU or scheduler settings: the GPU is the limit and it is working.",),
    thresholds=(
        Threshold("tensor_min", 0.6, "tensor-core activity at or above this", 0.0, 1.0),
        Threshold("sm_active_min", 0.8, "GPM SM active at or above this", 0.0, 1.0),
        Threshold("dram_max", 0.7, "with DRAM bandwidth below this", 0.0, 1.0),
    ),
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
    # The window's tensor mean crosses 0.6 about 32 s into a saturating load (the wide model at 384 clients): 20 s on
    # top is 52 s. Outside a phase that keeps the tensor cores busy it holds at most 12 s (prefill-heavy bursts on the
    # H200, another program's matmuls ending on the H100: bench.detection_latency).
    for_seconds=20,
)


def _pcie_saturated(j: Judge) -> Term:
    capacity = j.signals.get("gpu_pcie_link_capacity_bytes_per_second")
    if capacity:
        j.note(
            f"link capacity {capacity / 1e9:.1f} GB/s per direction at the current generation and width",
            "gpu_pcie_link_capacity_bytes_per_second",
            capacity,
        )
    return j.compare("gpu_pcie_busiest_direction_ratio", ">=", "link_ratio_min", "PCIe throughput / link capacity (busier direction)", upper=1.0)


PCIE_SATURATED = Condition(
    id="pcie_saturated",
    precedence=100,
    layer="3",
    severity="warning",
    summary="Host<->GPU copies fill the PCIe link",
    meaning="PCIe throughput in one direction is near the link's capacity.",
    next_actions=("CPU<->GPU copies dominate: check KV/CPU offload, swap space, unpinned memory; prefer zero-copy or keeping data on the GPU.",),
    predicate=_pcie_saturated,
    reads=("gpu_pcie_busiest_direction_ratio", "gpu_pcie_link_capacity_bytes_per_second"),
    thresholds=(Threshold("link_ratio_min", 0.7, "throughput / link capacity at or above this", 0.0, 1.0),),
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
)


def _pcie_link_degraded(j: Judge) -> Term:
    busy = j.value("gpu_busy_ratio")
    if busy is not None and j.signals.get("gpu_pcie_link_degraded_while_busy_ratio") is None:
        return j.fact(False, "the GPU was not busy in the window: links downtrain at idle on purpose", "gpu_busy_ratio", busy)
    return j.compare(
        "gpu_pcie_link_degraded_while_busy_ratio", ">=", "degraded_ratio_min", "share of busy samples with the link below max gen/width", upper=1.0
    )


PCIE_LINK_DEGRADED = Condition(
    id="pcie_link_degraded",
    precedence=90,
    layer="3",
    severity="warning",
    summary="The PCIe link runs below its maximum generation or width while the GPU is busy",
    meaning="Under load the link should train to its maximum; a lower generation or width cuts host<->GPU bandwidth.",
    next_actions=("Hardware or BIOS: reseat the GPU, check the riser and slot, report to the node owner.",),
    predicate=_pcie_link_degraded,
    reads=("gpu_pcie_link_degraded_while_busy_ratio", "gpu_busy_ratio"),
    thresholds=(Threshold("degraded_ratio_min", 0.5, "share of busy samples with a degraded link at or above this", 0.0, 1.0),),
    for_seconds=300,
    clear_seconds=60,
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
)


def _gpu_throttled(j: Judge) -> Term:
    cap = j.signals.get("gpu_clock_event_sw_power_cap_ratio")
    if cap:
        j.note(f"SW power cap set {cap:.0%} of the window: normal at full load, not counted", "gpu_clock_event_sw_power_cap_ratio", cap)
    return j.compare("gpu_throttled_ratio", ">=", "throttled_ratio_min", "share of the window with HW slowdown/thermal/power-brake clocks", upper=1.0)


GPU_THROTTLED = Condition(
    id="gpu_throttled",
    precedence=80,
    layer="3",
    severity="warning",
    summary="GPU clocks are braked by hardware slowdown, heat or power",
    meaning="HW slowdown, HW/SW thermal or HW power-brake clock events were set for a large share of the window.",
    next_actions=("Check cooling, power delivery and power limit settings (nvidia-smi -q -d PERFORMANCE).",),
    predicate=_gpu_throttled,
    reads=("gpu_throttled_ratio", "gpu_clock_event_sw_power_cap_ratio"),
    thresholds=(Threshold("throttled_ratio_min", 0.3, "share of the window braked at or above this", 0.0, 1.0),),
    clear_seconds=120,
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
)


def _tensor_parallel_group(j: Judge) -> Term:
    """The rank map places this GPU in a tensor-parallel group of two or more (its peers are that group's GPUs); else it
    shows one engine whose model is split over two or more GPUs: the watched GPUs are its group."""
    if j.signals.get("gpu_tensor_parallel_size") is not None:
        return j.compare("gpu_tensor_parallel_size", ">=", "tensor_parallel_min", "GPUs in its tensor-parallel group (the rank map)")
    group = j.compare("vllm_tensor_parallel_size", ">=", "tensor_parallel_min", "tensor-parallel size (vLLM's worker titles)")
    engines = j.signals.get("vllm_parallel_engines")
    if group.holds and engines is not None and engines > 1:
        return j.fact(False, f"{engines:.0f} data-parallel engines: one engine's GPUs are not told apart from another's here", "vllm_parallel_engines", engines)
    return group


def _tp_straggler(j: Judge) -> Term:
    group = _tensor_parallel_group(j)
    if not group.holds:
        return group
    lags = []
    if j.signals.get("gpu_sm_clock_to_peers_ratio") is not None:
        lags.append(j.compare("gpu_sm_clock_to_peers_ratio", "<=", "clock_to_peers_max", "SM clock over the median of its peers' (window means)"))
    if j.signals.get("gpu_foreign_compute_processes_max") is not None:
        lags.append(
            all_of(
                j.compare("gpu_foreign_compute_processes_max", ">=", "foreign_processes_min", "processes other than vLLM's computing on this GPU"),
                j.compare("gpu_sm_activity_to_peers_ratio", ">=", "activity_to_peers_min", "its SM activity over the median of its peers' (window means)"),
            )
        )
    if not lags:
        return j.fact(None, "no SM clock or compute-process reading to compare the group's GPUs by", "gpu_sm_clock_to_peers_ratio")
    term = all_of(j.compare("gpu_utilization_ratio_mean", ">=", "utilization_min", "util.gpu (window mean): the group is at work", upper=1.0), any_of(*lags))
    if term.holds:
        clock = j.signals.get("gpu_sm_clock_to_peers_ratio")
        if clock is not None and clock <= j.thresholds["clock_to_peers_max"]:
            j.cause = "clocks"
            braked = j.signals.get("gpu_throttled_ratio")
            why = (
                f"HW slowdown/thermal/power brake set {braked:.0%} of the window"
                if braked
                else "no brake reason set: a lower power limit or application clocks"
            )
            j.note(
                f"cause clocks: it runs at {clock:.0%} of its peers' SM clock ({why}); every rank waits for it at each collective",
                "gpu_throttled_ratio",
                braked,
            )
        else:
            j.cause = "foreign_process"
            j.note("cause foreign_process: another program computes on this GPU: its kernels share the SMs with this rank's, and every rank waits for it")
    return term


TP_STRAGGLER = Condition(
    id="tp_straggler",
    precedence=75,
    layer="3",
    severity="warning",
    summary="One GPU of a tensor-parallel group lags: the group runs at its pace",
    meaning=(
        "The ranks of a tensor-parallel group meet in a collective (an all-reduce) at every layer, so the group runs at the "
        "pace of its slowest GPU. This GPU lags its peers while the group works: its SM clock runs below theirs (a brake, a "
        "lower power limit), or another program computes on it and takes SM time from the rank that runs there."
    ),
    next_actions=(
        "cause=clocks: see the GPU's clock reasons (nvidia-smi -q -d PERFORMANCE,POWER): cooling, power delivery, a lower power "
        "limit or application clocks set on this GPU only; move the pod off a GPU that keeps braking.",
        "cause=foreign_process: find the other process on this GPU (nvidia-smi; `/diagnosis` -> discovery.gpu_processes) and "
        "move it away: a GPU of a tensor-parallel vLLM is not shareable without slowing the whole group.",
        "Check `/diagnosis` -> discovery.ranks for which rank runs on this GPU.",
    ),
    predicate=_tp_straggler,
    reads=(
        "gpu_sm_clock_to_peers_ratio",
        "gpu_foreign_compute_processes_max",
        "gpu_sm_activity_to_peers_ratio",
        "gpu_utilization_ratio_mean",
        "gpu_throttled_ratio",
        "gpu_tensor_parallel_size",
        "vllm_tensor_parallel_size",
        "vllm_parallel_engines",
    ),
    thresholds=(
        Threshold("tensor_parallel_min", 2.0, "a tensor-parallel group of at least this many GPUs"),
        Threshold("utilization_min", 0.5, "util.gpu window mean at or above this (the group is at work)", 0.0, 1.0),
        Threshold("clock_to_peers_max", 0.9, "its SM clock at or below this share of its peers' median"),
        Threshold("foreign_processes_min", 1.0, "or at least this many other programs computing on it ..."),
        Threshold("activity_to_peers_min", 1.15, "... while its SM activity is at least this multiple of its peers' median"),
    ),
    sources=(GPU_SOURCE, PROCESS_SOURCE),
    scope_kind="gpu",
    causes=("clocks", "foreign_process"),
    dont=("Do not read the peers' lower SM activity as idle capacity: they wait in the collective for the straggler.",),
)


def _communication_bound(j: Judge) -> Term:
    group = _tensor_parallel_group(j)
    if not group.holds:
        return group
    pcie, nvlink = j.signals.get("gpu_pcie_bytes_per_second"), j.signals.get("gpu_nvlink_bytes_per_second")
    tokens = (j.signals.get("prompt_tokens_per_second") or 0.0) + (j.signals.get("generation_tokens_per_second") or 0.0)
    waiting = all_of(
        j.compare("gpu_utilization_ratio_mean", ">=", "utilization_min", "util.gpu (window mean): kernels resident, collectives among them", upper=1.0),
        j.compare("gpu_sm_activity_ratio", "<=", "sm_activity_max", sm_activity_words(j), upper=1.0),
    )
    if pcie is None and nvlink is None:
        return all_of(waiting, j.fact(None, "no PCIe or NVLink throughput reading to tell collectives apart", "gpu_pcie_bytes_per_second"))
    moved = (pcie or 0.0) + (nvlink or 0.0)
    if tokens <= 0:
        return all_of(waiting, j.fact(False, "no token processed in the window: nothing to share out per token (a stall is engine_wedged's)"))
    per_token = moved / tokens
    limit = j.thresholds["bytes_per_token_min"]
    links = f"PCIe {(pcie or 0.0) / 2**20:.1f} MiB/s" + (f" + NVLink {nvlink / 2**20:.1f} MiB/s" if nvlink is not None else "")
    traffic = j.fact(
        per_token >= limit,
        f"interconnect per processed token {per_token / 1024:.0f} KiB ({links} per GPU / {tokens:.0f} tokens/s) "
        f"{'is' if per_token >= limit else 'is not'} >= {limit / 1024:.0f} KiB (bytes_per_token_min)",
        "gpu_pcie_bytes_per_second",
        pcie,
    )
    term = all_of(waiting, traffic)
    if term.holds:
        if nvlink and nvlink >= (pcie or 0.0):
            j.cause = "nvlink"
            j.note("cause nvlink: the collectives go over NVLink and the SMs wait on them: check NVLink errors and link speed (nvidia-smi nvlink -s -e)")
        else:
            j.cause = "pcie"
            j.note(
                "cause pcie: the collectives go over PCIe, none over NVLink: P2P disabled (NCCL_P2P_DISABLE), no NVLink between these "
                "GPUs, or traffic staged through host memory (IOMMU/ACS); the SMs wait on it"
            )
    return term


COMMUNICATION_BOUND = Condition(
    id="communication_bound",
    precedence=105,
    layer="1+3",
    severity="warning",
    summary="A tensor-parallel group waits on its collectives: interconnect, not compute, paces it",
    meaning=(
        "The GPUs of a tensor-parallel group look busy (kernels resident) while their SMs do little, with the interconnect "
        "carrying the group's all-reduces for every token processed: the ranks spend the step waiting on each other's "
        "data. Typical of collectives over PCIe or through host memory (P2P disabled, no NVLink), or of a degraded link."
    ),
    next_actions=(
        "cause=pcie: check P2P (NCCL_P2P_DISABLE unset; `nvidia-smi topo -m`: NV# between the GPUs, not PHB/SYS), IOMMU/ACS "
        "settings, and NCCL's chosen transport (NCCL_DEBUG=INFO in vLLM's log).",
        "cause=nvlink: check NVLink state and errors (nvidia-smi nvlink -s -e); a link down halves or worse the group's bandwidth.",
        "Use fewer tensor-parallel ranks (a smaller TP with more replicas, or pipeline parallelism across the slow link).",
    ),
    predicate=_communication_bound,
    reads=(
        "gpu_sm_activity_ratio",
        "gpu_pcie_bytes_per_second",
        "gpu_nvlink_bytes_per_second",
        "gpu_utilization_ratio_mean",
        "gpu_sm_activity_from_gpm",
        "prompt_tokens_per_second",
        "generation_tokens_per_second",
        "gpu_tensor_parallel_size",
        "vllm_tensor_parallel_size",
        "vllm_parallel_engines",
    ),
    thresholds=(
        Threshold("tensor_parallel_min", 2.0, "a tensor-parallel group of at least this many GPUs"),
        Threshold("utilization_min", 0.7, "util.gpu window mean at or above this (kernels resident)", 0.0, 1.0),
        Threshold("sm_activity_max", 0.5, "SM activity at or below this (the SMs wait)", 0.0, 1.0),
        Threshold(
            "bytes_per_token_min",
            32768.0,
            "PCIe + NVLink bytes per GPU per processed token at or above this (a TP all-reduce moves about 4 x layers x hidden "
            "bytes per token in bf16: 128 KiB for a 1B Llama)",
        ),
    ),
    sources=(VLLM_SOURCE, GPU_SOURCE, PROCESS_SOURCE),
    causes=("pcie", "nvlink"),
)


def _gpu_shared(j: Judge) -> Term:
    if j.signals.get("gpu_foreign_compute_processes_recent_max") is None and j.signals.get("gpu_sm_activity_ratio") is not None:
        # The GPUs are read, but NVML's pids are not the ones the sidecar sees (another PID namespace: the host's), or it
        # sees no vLLM process: another program cannot be told from vLLM's. Said, not left unknown at every tick.
        return j.fact(False, "NVML's compute processes cannot be matched to vLLM's (no process view, or NVML lists the host's pids)")
    listed = j.compare(
        "gpu_foreign_compute_processes_recent_max",
        ">=",
        "foreign_processes_min",
        "other programs holding a compute context on vLLM's GPU (NVML, the last 10 s)",
    )
    if not listed.holds:
        return listed
    # A context alone takes no SM time (a notebook left open, a driver script that loaded a model once): only kernels do.
    # Where NVML keeps no per-process samples, whether the other program computes is unknown, and said so.
    term = all_of(
        listed,
        j.compare(
            "gpu_foreign_sm_ratio_recent_max", ">=", "foreign_sm_ratio_min", "the GPU's time their kernels ran (NVML's per-process samples, the last 10 s)"
        ),
    )
    if term.holds:
        activity = j.signals.get("gpu_sm_activity_ratio")
        if activity is not None:
            j.note(f"{sm_activity_words(j)} {activity:.2f}: vLLM's kernels and the other program's together", "gpu_sm_activity_ratio", activity)
    return term


def _no_other_program(signals: Mapping[str, float | None]) -> str | None:
    recent = signals.get("gpu_foreign_compute_processes_recent_max")
    return "NVML lists no other program on the GPU for the last 10 s" if recent == 0 else None


GPU_SHARED = Condition(
    id="gpu_shared",
    precedence=65,
    layer="3",
    severity="warning",
    summary="Another program computes on vLLM's GPU",
    meaning=(
        "A process that is neither one of vLLM's processes nor a child of one runs kernels on a GPU vLLM runs on (NVML's "
        "compute processes and per-process samples: a context held open takes memory, not SM time). Its kernels share "
        "the SMs (time-sliced, or MPS) and its memory is not vLLM's: vLLM's steps, and so its "
        "inter-token latency and throughput, slow down while it runs, and a restarted vLLM may not fit."
    ),
    next_actions=(
        "Find the program from its pid in the evidence (ps -o pid,user,args -p PID, or nvidia-smi) and move it off vLLM's GPU: "
        "a job scheduled on the wrong node, a notebook left open, a profiler or benchmark started by hand.",
        "Where the GPU is meant to be shared (time-slicing, MPS), size vLLM for the share it gets: --gpu-memory-utilization, "
        "and expect its latency to follow the other program's load.",
    ),
    predicate=_gpu_shared,
    reads=("gpu_foreign_compute_processes_recent_max", "gpu_foreign_sm_ratio_recent_max", "gpu_sm_activity_ratio", "gpu_sm_activity_from_gpm"),
    thresholds=(
        Threshold("foreign_processes_min", 1.0, "at least this many other programs holding a compute context on the GPU in the last 10 s"),
        Threshold("foreign_sm_ratio_min", 0.05, "... whose kernels ran at least this share of the GPU's time in the last 10 s", 0.0, 1.0),
    ),
    for_seconds=10,
    clear_seconds=30,
    sources=(GPU_SOURCE, PROCESS_SOURCE),
    scope_kind="gpu",
    contradicted=_no_other_program,
    notes=("foreign_gpu", "usual"),
    dont=("Do not count vLLM's own helpers as other programs: a process vLLM started is part of vLLM, whatever its title.",),
)


CONDITIONS: tuple[Condition, ...] = (
    TP_STRAGGLER,
    COMMUNICATION_BOUND,
    GPU_BUSY_NOT_COMPUTING,
    MEMORY_BANDWIDTH_BOUND,
    COMPUTE_BOUND,
    PCIE_SATURATED,
    PCIE_LINK_DEGRADED,
    GPU_THROTTLED,
    GPU_SHARED,
)
