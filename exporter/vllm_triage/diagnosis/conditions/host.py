"""Layers 1+3: the conditions judged on vLLM's processes and threads against its GPUs (the host side of serving),
each entry beside its predicate."""

from __future__ import annotations

from ...model import GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE
from ..condition import FROZEN, Condition, Threshold
from ..judge import Judge, Term, all_of, any_of, sm_activity_words


def _gpu_starved(j: Judge) -> Term:
    pending = any_of(
        j.compare("requests_running_mean", ">", "running_min", "requests running (window mean)"),
        j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)"),
    )
    low = j.compare("gpu_sm_activity_ratio", "<", "sm_activity_max", sm_activity_words(j), upper=1.0)
    mean = j.signals.get("gpu_utilization_ratio_mean")
    swinging = all_of(
        j.compare("gpu_utilization_ratio_cv", ">", "utilization_cv_min", "util.gpu coefficient of variation"),
        j.fact(
            None if mean is None else j.thresholds["swing_low"] <= mean <= j.thresholds["swing_high"],
            "util.gpu mean between the swing bounds",
            "gpu_utilization_ratio_mean",
            mean,
        ),
    )
    host: list[Term] = []
    python = False
    # The host side is judged on the threads' latest sample (10 s), not the window mean: a thread that turned saturated
    # or began to wait for a CPU is so now, and the `for` asks that it stay so (a mean took half the window to cross).
    for role, words in (("engine_core", "engine core"), ("api_server", "API server")):
        if j.signals.get(f"host_{role}_busiest_thread_cpu_ratio_recent") is None:
            continue  # a role not visible here (a headless engine has no API server) decides nothing
        busiest = f"{words}'s busiest thread, share of a core (last 10 s)"
        host.append(j.compare(f"host_{role}_busiest_thread_cpu_ratio_recent", ">=", "thread_cpu_min", busiest, upper=1.0))
        # A thread that waits for a CPU is starved, not idle: what it ran plus what it waited to run.
        if j.signals.get(f"host_{role}_thread_cpu_demand_ratio_recent") is not None:
            host.append(
                j.compare(
                    f"host_{role}_thread_cpu_demand_ratio_recent",
                    ">=",
                    "thread_cpu_min",
                    f"{words}'s neediest thread, CPU run + waited for, share of a core (last 10 s)",
                    upper=1.0,
                )
            )
        # GIL evidence when py-spy could sample (windows come minutes apart; absent is not unknown)
        gil = j.signals.get(f"host_{role}_gil_held_ratio")
        if gil is not None:
            host.append(j.compare(f"host_{role}_gil_held_ratio", ">=", "gil_held_min", f"{words} GIL held (latest py-spy window)", upper=1.0))
            python = python or gil >= j.thresholds["gil_python_cause_min"]
    if not host:
        return all_of(pending, any_of(low, swinging), j.fact(None, "no engine core or API server visible", "host_engine_core_busiest_thread_cpu_ratio"))
    verdict = all_of(pending, any_of(low, swinging), any_of(*host))
    if verdict.holds:
        _starvation_cause(j, python)
    return verdict


def _starvation_cause(j: Judge, python: bool) -> None:
    """Why the host side cannot feed the GPU: a CPU limit or neighbours first (the host thread waits for a CPU),
    then what the thread does with the CPU it gets."""
    throttled = j.signals.get("host_cgroup_throttled_ratio")
    waits = {role: w for role in ("engine_core", "api_server") if (w := j.signals.get(f"host_{role}_thread_runqueue_wait_ratio_recent")) is not None}
    role, wait = max(waits.items(), key=lambda item: item[1], default=(None, None))
    copies = j.signals.get("gpu_pcie_busiest_direction_ratio")
    if throttled is not None and throttled >= j.thresholds["throttled_ratio_for_cause"]:
        j.cause = "cpu_throttled"
        j.note(
            f"cause cpu_throttled: vLLM's container was throttled by its CPU limit in {throttled:.0%} of CPU periods: the host thread waits for "
            "its quota, not for work",
            "host_cgroup_throttled_ratio",
            throttled,
        )
    elif role is not None and wait is not None and wait >= j.thresholds["runqueue_wait_for_cause"]:
        j.cause = "cpu_contention"
        j.note(
            f"cause cpu_contention: the {role.replace('_', ' ')}'s neediest thread waited {wait:.2f} s per second for a CPU (last 10 s): other "
            "processes take the CPUs it may run on",
            f"host_{role}_thread_runqueue_wait_ratio_recent",
            wait,
        )
    elif copies is not None and copies >= j.thresholds["pcie_copy_ratio_min"]:
        j.cause = "pageable_copies"
        j.note(
            f"cause pageable_copies: PCIe at {copies:.0%} of the link while the SMs idle: a host thread stages copies",
            "gpu_pcie_busiest_direction_ratio",
            copies,
        )
    elif python:
        j.cause = "python"
        j.note("cause python: a thread holds the GIL at least half the time: Python work between launches is the limit")
    else:
        j.cause = "launch_overhead"
        j.note("cause launch_overhead: a host thread is saturated without holding the GIL most of the time: kernel launches and syncs")


GPU_STARVED = Condition(
    id="gpu_starved",
    precedence=50,
    suppressed_by=(FROZEN,),
    notes=("host",),
    layer="1+3",
    severity="warning",
    summary="The GPU waits for the CPU side of vLLM",
    meaning=(
        "Work is pending but the GPU's SMs are mostly idle (or util.gpu swings), while the engine core's or the API "
        "server's busiest thread saturates a core, or wants one and waits for it (CPU contention, a CPU limit): the host "
        "side cannot launch work fast enough."
    ),
    next_actions=(
        "cause=cpu_contention: vLLM's host threads wait for a CPU: give the pod CPU requests equal to its limits (Guaranteed QoS) "
        "and whole cores (the kubelet's static CPU manager), pin vLLM away from busy neighbours, or move them off the node.",
        "cause=cpu_throttled: the container's CPU limit throttles it: raise or remove the CPU limit (keep the request).",
        "cause=launch_overhead: many small kernels per step: CUDA graphs (drop --enforce-eager), a larger batch per step, async scheduling.",
        "cause=python: Python work between launches (eager mode runs every layer's Python each step: drop --enforce-eager "
        "for CUDA graphs); enable async scheduling, reduce per-step host work (detokenisation, logprobs, structured output).",
        "cause=pageable_copies: host<->device copies from pageable memory: pin host buffers (pin_memory), keep data on the GPU.",
        "API server thread saturated (tokenisation/detokenisation): raise --api-server-count.",
        "Check the pod's CPU limit and throttling (vllm_triage_process_window_cgroup_throttled_ratio); give vLLM faster or more cores.",
        "To see where each step's host time goes, take a torch profiler trace of a few steps and run `vllm-triage trace` on it.",
    ),
    predicate=_gpu_starved,
    reads=(
        "host_engine_core_busiest_thread_cpu_ratio_recent",
        "host_engine_core_gil_held_ratio",
        "gpu_sm_activity_ratio",
        "host_api_server_busiest_thread_cpu_ratio_recent",
        "host_api_server_gil_held_ratio",
        "host_engine_core_thread_cpu_demand_ratio_recent",
        "host_engine_core_thread_runqueue_wait_ratio_recent",
        "host_api_server_thread_cpu_demand_ratio_recent",
        "host_api_server_thread_runqueue_wait_ratio_recent",
        "host_cgroup_throttled_ratio",
        "requests_running_mean",
        "requests_waiting_mean",
        "gpu_utilization_ratio_mean",
        "gpu_utilization_ratio_cv",
        "gpu_sm_activity_from_gpm",
        "gpu_pcie_busiest_direction_ratio",
    ),
    thresholds=(
        Threshold("running_min", 0.0, "mean running above this (work pending)"),
        Threshold("waiting_min", 0.0, "or mean waiting above this"),
        Threshold("sm_activity_max", 0.4, "GPU SM activity below this", 0.0, 1.0),
        Threshold("utilization_cv_min", 0.3, "or util.gpu swinging: coefficient of variation above this"),
        Threshold("swing_low", 0.3, "... with util.gpu mean at or above this", 0.0, 1.0),
        Threshold("swing_high", 0.8, "... and at or below this", 0.0, 1.0),
        Threshold("thread_cpu_min", 0.85, "engine core or API server busiest thread at or above this share of a core", 0.0, 1.0),
        Threshold("gil_held_min", 0.8, "or its GIL held at least this share of the latest py-spy window", 0.0, 1.0),
        Threshold("pcie_copy_ratio_min", 0.05, "cause pageable_copies when PCIe carries at least this share of the link", 0.0, 1.0),
        Threshold("gil_python_cause_min", 0.5, "else cause python when the GIL is held at least this share (launch_overhead below)", 0.0, 1.0),
        Threshold(
            "throttled_ratio_for_cause",
            0.2,
            "first: cause cpu_throttled when vLLM's container was throttled in at least this share of CPU periods",
            0.0,
            1.0,
        ),
        Threshold("runqueue_wait_for_cause", 0.2, "then cause cpu_contention when a host thread waited at least this many seconds per second for a CPU"),
    ),
    dont=("Worker processes near 100 % CPU are not the culprit: they spin while waiting on the GPU.",),
    sources=(VLLM_SOURCE, GPU_SOURCE, PROCESS_SOURCE),
    causes=("cpu_throttled", "cpu_contention", "python", "launch_overhead", "pageable_copies"),
)


CONDITIONS: tuple[Condition, ...] = (GPU_STARVED,)
