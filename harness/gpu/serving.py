"""A GPU serving loop that stands in for vLLM's engine core where no GPU build of vLLM can run (the
lent H200 has no network): run it under the title VLLM::EngineCore and it serves vLLM's request
gauges for its own work at /metrics, while its main thread runs the workloads' phases.

    bash -c 'exec -a VLLM::EngineCore python -m harness.gpu.serving PORT PHASE[:SECONDS] ...'

Truth: while a phase runs, BATCH requests are in flight (vllm:num_requests_running = BATCH); in
`idle` none are. `starved` keeps the main thread busy in Python between tiny kernels (the GPU waits on
the CPU: gpu_starved, with this process's main thread named); `compute` keeps the GPU's tensor cores
busy while the same thread spins in CUDA's synchronize (the host is busy too, but the GPU is not
starved). Prints `phase NAME at UNIX_TIME` lines as harness.gpu.workloads does.
"""

from __future__ import annotations

import sys
import time

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from .workloads import run_phase

BATCH = 16


def main(argv: list[str]) -> None:
    port, *phases = argv
    registry = CollectorRegistry()
    labels = {"engine": "0", "model_name": "serving-loop"}
    running = Gauge("vllm:num_requests_running", "Requests in the loop's batch", list(labels), registry=registry).labels(**labels)
    waiting = Gauge("vllm:num_requests_waiting", "Requests queued", list(labels), registry=registry).labels(**labels)
    kv = Gauge("vllm:kv_cache_usage_perc", "KV cache usage", list(labels), registry=registry).labels(**labels)
    waiting.set(0)
    kv.set(0.3)
    start_http_server(int(port), addr="127.0.0.1", registry=registry)
    for spec in phases:
        name, _, seconds = spec.partition(":")
        running.set(0 if name == "idle" else BATCH)
        print(f"phase {name} at {time.time():.3f}", flush=True)
        run_phase(name, float(seconds or 30))
    running.set(0)
    print(f"phase end at {time.time():.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
