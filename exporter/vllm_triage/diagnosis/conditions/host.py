"""Layers 1+3: the conditions judged on vLLM's processes and threads against its GPUs (the host side of serving),
each entry beside its predicate."""

from __future__ import annotations

import math

from ...model import GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE
from ..condition import FROZEN, Condition, Threshold
from ..judge import Judge, Term, all_of, any_of, sm_activity_words


def _gpu_starved(j: Judge) -> Term:
    pending = any_of(
        j.compare("requests_running_mean", ">", "running_min", "requests running (window mean)"),
        j.compare("requests_waiting_mean", ">", "waiting_min", "requests waiting (window mean)"),
    )
    # The GPU side, like the host side below, is judged on the window's last 10 s: a window mean still holds the idle
    # before the load (or the busy minute before a stall) for half a window.
    low = j.compare("gpu_sm_activity_ratio_recent", "<", "sm_activity_max", sm_activity_words(j, "last 10 s"), upper=1.0)
    if low.holds and j.signals.get("gpu_sm_activity_from_gpm"):
        # A host thread at a full core may be spinning in a CUDA synchronisation while the GPU works: in eager decode
        # the engine core's main thread reads ~1.0 of a core beside a kernel resident half the time or more (small,
        # memory-bound kernels keep SM activity low). The GPU waits for the host only while it has no kernel to run.
        low = all_of(low, j.compare("gpu_utilization_ratio_recent", "<", "kernel_resident_max", "util.gpu (share of time a kernel ran), last 10 s", upper=1.0))
    mean = j.signals.get("gpu_utilization_ratio_mean")
    low_bound, high_bound = j.thresholds["swing_low"], j.thresholds["swing_high"]
    within = None if mean is None else low_bound <= mean <= high_bound
    swinging = all_of(
        # A window that began idle steps up, it does not swing: only a window with work at every reading can.
        j.compare("requests_running_min", ">", "running_min", "requests running (window minimum)"),
        j.compare("gpu_utilization_ratio_cv", ">", "utilization_cv_min", "util.gpu coefficient of variation"),
        j.fact(
            within,
            f"util.gpu window mean {'(no reading)' if mean is None else f'{mean:.3g}'} {'is' if within else 'is not'} between the swing bounds "
            f"{low_bound:g} and {high_bound:g} (swing_low, swing_high)",
            "gpu_utilization_ratio_mean",
            mean,
        ),
    )
    host: list[Term] = []
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
    if not host:
        return all_of(pending, any_of(low, swinging), j.fact(None, "no engine core or API server visible", "host_engine_core_busiest_thread_cpu_ratio"))
    verdict = all_of(pending, any_of(low, swinging), any_of(*host))
    if verdict.holds:
        _starvation_cause(j)
    return verdict


def _limiting_role(j: Judge) -> str:
    """The process whose busiest thread is the limit: the one nearer a full core (the engine core on a tie). A saturated
    API server leaves its engine core waiting for input, well under a core."""
    shares = {role: share for role in ("engine_core", "api_server") if (share := j.signals.get(f"host_{role}_busiest_thread_cpu_ratio_recent")) is not None}
    if shares.get("api_server", 0.0) > shares.get("engine_core", 0.0) and shares["api_server"] >= j.thresholds["thread_cpu_min"]:
        return "api_server"
    return "engine_core"


def _advise_api_servers(j: Judge) -> None:
    """--api-server-count N: N API servers feed an engine core that now uses `engine` of a core at most 1/engine times
    what one feeds (it saturates at one core), and the GPU at most sm_activity_max / SM activity times."""
    engine = j.signals.get("host_engine_core_busiest_thread_cpu_ratio_recent")
    sm = j.signals.get("gpu_sm_activity_ratio_recent")  # what the predicate judged, beside the thread's last 10 s
    count = int(j.signals.get("api_server_count") or 1)
    if engine is None:
        return
    headroom = 1.0 / max(engine, 0.05)
    if sm is not None:
        headroom = min(headroom, j.thresholds["sm_activity_max"] / max(sm, 0.001) if sm < j.thresholds["sm_activity_max"] else 1.0)
    wanted = max(count + 1, min(MAX_API_SERVERS, math.ceil(count * headroom)))
    j.advise(
        f"--api-server-count {wanted}: {count} API server{'s' if count > 1 else ''} saturate{'s' if count == 1 else ''} a core while the engine core's "
        f"busiest thread uses {engine:.2f} of one: it can take about {1 / max(engine, 0.05):.1f}x the input"
        + (f" and the GPU's SMs are {sm:.0%} active (last 10 s)" if sm is not None else "")
        + "; beyond that the engine core becomes the limit."
    )


MAX_API_SERVERS = 8  # past this the advice is no longer an extrapolation worth stating


def _starvation_cause(j: Judge) -> None:
    """Why the host side cannot feed the GPU: a CPU limit or neighbours first (the host thread waits for a CPU),
    then which process is the limit, then what the engine core's thread does with the CPU it gets."""
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
    elif _limiting_role(j) == "api_server":
        j.cause = "api_server"
        share = j.signals.get("host_api_server_busiest_thread_cpu_ratio_recent") or 0.0
        gil = j.signals.get("host_api_server_gil_held_ratio")
        j.note(
            f"cause api_server: the API server's busiest thread uses {share:.2f} of a core"
            + (f" with the GIL held {gil:.0%} of the latest py-spy window" if gil is not None else "")
            + " (tokenising, detokenising, one streamed chunk per token): the engine core waits for its input",
            "host_api_server_busiest_thread_cpu_ratio_recent",
            share,
        )
        _advise_api_servers(j)
    elif (gil := j.signals.get("host_engine_core_gil_held_ratio")) is not None and gil >= j.thresholds["gil_python_cause_min"]:
        j.cause = "engine_python"
        j.note(f"cause engine_python: the engine core holds the GIL {gil:.0%} of the latest py-spy window: Python work between launches is the limit")
    elif gil is not None:
        j.cause = "launch_overhead"
        j.note("cause launch_overhead: the engine core's thread is saturated without holding the GIL most of the time: kernel launches and syncs")
    else:
        j.cause = "engine_core"
        j.note(
            "cause engine_core: the engine core's thread is saturated (the host's CPU readings): py-spy's GIL share is not measured here (the "
            "gil source is off or refused; the chart's profiler.enabled), so Python work between launches (engine_python) is not told "
            "apart from kernel launches and syncs (launch_overhead)"
        )
    if j.cause in ("engine_python", "launch_overhead", "engine_core") and j.signals.get("cuda_graphs_enabled") == 0:
        j.note("CUDA graphs are off (--enforce-eager on vLLM's command line): every step runs each layer's Python and launches", "cuda_graphs_enabled", 0.0)
        j.advise("drop --enforce-eager: CUDA graphs replay a decode step in one launch, which is what this engine core's thread spends its core on")


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
        "cause=api_server: the API server's thread is the limit (tokenising, detokenising, one SSE chunk per token, logprobs): "
        "raise --api-server-count (the advice computes N), or ask clients for fewer streamed chunks and logprobs.",
        "cause=launch_overhead: many small kernels per step: CUDA graphs (drop --enforce-eager), a larger batch per step, async scheduling.",
        "cause=engine_python: Python work between launches (eager mode runs every layer's Python each step: drop --enforce-eager "
        "for CUDA graphs); enable async scheduling, reduce per-step host work (structured output, sampling parameters).",
        "cause=engine_core: the engine core's thread is the limit, Python work or launches (py-spy off): the fixes of both "
        "(CUDA graphs: drop --enforce-eager; async scheduling; a larger batch per step); the profiler (py-spy) tells which.",
        "cause=pageable_copies: host<->device copies from pageable memory: pin host buffers (pin_memory), keep data on the GPU.",
        "Check the pod's CPU limit and throttling (vllm_triage_process_window_cgroup_throttled_ratio); give vLLM faster or more cores.",
        "To see where each step's host time goes, take a torch profiler trace of a few steps and run `vllm-triage trace` on it.",
    ),
    predicate=_gpu_starved,
    reads=(
        "host_engine_core_busiest_thread_cpu_ratio_recent",
        "host_engine_core_gil_held_ratio",
        "gpu_sm_activity_ratio_recent",
        "host_api_server_busiest_thread_cpu_ratio_recent",
        "host_api_server_gil_held_ratio",
        "host_engine_core_thread_cpu_demand_ratio_recent",
        "host_engine_core_thread_runqueue_wait_ratio_recent",
        "host_api_server_thread_cpu_demand_ratio_recent",
        "host_api_server_thread_runqueue_wait_ratio_recent",
        "host_cgroup_throttled_ratio",
        "requests_running_mean",
        "requests_running_min",
        "requests_waiting_mean",
        "gpu_utilization_ratio_mean",
        "gpu_utilization_ratio_recent",
        "gpu_utilization_ratio_cv",
        "gpu_sm_activity_from_gpm",
        "gpu_pcie_busiest_direction_ratio",
        "api_server_count",
        "cuda_graphs_enabled",
    ),
    thresholds=(
        Threshold("running_min", 0.0, "mean running above this (work pending)"),
        Threshold("waiting_min", 0.0, "or mean waiting above this"),
        Threshold("sm_activity_max", 0.4, "GPU SM activity below this", 0.0, 1.0),
        Threshold(
            "kernel_resident_max",
            0.5,
            "... and (where GPM reads SM activity) util.gpu below this: a GPU with a kernel resident longer is not waiting for the host",
            0.0,
            1.0,
        ),
        Threshold("utilization_cv_min", 0.3, "or util.gpu swinging: coefficient of variation above this"),
        Threshold("swing_low", 0.3, "... with util.gpu mean at or above this", 0.0, 1.0),
        Threshold("swing_high", 0.8, "... and at or below this", 0.0, 1.0),
        Threshold("thread_cpu_min", 0.85, "engine core or API server busiest thread at or above this share of a core", 0.0, 1.0),
        Threshold("gil_held_min", 0.8, "or its GIL held at least this share of the latest py-spy window", 0.0, 1.0),
        Threshold("pcie_copy_ratio_min", 0.05, "cause pageable_copies when PCIe carries at least this share of the link", 0.0, 1.0),
        Threshold(
            "gil_python_cause_min", 0.5, "else cause engine_python when the engine core holds the GIL at least this share (launch_overhead below)", 0.0, 1.0
        ),
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
    causes=("cpu_throttled", "cpu_contention", "pageable_copies", "api_server", "engine_python", "launch_overhead", "engine_core"),
    # The predicate holds 16-23 s into a starved regime on the H200 captures (the host threads are sampled over 10 s):
    # 30 s on top is 46-53 s from onset. The longest run of it where a capture's truth says no starvation is 10 s
    # (12 clients on the wide model, SM activity dipping under 0.4 for a moment; bench.detection_latency).
    for_seconds=30,
)


def _tp_rank_lost(j: Judge) -> Term:
    if j.signals.get("host_workers_lost") is None and j.signals.get("host_worker_stopped_seconds") is None:
        if j.signals.get("host_engine_core_cpu_cores") is None:
            return j.fact(None, "vLLM's processes are not visible (share the pod's process namespace)", "host_workers_lost")
        return j.fact(False, "no vLLM worker process: the model runs in the engine core (no tensor or pipeline parallelism)", "host_workers_lost")
    lost = j.compare("host_workers_lost", ">=", "lost_min", "vLLM workers gone while their engine core runs on")
    if j.signals.get("host_worker_stopped_seconds") is None:  # no worker process watched now: only a lost one can hold
        term = lost
    else:
        term = any_of(lost, j.compare("host_worker_stopped_seconds", ">=", "stopped_seconds_min", "a vLLM worker has been stopped (or a zombie) for", " s"))
    if term.holds:
        j.cause = "exited" if lost.holds else "stopped"
        since = j.signals.get("seconds_since_last_token")
        if since is not None:
            j.note(f"last token {since:.0f} s ago", "seconds_since_last_token", since)
    return term


TP_RANK_LOST = Condition(
    id="tp_rank_lost",
    precedence=15,
    notes=("lost_ranks",),
    layer="3",
    severity="critical",
    summary="A tensor/pipeline-parallel rank is gone or stopped: its peers wait for it",
    meaning=(
        "One of the engine's workers (a tensor- or pipeline-parallel rank, one per GPU) exited, turned zombie or is stopped "
        "while the engine core that runs it lives on: the other ranks wait for it in their next collective (an NCCL "
        "all-reduce spinning on their GPUs) and no token comes, while vLLM's gauges hold their last values. engine_wedged "
        "follows once the stall passes its bar; this names which rank and why."
    ),
    next_actions=(
        "Restart vLLM (the pod): a parallel group does not continue without a rank, and vLLM does not re-form it.",
        "cause=exited: find why the worker died: its last lines in vLLM's log (a CUDA error, an exception), the kernel's OOM "
        "killer (dmesg | grep -i oom; the pod's memory limit), XID errors on its GPU (vllm_triage_gpu_xid_errors_total).",
        "cause=stopped: something stopped the worker (SIGSTOP, a debugger, a checkpointing tool): resume it (kill -CONT <pid>) or restart.",
        "Check `/diagnosis` -> discovery.ranks for which GPU the lost rank ran on.",
    ),
    predicate=_tp_rank_lost,
    reads=("host_workers_lost", "host_worker_stopped_seconds", "seconds_since_last_token", "host_engine_core_cpu_cores"),
    thresholds=(
        Threshold("lost_min", 1.0, "workers gone while their engine core runs on, at or above this"),
        Threshold("stopped_seconds_min", 20.0, "or a worker stopped (or a zombie) for at least this many seconds"),
    ),
    for_seconds=10,
    clear_seconds=30,
    window_seconds=60.0,  # a stop is measured within the window: never shorter than the bar, whatever window_seconds says
    sources=(PROCESS_SOURCE,),
    causes=("exited", "stopped"),
    stack_dump_role="engine_core",
    fails_engine_liveness=True,
    dont=("Do not restart a single worker: vLLM's parallel group is formed at start-up; restart the whole server.",),
)


CONDITIONS: tuple[Condition, ...] = (GPU_STARVED, TP_RANK_LOST)
