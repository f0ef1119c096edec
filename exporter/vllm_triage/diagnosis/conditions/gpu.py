"""Layer 3: the conditions judged per GPU on NVML/GPM readings, each entry beside its predicate."""

from __future__ import annotations

from ...model import GPU_SOURCE
from ..condition import Condition, Threshold
from ..judge import Judge, Term, all_of, any_of


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
    tensor = j.compare("gpu_tensor_active_ratio_mean", ">=", "tensor_min", "tensor-core activity (window mean)", upper=1.0)
    cores = all_of(
        j.compare("gpu_sm_active_ratio_mean", ">=", "sm_active_min", "GPM SM active (window mean)", upper=1.0),
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
    reads=("gpu_tensor_active_ratio_mean", "gpu_sm_active_ratio_mean", "gpu_dram_bandwidth_utilization_ratio_mean"),
    causes=("tensor_cores", "cuda_cores"),
    dont=("Do not chase CPU or scheduler settings: the GPU is the limit and it is working.",),
    thresholds=(
        Threshold("tensor_min", 0.6, "tensor-core activity at or above this", 0.0, 1.0),
        Threshold("sm_active_min", 0.8, "GPM SM active at or above this", 0.0, 1.0),
        Threshold("dram_max", 0.7, "with DRAM bandwidth below this", 0.0, 1.0),
    ),
    sources=(GPU_SOURCE,),
    scope_kind="gpu",
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


CONDITIONS: tuple[Condition, ...] = (
    GPU_BUSY_NOT_COMPUTING,
    MEMORY_BANDWIDTH_BOUND,
    COMPUTE_BOUND,
    PCIE_SATURATED,
    PCIE_LINK_DEGRADED,
    GPU_THROTTLED,
)
