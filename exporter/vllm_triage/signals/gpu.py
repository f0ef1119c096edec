"""Layer-3 signals of the GPUs (NVML and GPM), per GPU."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import cast

from ..scope import AGGREGATE_SCOPE, Scope
from .window import SignalContext, SignalDef, label_value, mean_of

# GPU signals (layer 3), per GPU scope `gpu:<index>`; the aggregate (scope "all") averages the
# watched GPUs frame by frame. Exported as vllm_triage_gpu_window_<family>{gpu,...}.

# Gen -> GB/s per lane per direction (the PCIe generations' transfer rates after encoding)
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
BUSY_UTILIZATION = 0.5  # util.gpu at or above which a GPU counts as busy (PCIe links downtrain at idle)


def _frames(ctx: SignalContext, names: tuple[str, ...]) -> list[dict[str, float]]:
    """Per frame: each name's value, averaged over the scope's GPUs; frames lacking one are skipped."""
    key = ("gpu_row", names, ctx.scope)
    return ctx.view.once(key, lambda: _rows(ctx, names, key))


def _rows(ctx: SignalContext, names: tuple[str, ...], key: tuple[object, ...]) -> list[dict[str, float]]:
    """_frames' rows, each frame's taken from its memo where an earlier tick built it."""
    rows: list[dict[str, float]] = []
    for frame in ctx.view.frames:
        row = cast("dict[str, float] | None", frame.memo.get(key))  # a frame's row is computed once, then read by every tick
        if row is None:
            row = {}
            for name in names:
                values = [s.value for s in frame.series(name, ctx.scope)]
                if not values:
                    row = {}
                    break
                row[name] = mean_of(values)
            frame.memo[key] = row
        if row:
            rows.append(row)
    return rows


def _gpu_stat(metric: str, stat: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.gauge_points(metric, ctx.scope, mean_of)
        if not points:
            return None
        if stat == "mean":
            return mean_of(points)
        if stat == "cv":  # coefficient of variation: how much utilisation swings
            mean = mean_of(points)
            return math.sqrt(mean_of([(p - mean) ** 2 for p in points])) / mean if mean > 0 and len(points) > 1 else 0.0
        return min(points) if stat == "min" else max(points)

    return compute


def _recent_mean(metric: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.recent().gauge_points(metric, ctx.scope, mean_of) if ctx.view.frames else []
        return mean_of(points) if points else None

    return compute


def _recent_max(metric: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        points = ctx.view.recent().gauge_points(metric, ctx.scope, max) if ctx.view.frames else []
        return max(points) if points else None

    return compute


def _newest_memory(ctx: SignalContext) -> list[tuple[float, float]]:
    """(used, total) bytes of each of the scope's GPUs in the newest reading that has them."""
    for frame in reversed(ctx.view.frames):
        total = {label_value(s.labels, "gpu"): s.value for s in frame.series("gpu_memory_total_bytes", ctx.scope)}
        pairs = [(s.value, t) for s in frame.series("gpu_memory_used_bytes", ctx.scope) if (t := total.get(label_value(s.labels, "gpu"))) and t > 0]
        if pairs:
            return pairs
    return []


def _memory_free_ratio(ctx: SignalContext) -> float | None:
    """The least free share of a GPU's memory among the scope's GPUs."""
    return min((1.0 - used / total for used, total in _newest_memory(ctx)), default=None)


def _memory_free_bytes(ctx: SignalContext) -> float | None:
    """The least free GPU's free memory among the scope's GPUs."""
    return min((max(0.0, total - used) for used, total in _newest_memory(ctx)), default=None)


def _sm_activity(stat: str) -> Callable[[SignalContext], float | None]:
    """SM active from GPM when present; util.gpu otherwise (gpu_sm_activity_from_gpm says which); `stat` says over what
    (mean: the window, recent: its last 10 s)."""

    def compute(ctx: SignalContext) -> float | None:
        gpm = ctx.values.get(f"gpu_sm_active_ratio_{stat}")
        return gpm if gpm is not None else ctx.values.get(f"gpu_utilization_ratio_{stat}")

    return compute


def _sm_activity_from_gpm(ctx: SignalContext) -> float | None:
    if ctx.values.get("gpu_utilization_ratio_mean") is None and ctx.values.get("gpu_sm_active_ratio_mean") is None:
        return None
    return 1.0 if ctx.values.get("gpu_sm_active_ratio_mean") is not None else 0.0


def _pcie_capacity(ctx: SignalContext) -> float | None:
    rows = _frames(ctx, ("gpu_pcie_link_generation", "gpu_pcie_link_width"))
    if not rows:
        return None
    row = rows[-1]
    per_lane = PCIE_LANE_BYTES_PER_SECOND.get(round(row["gpu_pcie_link_generation"]))
    return per_lane * row["gpu_pcie_link_width"] if per_lane else None


def _pcie_busiest_direction_ratio(ctx: SignalContext) -> float | None:
    capacity = ctx.values.get("gpu_pcie_link_capacity_bytes_per_second")
    tx = ctx.view.gauge_points("gpu_pcie_tx_bytes_per_second", ctx.scope, mean_of)
    rx = ctx.view.gauge_points("gpu_pcie_rx_bytes_per_second", ctx.scope, mean_of)
    if not capacity or not (tx or rx):
        return None
    return max(mean_of(tx) if tx else 0.0, mean_of(rx) if rx else 0.0) / capacity


def _link_degraded_while_busy(ctx: SignalContext) -> float | None:
    """Share of busy frames in which the link ran below its maximum generation or width."""
    names = ("gpu_utilization_ratio", "gpu_pcie_link_generation", "gpu_pcie_link_generation_max", "gpu_pcie_link_width", "gpu_pcie_link_width_max")
    busy = [r for r in _frames(ctx, names) if r["gpu_utilization_ratio"] >= BUSY_UTILIZATION]
    if not busy:
        return None
    degraded = [r for r in busy if r["gpu_pcie_link_generation"] < r["gpu_pcie_link_generation_max"] or r["gpu_pcie_link_width"] < r["gpu_pcie_link_width_max"]]
    return len(degraded) / len(busy)


def _busy_ratio(ctx: SignalContext) -> float | None:
    points = ctx.view.gauge_points("gpu_utilization_ratio", ctx.scope, mean_of)
    return sum(1 for p in points if p >= BUSY_UTILIZATION) / len(points) if points else None


def _clock_events(ctx: SignalContext) -> list[dict[str, float]]:
    """Per frame that has any: each clock-event reason's activity, averaged over the scope's GPUs. One pass
    over the window for every reason's signal (each frame's row is built once, then read by every tick)."""

    def rows() -> list[dict[str, float]]:
        key = ("gpu_clock_events", ctx.scope)
        found: list[dict[str, float]] = []
        for frame in ctx.view.frames:
            row = cast("dict[str, float] | None", frame.memo.get(key))
            if row is None:
                by_reason: dict[str, list[float]] = {}
                for s in frame.series("gpu_clock_event_active", ctx.scope):
                    reason = label_value(s.labels, "reason")
                    if reason is not None:
                        by_reason.setdefault(reason, []).append(s.value)
                frame.memo[key] = row = {reason: mean_of(values) for reason, values in by_reason.items()}
            if row:
                found.append(row)
        return found

    return ctx.view.once(("gpu_clock_events", ctx.scope), rows)


def _throttled_ratio(ctx: SignalContext) -> float | None:
    """Share of the window with a hardware/thermal brake set (SW power cap alone is normal at full load)."""
    braked = [max(row[reason] for reason in THROTTLE_REASONS if reason in row) for row in _clock_events(ctx) if not row.keys().isdisjoint(THROTTLE_REASONS)]
    return mean_of(braked) if braked else None


def _reason_ratio(reason: str) -> Callable[[SignalContext], float | None]:
    def compute(ctx: SignalContext) -> float | None:
        active = [row[reason] for row in _clock_events(ctx) if reason in row]
        return mean_of(active) if active else None

    return compute


def _power_to_limit(ctx: SignalContext) -> float | None:
    rows = _frames(ctx, ("gpu_power_watts", "gpu_power_limit_watts"))
    rows = [r for r in rows if r["gpu_power_limit_watts"] > 0]
    return mean_of([r["gpu_power_watts"] / r["gpu_power_limit_watts"] for r in rows]) if rows else None


def _link_bytes(tx: str, rx: str) -> Callable[[SignalContext], float | None]:
    """A link's two directions together, window means (the scope's GPUs averaged; the points PCIe's ratio reads too)."""

    def compute(ctx: SignalContext) -> float | None:
        sent, received = ctx.view.gauge_points(tx, ctx.scope, mean_of), ctx.view.gauge_points(rx, ctx.scope, mean_of)
        return mean_of(sent) + mean_of(received) if sent and received else None

    return compute


def _each_gpu_mean(ctx: SignalContext, metric: str) -> dict[Scope, float]:
    """Every watched GPU's window mean of a metric, by GPU scope (the peers of a tensor-parallel group)."""

    def compute() -> dict[Scope, float]:
        means = {}
        for scope in ctx.view.scopes():
            if scope.kind == "gpu" and (points := ctx.view.gauge_points(metric, scope, mean_of)):
                means[scope] = mean_of(points)
        return means

    return ctx.view.once(("each_gpu_mean", metric), compute)


def _group(ctx: SignalContext, scope: Scope) -> tuple[Scope, ...] | None:
    """The GPUs of `scope`'s tensor-parallel group where the rank map places it in one."""
    return next((group for group in ctx.facts.gpu_groups if scope in group), None)


def _peers_of(ctx: SignalContext, scope: Scope, watched: list[Scope]) -> list[Scope] | None:
    """The GPUs `scope` is compared with: the others of its tensor-parallel group where the rank map places ranks (one
    engine's GPUs are not another's peers; a GPU it places in no group has none), else every other watched GPU."""
    if not ctx.facts.gpu_groups:
        return [other for other in watched if other != scope]
    group = _group(ctx, scope)
    return [other for other in group if other != scope and other in watched] if group is not None else None


def _members(ctx: SignalContext) -> tuple[Scope, ...] | None:
    """The GPUs a scope of several stands for (the aggregate: every watched one; an engine's `gpus:`); None for one GPU."""
    if ctx.scope is AGGREGATE_SCOPE:
        return tuple(s for s in ctx.view.scopes() if s.kind == "gpu")
    return ctx.scope.members if ctx.scope.kind == "gpu_group" else None


def _peers(ctx: SignalContext) -> float | None:
    gpus = [s for s in ctx.view.scopes() if s.kind == "gpu"]
    if (members := _members(ctx)) is not None:
        return float(len(members) - 1) if members else None
    peers = _peers_of(ctx, ctx.scope, gpus)
    return float(len(peers)) if peers is not None else None


def _tensor_parallel_size(ctx: SignalContext) -> float | None:
    """The GPU's tensor-parallel group's size; for an engine's GPUs, its largest group's (the aggregate: none, it may
    mix engines)."""
    if ctx.scope is AGGREGATE_SCOPE:
        return None
    members = _members(ctx) or (ctx.scope,)
    sizes = [len(group) for group in ctx.facts.gpu_groups if set(group) & set(members)]
    return float(max(sizes)) if sizes else None


def _to_peers(metrics: tuple[str, ...], worst: Callable[[list[float]], float]) -> Callable[[SignalContext], float | None]:
    """This GPU's window mean over the median of its peers' (the first metric the GPUs have); for the aggregate, the
    most outlying GPU's (`worst` of them all)."""

    def ratio(ctx: SignalContext, means: dict[Scope, float], scope: Scope) -> float | None:
        peers = [means[other] for other in _peers_of(ctx, scope, list(means)) or []]
        middle = statistics.median(peers) if peers else 0.0
        return means[scope] / middle if scope in means and middle > 0 else None

    def compute(ctx: SignalContext) -> float | None:
        means = next((m for metric in metrics if len(m := _each_gpu_mean(ctx, metric)) > 1), None)
        if means is None:
            return None
        if (members := _members(ctx)) is not None:
            ratios = [r for scope in means if scope in members and (r := ratio(ctx, means, scope)) is not None]
            return worst(ratios) if ratios else None
        return ratio(ctx, means, ctx.scope)

    return compute


def _gpu_stats(metric: str, family: str, what: str, stats: tuple[str, ...] = ("mean", "min", "max")) -> list[SignalDef]:
    return [SignalDef(f"{metric}_{stat}", family, f"{what}, {stat} over the window.", _gpu_stat(metric, stat), (("stat", stat),)) for stat in stats]


GPU_SIGNALS: tuple[SignalDef, ...] = (
    SignalDef(
        "gpu_memory_free_ratio",
        "memory_free_ratio",
        "Free share of the GPU's memory (NVML), newest reading; the least free GPU for the aggregate.",
        _memory_free_ratio,
    ),
    SignalDef(
        "gpu_memory_free_bytes",
        "memory_free_bytes",
        "Free GPU memory (NVML), newest reading; the least free GPU's for the aggregate.",
        _memory_free_bytes,
    ),
    *_gpu_stats("gpu_utilization_ratio", "utilization_ratio", "util.gpu: share of time a kernel ran (0..1)", ("mean", "min", "max", "cv")),
    *_gpu_stats("gpu_sm_active_ratio", "sm_active_ratio", "GPM SM activity (0..1)", ("mean",)),
    *_gpu_stats("gpu_sm_occupancy_ratio", "sm_occupancy_ratio", "GPM SM occupancy (0..1)", ("mean",)),
    *_gpu_stats("gpu_tensor_active_ratio", "tensor_active_ratio", "GPM tensor-core activity (0..1)", ("mean",)),
    *_gpu_stats("gpu_dram_bandwidth_utilization_ratio", "dram_bandwidth_utilization_ratio", "GPM DRAM bandwidth utilisation (0..1)", ("mean",)),
    *(
        SignalDef(f"{metric}_recent", family, f"{what}, mean over the window's last 10 s (what the GPU does now).", _recent_mean(metric), (("stat", "recent"),))
        for metric, family, what in (
            ("gpu_utilization_ratio", "utilization_ratio", "util.gpu"),
            ("gpu_sm_active_ratio", "sm_active_ratio", "GPM SM activity"),
            ("gpu_tensor_active_ratio", "tensor_active_ratio", "GPM tensor-core activity"),
        )
    ),
    SignalDef("gpu_sm_activity_ratio", "sm_activity_ratio", "SM activity: GPM SM active, or util.gpu where GPM is missing.", _sm_activity("mean")),
    SignalDef(
        "gpu_sm_activity_ratio_recent",
        "sm_activity_recent_ratio",
        "SM activity over the window's last 10 s: GPM SM active, or util.gpu where GPM is missing.",
        _sm_activity("recent"),
    ),
    SignalDef(
        "gpu_sm_activity_from_gpm",
        "sm_activity_from_gpm",
        "1 when gpu_sm_activity_ratio comes from GPM, 0 for the util.gpu fallback.",
        _sm_activity_from_gpm,
    ),
    SignalDef(
        "gpu_pcie_link_capacity_bytes_per_second",
        "pcie_link_capacity_bytes_per_second",
        "PCIe capacity per direction at the current link generation and width.",
        _pcie_capacity,
    ),
    SignalDef(
        "gpu_pcie_busiest_direction_ratio",
        "pcie_busiest_direction_ratio",
        "Mean PCIe throughput of the busier direction / link capacity.",
        _pcie_busiest_direction_ratio,
    ),
    SignalDef("gpu_busy_ratio", "busy_ratio", "Share of the window with util.gpu >= 0.5.", _busy_ratio),
    SignalDef(
        "gpu_pcie_link_degraded_while_busy_ratio",
        "pcie_link_degraded_while_busy_ratio",
        "Share of busy samples with the PCIe link below its maximum generation or width.",
        _link_degraded_while_busy,
    ),
    SignalDef("gpu_throttled_ratio", "throttled_ratio", "Share of the window with HW slowdown, thermal or power-brake clock events.", _throttled_ratio),
    *(
        SignalDef(
            f"gpu_clock_event_{reason}_ratio",
            "clock_event_ratio",
            f"Share of the window with clock event reason {reason}.",
            _reason_ratio(reason),
            (("reason", reason),),
        )
        for reason in ("sw_power_cap", *THROTTLE_REASONS)
    ),
    SignalDef("gpu_power_to_limit_ratio", "power_to_limit_ratio", "Power draw / enforced power limit, mean.", _power_to_limit),
    *_gpu_stats("gpu_sm_clock_hertz", "sm_clock_hertz", "SM clock, hertz", ("mean",)),
    SignalDef(
        "gpu_pcie_bytes_per_second",
        "pcie_bytes_per_second",
        "PCIe traffic, both directions together, window mean (per GPU; the GPUs' mean for the aggregate).",
        _link_bytes("gpu_pcie_tx_bytes_per_second", "gpu_pcie_rx_bytes_per_second"),
    ),
    SignalDef(
        "gpu_nvlink_bytes_per_second",
        "nvlink_bytes_per_second",
        "NVLink traffic over all links, both directions together, window mean (absent where no NVLink is up).",
        _link_bytes("gpu_nvlink_tx_bytes_per_second", "gpu_nvlink_rx_bytes_per_second"),
    ),
    *_gpu_stats(
        "gpu_foreign_compute_processes",
        "foreign_compute_processes",
        "Processes other than vLLM's holding a compute context on the GPU (NVML's compute processes; only where NVML's pids are the sidecar's)",
        ("max",),
    ),
    SignalDef(
        "gpu_foreign_compute_processes_recent_max",
        "foreign_compute_processes",
        "Processes other than vLLM's holding a compute context on the GPU, most over the window's last 10 s (who shares it now).",
        _recent_max("gpu_foreign_compute_processes"),
        (("stat", "recent_max"),),
    ),
    SignalDef(
        "gpu_foreign_sm_ratio_recent_max",
        "foreign_sm_ratio",
        "Share of the GPU's time other programs' kernels ran, most over the window's last 10 s (NVML's per-process samples; absent where the GPU keeps none).",
        _recent_max("gpu_foreign_sm_ratio"),
        (("stat", "recent_max"),),
    ),
    SignalDef(
        "gpu_peers",
        "peers",
        "The GPUs this one is compared with: the others of its tensor-parallel group (the rank map), else every other watched GPU.",
        _peers,
    ),
    SignalDef(
        "gpu_tensor_parallel_size",
        "tensor_parallel_size",
        "The GPUs of this GPU's tensor-parallel group, as the rank map places vLLM's ranks on them.",
        _tensor_parallel_size,
    ),
    SignalDef(
        "gpu_sm_clock_to_peers_ratio",
        "sm_clock_to_peers_ratio",
        "The GPU's SM clock (window mean) over the median of its peers'; the slowest GPU's for the aggregate.",
        _to_peers(("gpu_sm_clock_hertz",), min),
    ),
    SignalDef(
        "gpu_sm_activity_to_peers_ratio",
        "sm_activity_to_peers_ratio",
        "The GPU's SM activity (GPM SM active, else util.gpu; window mean) over the median of its peers'; the busiest GPU's for the aggregate.",
        _to_peers(("gpu_sm_active_ratio", "gpu_utilization_ratio"), max),
    ),
)
