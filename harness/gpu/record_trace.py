"""Records the torch profiler trace `vllm-triage trace` is tested on (tests/data/trace-h200.pt.trace.json.gz),
in the format vLLM's profiler hooks write (PyTorch's tensorboard trace handler, gzip Chrome trace JSON).

    python -m harness.gpu.record_trace OUT_DIR

Three known parts, in order: the GPU waiting on Python between tiny kernels (~0.6 s), bf16 8k matmuls
back to back (~0.5 s), pinned host-to-device copies (~0.3 s).
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler


def starved(seconds: float) -> None:
    x = torch.randn(64, device="cuda")
    deadline = time.time() + seconds
    while time.time() < deadline:
        x = x * 1.0001 + 0.0001
        sum(i * i for i in range(20000))
    torch.cuda.synchronize()


def compute(n: int) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    for _ in range(n):
        torch.mm(a, b)
    torch.cuda.synchronize()


def copies(n: int) -> None:
    host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    gpu = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(n):
        gpu.copy_(host, non_blocking=True)
    torch.cuda.synchronize()


def main(out_dir: str) -> None:
    compute(2)  # warm-up outside the trace: cuBLAS handles, allocator
    copies(1)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], on_trace_ready=tensorboard_trace_handler(out_dir, "VllmWorker-0", use_gzip=True)):
        starved(0.6)
        compute(40)
        copies(24)


if __name__ == "__main__":
    main(sys.argv[1])
