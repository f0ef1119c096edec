"""Layer 2: summarise a torch profiler trace as vLLM's profiler hooks write it (/start_profile, /stop_profile):
`<worker>.<ms>.pt.trace.json.gz`, Chrome trace JSON whose complete events (`ph: X`, `ts`/`dur` in µs)
carry a category: `kernel`, `gpu_memcpy`, `gpu_memset` on the GPU rows, `cpu_op`, `cuda_runtime`,
`cuda_driver`, `python_function` on the host rows.

What an on-call engineer needs from it: how much of the traced window each GPU was busy and with what
(kernels or copies, by direction), where the idle time went (many short gaps between tiny kernels is a
host that cannot launch fast enough; a few long ones is a host that stalls), which kernels and host ops
took the time, and the sidecar condition each pattern corresponds to.
"""

from __future__ import annotations

import gzip
import itertools
import json
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
TINY_KERNEL_US = 10.0  # shorter than a launch costs the host: the launch rate, not the GPU, sets the pace
LONG_GAP_US = 10_000.0  # idle stretches this long are host stalls rather than launch overhead
MAX_TRACE_BYTES = 2 << 30


class TraceError(Exception):
    """A file that is not a readable torch profiler trace; the message names the file and the problem."""


class NoGpuActivity(TraceError):
    """A readable trace without GPU rows: a host-only profile, such as vLLM's frontend (`*.async_llm.*`)."""


@dataclass
class GpuSummary:
    device: str
    busy_ratio: float
    kernel_seconds: float
    memcpy_seconds: dict[str, float]
    memset_seconds: float
    kernels: int
    tiny_kernels: int
    idle_seconds: float
    gaps: int
    median_gap_seconds: float
    longest_gap_seconds: float
    top_kernels: list[tuple[str, int, float]]
    timeline: list[dict[str, float]]


@dataclass
class TraceSummary:
    file: str
    window_seconds: float
    gpus: list[GpuSummary]
    launches: int
    launch_seconds: float
    host_outside_ops_ratio: float | None  # of the busiest launching thread, over the window
    top_host_ops: list[tuple[str, int, float]]
    findings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def trace_files(paths: list[str]) -> list[tuple[Path, bool]]:
    """The files named, and the traces (*.pt.trace.json[.gz]) in the folders named (one per worker under
    TP, and the frontend's); each with whether it was found in a folder."""
    found: list[tuple[Path, bool]] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.name.endswith((".pt.trace.json", ".pt.trace.json.gz")))
            if not inside:
                raise TraceError(f"{path}: no *.pt.trace.json[.gz] files in this folder")
            found += [(p, True) for p in inside]
        else:
            found.append((path, False))
    return found


def summarize_paths(paths: list[str], top: int = 5, slices: int = 10) -> tuple[list[TraceSummary], list[str]]:
    """Summaries of the traces named and of those in the folders named, and notes on what was skipped.
    vLLM's profiler folder also holds the frontend's trace, which has no GPU rows: skipped there with a
    note; a file named on its own must have them."""
    summaries, skipped = [], []
    for path, in_folder in trace_files(paths):
        try:
            summaries.append(summarize(path, top=top, slices=slices))
        except NoGpuActivity as exc:
            if not in_folder:
                raise
            skipped.append(f"skipped {exc}")
    if not summaries:
        raise TraceError(f"no trace with GPU activity in {', '.join(paths)}: " + "; ".join(skipped))
    return summaries, skipped


def load_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events; gzip or plain JSON, either a `{"traceEvents": [...]}` object or a bare list."""
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"{path}: {size} bytes is larger than this command reads ({MAX_TRACE_BYTES})")
        with path.open("rb") as handle:
            compressed = handle.read(2) == b"\x1f\x8b"
        opener = gzip.open if compressed else open
        with opener(path, "rt", encoding="utf-8") as text:
            document = json.load(text)
    except OSError as exc:  # also gzip.BadGzipFile
        raise TraceError(f"{path}: cannot read it: {exc}") from None
    except (EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not complete trace JSON (truncated or garbled?): {exc}") from None
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list: is this a torch profiler trace (*.pt.trace.json[.gz])?")
    return [e for e in events if isinstance(e, dict)]


def short_kernel_name(name: str) -> str:
    """`void at::native::foo<4, Bar<float>>(int, ...)` -> `at::native::foo`: names without arguments."""
    marked = name.removeprefix("void ").replace("(anonymous namespace)", "\0")
    kept, depth = [], 0
    for char in marked:
        if char in "<(":
            depth += 1
        elif char in ">)" and depth:
            depth -= 1
        elif depth == 0:
            kept.append(char)
    return "".join(kept).replace("\0", "(anonymous namespace)").strip() or name[:80]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(merged: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in merged)


def _copy_direction(name: str) -> str:
    for direction in ("HtoD", "DtoH", "DtoD", "PtoP"):
        if direction in name:
            return direction
    return "other"


def _top(durations: dict[str, list[float]], top: int) -> list[tuple[str, int, float]]:
    ranked = sorted(durations.items(), key=lambda item: -sum(item[1]))[:top]
    return [(name, len(values), round(sum(values) / 1e6, 6)) for name, values in ranked]


def summarize(path: Path, top: int = 5, slices: int = 10) -> TraceSummary:
    events = [e for e in load_events(path) if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    gpu_events = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu_events:
        raise NoGpuActivity(f"{path}: no GPU activity (kernel, gpu_memcpy, gpu_memset) in the trace: a host-only profile, or was CUDA not profiled?")
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    window = max(end - start, 1e-9)
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in gpu_events:
        args = e.get("args") or {}
        by_device[str(args.get("device", e.get("pid")))].append(e)
    gpus = [_gpu_summary(device, evs, start, end, top, slices) for device, evs in sorted(by_device.items())]

    host = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")]
    launch_calls = [e for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in str(e.get("name"))]
    outside_ops = None
    threads: dict[tuple[Any, Any], int] = defaultdict(int)
    for e in launch_calls:
        threads[(e.get("pid"), e.get("tid"))] += 1
    if threads:
        launcher = max(threads, key=lambda key: threads[key])
        ops = _union([(e["ts"], e["ts"] + e["dur"]) for e in host if (e.get("pid"), e.get("tid")) == launcher and e.get("cat") == "cpu_op"])
        outside_ops = 1.0 - _covered(ops, start, end) / window
    host_ops: dict[str, list[float]] = defaultdict(list)
    for e in host:
        if e.get("cat") == "cpu_op":
            host_ops[str(e.get("name"))].append(e["dur"])
    summary = TraceSummary(
        file=str(path),
        window_seconds=round(window / 1e6, 6),
        gpus=gpus,
        launches=len(launch_calls),
        launch_seconds=round(sum(e["dur"] for e in launch_calls) / 1e6, 6),
        host_outside_ops_ratio=None if outside_ops is None else round(outside_ops, 4),
        top_host_ops=_top(host_ops, top),
    )
    summary.findings = _findings(summary)
    return summary


def _gpu_summary(device: str, events: list[dict[str, Any]], start: float, end: float, top: int, slices: int) -> GpuSummary:
    kernels = [e for e in events if e["cat"] == "kernel"]
    copies = [e for e in events if e["cat"] == "gpu_memcpy"]
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in events])
    kernel_union = _union([(e["ts"], e["ts"] + e["dur"]) for e in kernels])
    copy_union = _union([(e["ts"], e["ts"] + e["dur"]) for e in copies])
    window = max(end - start, 1e-9)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy)]
    memcpy: dict[str, float] = defaultdict(float)
    for e in copies:
        memcpy[_copy_direction(str(e.get("name")))] += e["dur"] / 1e6
    names: dict[str, list[float]] = defaultdict(list)
    for e in kernels:
        names[short_kernel_name(str(e.get("name")))].append(e["dur"])
    step = window / slices
    timeline = []
    for i in range(slices):
        lo, hi = start + i * step, start + (i + 1) * step
        timeline.append(
            {
                "offset_seconds": round(i * step / 1e6, 6),
                "busy_ratio": round(_covered(busy, lo, hi) / step, 4),
                "kernel_ratio": round(_covered(kernel_union, lo, hi) / step, 4),
                "memcpy_ratio": round(_covered(copy_union, lo, hi) / step, 4),
            }
        )
    busy_us = _covered(busy, start, end)
    return GpuSummary(
        device=device,
        busy_ratio=round(busy_us / window, 4),
        kernel_seconds=round(sum(e["dur"] for e in kernels) / 1e6, 6),
        memcpy_seconds={k: round(v, 6) for k, v in sorted(memcpy.items())},
        memset_seconds=round(sum(e["dur"] for e in events if e["cat"] == "gpu_memset") / 1e6, 6),
        kernels=len(kernels),
        tiny_kernels=sum(1 for e in kernels if e["dur"] < TINY_KERNEL_US),
        idle_seconds=round((window - busy_us) / 1e6, 6),
        gaps=len(gaps),
        median_gap_seconds=round(statistics.median(gaps) / 1e6, 6) if gaps else 0.0,
        longest_gap_seconds=round(max(gaps) / 1e6, 6) if gaps else 0.0,
        top_kernels=_top(names, top),
        timeline=timeline,
    )


def _findings(s: TraceSummary) -> list[str]:
    found = []
    for g in s.gpus:
        idle = 1.0 - g.busy_ratio
        copy_seconds = sum(g.memcpy_seconds.values())
        busy_seconds = g.busy_ratio * s.window_seconds
        if idle >= 0.5 and g.median_gap_seconds * 1e6 < LONG_GAP_US:
            outside = "" if s.host_outside_ops_ratio is None else f"; the launching thread was outside torch ops {s.host_outside_ops_ratio:.0%} of the window"
            found.append(
                f"GPU {g.device} idle {idle:.0%} of the {s.window_seconds:.3f} s window in {g.gaps} short gaps (median "
                f"{g.median_gap_seconds * 1e3:.2f} ms), {g.tiny_kernels} of {g.kernels} kernels under {TINY_KERNEL_US:g} µs{outside}: "
                "the host cannot launch fast enough (the sidecar's gpu_starved): look at what the launching thread does between kernels."
            )
        elif idle >= 0.5:
            found.append(
                f"GPU {g.device} idle {idle:.0%} of the window, longest gap {g.longest_gap_seconds * 1e3:.1f} ms: the host stalls in long "
                "stretches (scheduling, synchronisation, I/O, waiting for requests): compare with client_underload and gpu_starved."
            )
        if busy_seconds and copy_seconds >= 0.5 * busy_seconds:
            directions = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in g.memcpy_seconds.items())
            found.append(
                f"GPU {g.device}: copies took {copy_seconds / busy_seconds:.0%} of its busy time ({directions}): busy but not computing "
                "(gpu_busy_not_computing; pcie_saturated for host copies): offloading, swapping, unpinned memory."
            )
        if g.top_kernels and g.kernel_seconds and g.top_kernels[0][2] >= 0.5 * g.kernel_seconds:
            name, count, seconds = g.top_kernels[0]
            share = seconds / g.kernel_seconds
            found.append(f"GPU {g.device}: {name} took {share:.0%} of kernel time ({count} launches): the work itself; ncu for its detail.")
    return found


def report(s: TraceSummary) -> str:
    lines = [f"trace {s.file}: {s.window_seconds:.3f} s traced, {s.launches} kernel launches ({s.launch_seconds * 1e3:.1f} ms in launch calls)"]
    for g in s.gpus:
        copies = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in g.memcpy_seconds.items()) or "none"
        lines += [
            "",
            f"GPU {g.device}: busy {g.busy_ratio:.0%}; kernels {g.kernel_seconds * 1e3:.1f} ms ({g.kernels}, {g.tiny_kernels} under {TINY_KERNEL_US:g} µs); "
            f"copies {copies}; memset {g.memset_seconds * 1e3:.1f} ms",
            f"  idle {g.idle_seconds * 1e3:.1f} ms in {g.gaps} gaps (median {g.median_gap_seconds * 1e3:.2f} ms, longest {g.longest_gap_seconds * 1e3:.1f} ms)",
            "  over time (busy / kernels / copies):",
        ]
        for t in g.timeline:
            lines.append(f"    +{t['offset_seconds']:.3f} s  {t['busy_ratio']:4.0%}  {t['kernel_ratio']:4.0%}  {t['memcpy_ratio']:4.0%}".replace("%", " %"))
        lines.append("  top kernels:")
        lines += [f"    {seconds * 1e3:9.2f} ms  {count:6d}x  {name}" for name, count, seconds in g.top_kernels]
    lines += ["", "top host ops (inclusive):"]
    lines += [f"    {seconds * 1e3:9.2f} ms  {count:6d}x  {name}" for name, count, seconds in s.top_host_ops]
    lines += ["", "findings:"] + [f"  - {f}" for f in s.findings or ["no pattern stands out: the GPU was mostly busy computing."]]
    return "\n".join(lines)
