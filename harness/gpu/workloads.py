"""GPU workloads whose bottleneck is known, for proving the GPU verdicts on a real GPU.

    python -m harness.gpu.workloads PHASE[:SECONDS] ...     e.g. idle:20 compute:40 copy_d2d:40

Each phase is one kind of truth (what NVML/GPM read for them on an H200 is in tests/data/gpu-h200-phases.jsonl.gz):
- idle: nothing runs.
- compute: bf16 8k x 8k matmuls back to back: tensor cores busy -> compute_bound.
- copy_d2d: device-to-device copies of 2 GiB: DRAM bandwidth near its limit, tensor idle -> memory_bandwidth_bound.
- copy_h2d: pinned host->device and device->host copies of 1 GiB, alternating: util.gpu ~100 %
  while the SMs idle -> gpu_busy_not_computing; each direction busy half the time.
- copy_h2d_only: pinned host->device copies only: the link's receive direction near capacity ->
  pcie_saturated (and gpu_busy_not_computing).
- starved: tiny kernels with Python work between launches: the GPU waits on the CPU.
- mixed: compute and starved alternating every 3 s: util.gpu swings.
- matmul_fp32: fp32 8k matmuls with TF32 off: SMs busy, tensor cores idle -> compute_bound, cause cuda_cores.
- matmul_fp64: fp64 4k matmuls: FP64 tensor cores count as tensor activity -> compute_bound, cause tensor_cores.
- elementwise: fp32 multiply-add over 8 GiB in place: DRAM near its limit -> memory_bandwidth_bound.
- pageable: host->device copies of 512 MiB from pageable memory: one CPU thread stages them, the SMs idle.
- launch: tiny `add_` kernels back to back: the launching thread is saturated while the GIL is mostly free.
- bursty: a second of bf16 matmuls every 10 s: util.gpu swings around a low mean.
It prints one line per phase start (`phase NAME at UNIX_TIME`) so a recording can be cut by phase.
"""

from __future__ import annotations

import sys
import time


def _matmuls(deadline: float, size: int, dtype: object, per_sync: int) -> None:
    """Square matmuls back to back until `deadline`, synchronising every `per_sync`."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype)
    while time.time() < deadline:
        for _ in range(per_sync):
            torch.mm(a, b)
        torch.cuda.synchronize()


def run_phase(name: str, seconds: float) -> None:
    import torch

    deadline = time.time() + seconds
    device = torch.device("cuda")
    if name == "idle":
        time.sleep(seconds)
        return
    if name == "compute":
        _matmuls(deadline, 8192, torch.bfloat16, 20)
        return
    if name == "copy_d2d":
        src = torch.empty(2 << 30, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        while time.time() < deadline:
            for _ in range(10):
                dst.copy_(src)
            torch.cuda.synchronize()
        return
    if name in ("copy_h2d", "copy_h2d_only"):
        host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
        gpu = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    if name == "copy_h2d":
        while time.time() < deadline:
            for _ in range(4):
                gpu.copy_(host, non_blocking=True)
                host.copy_(gpu, non_blocking=True)
            torch.cuda.synchronize()
        return
    if name == "copy_h2d_only":
        while time.time() < deadline:
            for _ in range(8):
                gpu.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
        return
    if name == "mixed":
        while time.time() < deadline:
            run_phase("compute", min(3.0, deadline - time.time()))
            run_phase("starved", min(3.0, max(0.0, deadline - time.time())))
        return
    if name in ("matmul_fp32", "matmul_fp64"):
        torch.backends.cuda.matmul.allow_tf32 = False
        _matmuls(deadline, *((8192, torch.float32) if name == "matmul_fp32" else (4096, torch.float64)), 4)
        return
    if name == "elementwise":
        x = torch.ones(2 << 30, dtype=torch.float32, device=device)
        while time.time() < deadline:
            for _ in range(10):
                x.mul_(1.0001).add_(0.0001)
            torch.cuda.synchronize()
        return
    if name == "pageable":
        host = torch.ones(512 << 20, dtype=torch.uint8)  # not pinned: the driver stages it through a bounce buffer
        gpu = torch.empty(512 << 20, dtype=torch.uint8, device=device)
        while time.time() < deadline:
            gpu.copy_(host)
        torch.cuda.synchronize()
        return
    if name == "launch":
        x = torch.zeros(16, device=device)
        while time.time() < deadline:
            for _ in range(1000):
                x.add_(1.0)
        torch.cuda.synchronize()
        return
    if name == "bursty":
        while time.time() < deadline:
            run_phase("compute", min(1.0, deadline - time.time()))
            time.sleep(min(9.0, max(0.0, deadline - time.time())))
        return
    if name == "starved":
        x = torch.randn(64, device=device)
        while time.time() < deadline:
            x = x * 1.0001 + 0.0001  # a tiny kernel ...
            busy = sum(i * i for i in range(20000))  # ... then the host thinks for a while
            if busy < 0:
                break
        torch.cuda.synchronize()
        return
    raise SystemExit(f"unknown phase {name!r}")


def main(argv: list[str]) -> None:
    for spec in argv:
        name, _, seconds = spec.partition(":")
        print(f"phase {name} at {time.time():.3f}", flush=True)
        run_phase(name, float(seconds or 30))
    print(f"phase end at {time.time():.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
