"""Layer-3 signals of vLLM's processes (psutil) and their GIL (py-spy), per role."""

from __future__ import annotations

from collections.abc import Callable

from ..scope import role_scope
from .window import SignalContext, SignalDef, mean_of, safe_ratio

# Host signals (layer 3): per role of vLLM's processes, exported as vllm_triage_process_window_<family>{role}.
ROLES = ("api_server", "engine_core", "worker")


def _role_cpu_cores(role: str) -> Callable[[SignalContext], float | None]:
    return lambda ctx: ctx.view.rate("process_cpu_seconds_total", role_scope(role))


def _role_cpu_cores_recent(role: str) -> Callable[[SignalContext], float | None]:
    return lambda ctx: ctx.view.recent().rate("process_cpu_seconds_total", role_scope(role)) if ctx.view.frames else None


def _stopped_frames(ctx: SignalContext, role: str) -> list[tuple[float, float]]:
    """(time, 1 when a process of the role was stopped) for each process reading of the window (read once a tick)."""
    scope = role_scope(role)
    return ctx.view.once(
        ("stopped_frames", scope),
        lambda: [(f.timestamp, max(values)) for f in ctx.view.frames if (values := [s.value for s in f.series("process_stopped", scope)])],
    )


def _role_stopped_seconds(role: str) -> Callable[[SignalContext], float | None]:
    """How long, up to the newest reading, a process of the role has been stopped in every reading (0 when running)."""

    def compute(ctx: SignalContext) -> float | None:
        frames = _stopped_frames(ctx, role)
        if not frames:
            return None
        start = len(frames)
        while start > 0 and frames[start - 1][1] > 0:
            start -= 1
        return 0.0 if start == len(frames) else frames[-1][0] - frames[start][0]

    return compute


def _role_resumed_seconds(role: str) -> Callable[[SignalContext], float | None]:
    """Seconds since a process of the role was last seen stopped, when it runs now; None when none was stopped in the
    window (or one is stopped now)."""

    def compute(ctx: SignalContext) -> float | None:
        frames = _stopped_frames(ctx, role)
        if not frames or frames[-1][1] > 0:
            return None
        last_stopped = next((t for t, stopped in reversed(frames) if stopped > 0), None)
        return None if last_stopped is None else frames[-1][0] - last_stopped

    return compute


def _role_thread_mean(metric: str, role: str) -> Callable[[SignalContext], float | None]:
    """Window mean of a per-thread share of one core (the role's processes' highest each reading)."""

    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points(metric, role_scope(role), max)
        return mean_of(points) if points else None

    return compute


def _role_stopped(role: str) -> Callable[[SignalContext], float | None]:
    """1 when a process of the role is stopped or a zombie in the newest reading."""

    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points("process_stopped", role_scope(role), max)
        return points[-1] if points else None

    return compute


def _workers_lost(ctx: SignalContext) -> float | None:
    """Workers gone (exited, or zombies) while the engine core that ran them runs on, in the newest reading."""
    points = ctx.view.gauge_points("process_lost", role_scope("worker"), max)
    return points[-1] if points else None


def _cgroup_throttled_ratio(ctx: SignalContext) -> float | None:
    return safe_ratio(ctx.view.increase("process_cgroup_throttled_periods_total", ctx.scope), ctx.view.increase("process_cgroup_periods_total", ctx.scope))


def _per_role(suffix: str, family: str, what: str, compute: Callable[[str], Callable[[SignalContext], float | None]]) -> tuple[SignalDef, ...]:
    """One signal per role, `host_<role>_<suffix>`, exported as family{role}."""
    return tuple(SignalDef(f"host_{role}_{suffix}", family, what, compute(role), (("role", role),)) for role in ROLES)


def _thread_mean(metric: str) -> Callable[[str], Callable[[SignalContext], float | None]]:
    return lambda role: _role_thread_mean(metric, role)


def _thread_recent(metric: str) -> Callable[[str], Callable[[SignalContext], float | None]]:
    """Mean over the window's last 10 s of a per-thread share (the role's processes' highest each reading): the
    thread's latest sample, what it does now."""

    def per_role(role: str) -> Callable[[SignalContext], float | None]:
        def compute(ctx: SignalContext) -> float | None:
            points = ctx.view.recent().gauge_points(metric, role_scope(role), max) if ctx.view.frames else []
            return mean_of(points) if points else None

        return compute

    return per_role


HOST_SIGNALS: tuple[SignalDef, ...] = (
    *_per_role("cpu_cores", "cpu_cores", "CPU of the role's processes, in cores.", _role_cpu_cores),
    *_per_role(
        "cpu_cores_recent",
        "cpu_cores_recent",
        "CPU of the role's processes over the window's last 10 s, in cores (what it does now, inside a stall).",
        _role_cpu_cores_recent,
    ),
    *_per_role(
        "stopped_seconds",
        "stopped_seconds",
        "How long a process of the role has been stopped (or a zombie) in every reading up to the newest, in seconds.",
        _role_stopped_seconds,
    ),
    *_per_role(
        "resumed_seconds",
        "resumed_seconds",
        "Seconds since a process of the role was last seen stopped, while it runs again (absent when none was stopped in the window).",
        _role_resumed_seconds,
    ),
    *_per_role(
        "busiest_thread_cpu_ratio",
        "busiest_thread_cpu_ratio",
        "The role's busiest thread, share of one core (1.0 = saturated), window mean.",
        _thread_mean("process_busiest_thread_cpu_ratio"),
    ),
    *_per_role(
        "busiest_thread_cpu_ratio_recent",
        "busiest_thread_cpu_ratio_recent",
        "The role's busiest thread, share of one core, over the window's last 10 s (its latest sample).",
        _thread_recent("process_busiest_thread_cpu_ratio"),
    ),
    *_per_role(
        "thread_runqueue_wait_ratio",
        "thread_runqueue_wait_ratio",
        "Seconds per second the role's neediest thread (most CPU run + waited for) waited runnable for a CPU (schedstat), window "
        "mean: CPU contention or a CPU limit.",
        _thread_mean("process_thread_runqueue_wait_ratio"),
    ),
    *_per_role(
        "thread_runqueue_wait_ratio_recent",
        "thread_runqueue_wait_ratio_recent",
        "Seconds per second the role's neediest thread waited runnable for a CPU, over the window's last 10 s (its latest sample).",
        _thread_recent("process_thread_runqueue_wait_ratio"),
    ),
    *_per_role(
        "thread_cpu_demand_ratio",
        "thread_cpu_demand_ratio",
        "The role's neediest thread's CPU run plus waited for, share of one core, window mean (1.0 = it wants a whole core).",
        _thread_mean("process_thread_cpu_demand_ratio"),
    ),
    *_per_role(
        "thread_cpu_demand_ratio_recent",
        "thread_cpu_demand_ratio_recent",
        "The role's neediest thread's CPU run plus waited for, share of one core, over the window's last 10 s (its latest sample).",
        _thread_recent("process_thread_cpu_demand_ratio"),
    ),
    *_per_role(
        "stopped",
        "stopped",
        "1 when a process of the role can run no code (stopped by a signal or a debugger, or a zombie), in the newest reading.",
        _role_stopped,
    ),
    SignalDef(
        "host_workers_lost",
        "workers_lost",
        "vLLM workers (tensor/pipeline-parallel ranks) gone, exited or zombies, while the engine core that ran them runs on, "
        "in the newest reading: the other ranks wait for them in their next collective.",
        _workers_lost,
        (("role", "worker"),),
    ),
    SignalDef(
        "host_cgroup_throttled_ratio",
        "cgroup_throttled_ratio",
        "Share of CPU periods in which vLLM's container was throttled by its CPU limit.",
        _cgroup_throttled_ratio,
        (("role", "api_server"),),
    ),
)


def _role_gil_held(role: str) -> Callable[[SignalContext], float | None]:
    """The latest py-spy window's GIL-held ratio (windows are seconds long and minutes apart)."""

    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points("gil_held_ratio", role_scope(role), max)
        return points[-1] if points else None

    return compute


GIL_SIGNALS: tuple[SignalDef, ...] = tuple(
    SignalDef(
        f"host_{role}_gil_held_ratio",
        "gil_held_ratio",
        "Share of the latest py-spy window in which a thread of the role's process held the GIL.",
        _role_gil_held(role),
        (("role", role),),
    )
    for role in ("api_server", "engine_core")
)
