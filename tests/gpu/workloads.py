"""GPU workloads whose bottleneck is known, for proving the GPU verdicts on a real GPU.

    python -m tests.gpu.workloads PHASE[:SECONDS] ...     e.g. idle:20 compute:40 copy_d2d:40

Each phase is one kind of truth (REFERENCE.md §4 has what NVML/GPM read for them on an H200):
- idle: nothing runs.
- compute: bf16 8k x 8k matmuls back to back: tensor cores busy -> compute_bound.
- copy_d2d: device-to-device copies of 2 GiB: DRAM bandwidth near its limit, tensor idle -> memory_bandwidth_bound.
- copy_h2d: pinned host->device and device->host copies of 1 GiB, alternating: util.gpu ~100 %
  while the SMs idle -> gpu_busy_not_computing; each direction busy half the time.
- copy_h2d_only: pinned host->device copies only: the link's receive direction near capacity ->
  pcie_saturated (and gpu_busy_not_computing).
- starved: tiny kernels with Python work between launches: the GPU waits on the CPU.
- mixed: compute and starved alternating every 3 s: util.gpu swings.
It prints one line per phase start (`phase NAME at UNIX_TIME`) so a recording can be cut by phase.
"""

from __future__ import annotations

import sys
import time


def run_phase(name: str, seconds: float) -> None:
    import torch

    deadline = time.time() + seconds
    device = torch.device("cuda")
    if name == "idle":
        time.sleep(seconds)
        return
    if name == "compute":
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        while time.time() < deadline:
            for _ in range(20):
                torch.mm(a, b)
            torch.cuda.synchronize()
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
