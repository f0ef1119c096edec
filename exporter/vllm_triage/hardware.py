"""Peak dense bf16 tensor throughput and memory bandwidth per GPU model (vendor datasheets, without
sparsity): the ceilings model FLOPs and bytes are measured against. Matched on NVML's device name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuPeak:
    model: str
    bf16_flops_per_second: float
    memory_bytes_per_second: float


# Most specific names first: "H100 NVL" before "H100".
GPU_PEAKS: tuple[tuple[str, GpuPeak], ...] = (
    ("B200", GpuPeak("B200", 2250e12, 8.0e12)),
    ("H200", GpuPeak("H200", 989e12, 4.8e12)),
    ("H100 NVL", GpuPeak("H100 NVL", 835e12, 3.9e12)),
    ("H100 PCIe", GpuPeak("H100 PCIe", 756e12, 2.0e12)),
    ("H100", GpuPeak("H100 SXM", 989e12, 3.35e12)),
    ("H800", GpuPeak("H800 SXM", 989e12, 3.35e12)),
    ("A100-SXM4-80GB", GpuPeak("A100 SXM 80GB", 312e12, 2.039e12)),
    ("A100 80GB PCIe", GpuPeak("A100 PCIe 80GB", 312e12, 1.935e12)),
    ("A100", GpuPeak("A100 40GB", 312e12, 1.555e12)),
    ("L40S", GpuPeak("L40S", 362e12, 0.864e12)),
    ("L4", GpuPeak("L4", 121e12, 0.3e12)),
    ("A10G", GpuPeak("A10G", 70e12, 0.6e12)),
    ("A10", GpuPeak("A10", 125e12, 0.6e12)),
)


def gpu_peak(name: str | None) -> GpuPeak | None:
    """The peaks of the GPU NVML calls `name` ("NVIDIA H200"), None for a model not in the table."""
    if not name:
        return None
    return next((peak for fragment, peak in GPU_PEAKS if fragment in name), None)
