"""One self-contained HTML page of an incident (`vllm-triage report --html`): the verdict timeline as bands, then the
three layers plotted on one time axis (vLLM's load, KV cache, preemptions, tokens, latency; the GPUs; vLLM's
processes), then each verdict span with its evidence and next actions. Hand-written SVG: no script, no font, no
network; it opens offline and attaches to a ticket."""

from __future__ import annotations

import datetime as dt
import html
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .model import GIL_SOURCE, GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE, Reading, Snapshot, Verdict
from .report import SEVERITY_ORDER
from .scope import AGGREGATE_SCOPE, Scope

Points = list[tuple[float, float]]  # (timestamp, value)
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
SEVERITY_COLORS = {"critical": "#c0392b", "warning": "#e67e22", "info": "#2980b9"}
WIDTH, LEFT, RIGHT = 1000, 170, 20
PLOT_HEIGHT, LANE_HEIGHT = 150, 22


@dataclass
class Plot:
    title: str
    unit: str  # "ratio" (0..1), "count", "per_second", "seconds", "bytes_per_second", "watts", "hertz", "cores"
    series: dict[str, Points] = field(default_factory=dict)
    lines: dict[str, float] = field(default_factory=dict)  # label -> a constant drawn dashed (max_num_seqs, full)


@dataclass(frozen=True)
class Span:
    condition: str
    severity: str
    start: float
    end: float
    primary_runs: tuple[tuple[float, float], ...]  # the runs of ticks in which it led the diagnosis: one primary at a time
    causes: tuple[str, ...]
    verdict: Verdict  # as judged at the span's first tick: its evidence, advice and next actions

    @property
    def primary(self) -> bool:
        return bool(self.primary_runs)

    @property
    def onset(self) -> float:
        """When the verdict became active: its `since`, which can lie before the page's first tick (then it is drawn
        clipped, and said so)."""
        since = self.verdict.since
        return since if since is not None and since < self.start else self.start


def _by_source(readings: Iterable[Reading], source: str) -> list[Reading]:
    return [r for r in readings if r.source == source and r.ok]


def _gauge(readings: list[Reading], name: str, by: str | None = None, reduce: Callable[[list[float]], float] = sum) -> dict[str, Points]:
    """Each reading's values of `name`, reduced per value of the label `by` (or over all series)."""
    out: dict[str, Points] = {}
    for reading in readings:
        groups: dict[str, list[float]] = {}
        for (metric, labels), value in reading.samples.items():
            if metric == name and math.isfinite(value):
                groups.setdefault(dict(labels).get(by, "") if by else "", []).append(value)
        for key, values in groups.items():
            out.setdefault(key, []).append((reading.timestamp, reduce(values)))
    return out


def _rate(points: Points) -> Points:
    """Per-second increase between consecutive points of a counter; a reset (a decrease) starts over."""
    return [(t1, (v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1) in itertools.pairwise(points) if t1 > t0 and v1 >= v0]


def _signal(snapshots: list[Snapshot], name: str, scope: Scope = AGGREGATE_SCOPE) -> Points:
    return [(s.timestamp, v) for s in snapshots if (v := s.signals.get(scope, {}).get(name)) is not None and math.isfinite(v)]


# Each on its own axis: a TTFT of seconds would flatten an ITL of milliseconds to the floor of a shared one.
TTFT_SIGNALS = (("ttft_seconds_p50", "TTFT p50"), ("ttft_seconds_p95", "TTFT p95"))
ITL_SIGNALS = (("inter_token_latency_seconds_p50", "ITL p50"), ("inter_token_latency_seconds_p95", "ITL p95"))
GPU_ACTIVITY = (
    ("gpu_sm_active_ratio", "SM active"),
    ("gpu_tensor_active_ratio", "tensor active"),
    ("gpu_dram_bandwidth_utilization_ratio", "DRAM"),
    ("gpu_utilization_ratio", "util.gpu"),
)


PCIE = (("gpu_pcie_rx_bytes_per_second", "rx"), ("gpu_pcie_tx_bytes_per_second", "tx"))
# The samples plots() reads: the live page takes only these from the in-memory window (a test renders both ways).
# Readings carry today's names whatever vLLM exported: the vLLM source and the history reader rename old ones.
PLOTTED = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "gpu_power_watts",
        "gpu_sm_clock_hertz",
        "process_cpu_seconds_total",
        "process_busiest_thread_cpu_ratio",
        "gil_held_ratio",
        *(name for name, _ in GPU_ACTIVITY + PCIE),
    }
)


def _per_gpu(plot: Plot, gpu: list[Reading], metrics: tuple[tuple[str, str], ...]) -> Plot:
    """One series per GPU and metric: "<label> GPU <index>"."""
    for name, label in metrics:
        for index, points in sorted(_gauge(gpu, name, by="gpu", reduce=max).items()):
            plot.series[f"{label} GPU {index}"] = points
    return plot


def plots(readings: list[Reading], snapshots: list[Snapshot]) -> list[Plot]:
    """What the page plots, from the raw readings (and the windowed latency quantiles the snapshots computed)."""
    vllm, gpu, process, gil = (_by_source(readings, s) for s in (VLLM_SOURCE, GPU_SOURCE, PROCESS_SOURCE, GIL_SOURCE))
    result = []
    requests = Plot("Requests running and waiting", "count")
    requests.series["running"] = _gauge(vllm, "vllm:num_requests_running").get("", [])
    requests.series["waiting"] = _gauge(vllm, "vllm:num_requests_waiting").get("", [])
    seqs = next((s.discovery.max_num_seqs for s in reversed(snapshots) if s.discovery.max_num_seqs), None)
    if seqs:
        requests.lines["max_num_seqs"] = float(seqs)
    result.append(requests)
    kv = Plot("KV cache usage", "ratio", lines={"full": 1.0})
    kv.series["KV usage (fullest engine)"] = _gauge(vllm, "vllm:kv_cache_usage_perc", reduce=max).get("", [])
    result.append(kv)
    result.append(Plot("Preemptions", "per_second", {"preemptions": _rate(_gauge(vllm, "vllm:num_preemptions_total").get("", []))}))
    tokens = Plot("Tokens", "per_second")
    tokens.series["generated"] = _rate(_gauge(vllm, "vllm:generation_tokens_total").get("", []))
    tokens.series["prompt"] = _rate(_gauge(vllm, "vllm:prompt_tokens_total").get("", []))
    result.append(tokens)
    result.append(Plot("Time to first token (window quantiles)", "seconds", {label: _signal(snapshots, name) for name, label in TTFT_SIGNALS}))
    result.append(Plot("Inter-token latency (window quantiles)", "seconds", {label: _signal(snapshots, name) for name, label in ITL_SIGNALS}))
    result.append(_per_gpu(Plot("GPU activity", "ratio"), gpu, GPU_ACTIVITY))
    result.append(_per_gpu(Plot("PCIe", "bytes_per_second"), gpu, PCIE))
    power = Plot("GPU power", "watts", {f"GPU {i}": p for i, p in sorted(_gauge(gpu, "gpu_power_watts", by="gpu", reduce=max).items())})
    result.append(power)
    clocks = Plot("GPU SM clock", "hertz", {f"GPU {i}": p for i, p in sorted(_gauge(gpu, "gpu_sm_clock_hertz", by="gpu", reduce=max).items())})
    result.append(clocks)
    cpu = Plot("vLLM's processes: CPU", "cores")
    for role, points in sorted(_gauge(process, "process_cpu_seconds_total", by="role").items()):
        cpu.series[role.replace("_", " ")] = _rate(points)
    result.append(cpu)
    threads = Plot("Busiest thread and GIL (share of a core / of the time)", "ratio")
    for role, points in sorted(_gauge(process, "process_busiest_thread_cpu_ratio", by="role", reduce=max).items()):
        threads.series[f"{role.replace('_', ' ')} busiest thread"] = points
    for role, points in sorted(_gauge(gil, "gil_held_ratio", by="role", reduce=max).items()):
        threads.series[f"{role.replace('_', ' ')} GIL held"] = points
    result.append(threads)
    for plot in result:
        plot.series = {label: points for label, points in plot.series.items() if points}
    return [p for p in result if p.series]


def spans(snapshots: list[Snapshot]) -> list[Span]:
    """Each run of ticks in which a condition was active, in order of start, with the runs in which it was the primary."""
    found: list[Span] = []
    open_: dict[str, tuple[float, list[list[float]], list[str], Verdict, float]] = {}
    previous: Snapshot | None = None
    for snapshot in snapshots:
        active = {v.condition: v for v in snapshot.verdicts if v.active}
        for condition in list(open_):
            if condition not in active:
                start, runs, causes, first, last = open_.pop(condition)
                found.append(Span(condition, first.severity, start, last, tuple((a, b) for a, b in runs), tuple(causes), first))
        for condition, verdict in active.items():
            start, runs, causes, first, _ = open_.get(condition, (snapshot.timestamp, [], [], verdict, snapshot.timestamp))
            if verdict.cause and verdict.cause not in causes:
                causes.append(verdict.cause)
            if snapshot.primary == condition:
                if runs and previous is not None and previous.primary == condition and runs[-1][1] == previous.timestamp:
                    runs[-1][1] = snapshot.timestamp
                else:
                    runs.append([snapshot.timestamp, snapshot.timestamp])
            open_[condition] = (start, runs, causes, first, snapshot.timestamp)
        previous = snapshot
    for condition, (start, runs, causes, first, last) in open_.items():
        found.append(Span(condition, first.severity, start, last, tuple((a, b) for a, b in runs), tuple(causes), first))
    return sorted(found, key=lambda s: (s.start, s.condition))


def _led(span: Span, origin: float) -> str:
    """When the span was the primary verdict, as offsets from the page's start."""
    if not span.primary:
        return "secondary"
    if span.primary_runs == ((span.start, span.end),):
        return "primary"
    return "primary " + ", ".join(f"+{a - origin:.0f}–+{b - origin:.0f} s" for a, b in span.primary_runs) + ", else secondary"


UNIT_SYMBOLS = {"bytes_per_second": "B/s", "hertz": "Hz", "watts": "W", "seconds": "s", "per_second": "/s", "cores": "cores"}


def _format(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.0%}"
    prefix = ""
    if unit in ("bytes_per_second", "hertz", "watts"):
        for factor, letter in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= factor:
                value, prefix = value / factor, letter
                break
    number = f"{value:.2g}" if abs(value) < 10 else f"{value:.0f}"
    symbol = prefix + UNIT_SYMBOLS.get(unit, "")
    return f"{number}{symbol}" if symbol.startswith("/") else f"{number} {symbol}".strip()


def _wall(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).strftime("%H:%M:%S")


def _step(span: float) -> float:
    """A tick spacing that gives 5-10 ticks over `span` seconds."""
    for step in (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400):
        if span / step <= 10:
            return float(step)
    return 86400.0


def _x(t: float, start: float, end: float) -> float:
    return LEFT + (t - start) / max(end - start, 1e-9) * (WIDTH - LEFT - RIGHT)


def _time_axis(start: float, end: float, height: float) -> list[str]:
    parts = []
    step = _step(end - start)
    tick = 0.0
    while tick <= end - start + 1e-9:
        x = _x(start + tick, start, end)
        parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" class="grid"/>')
        parts.append(f'<text x="{x:.1f}" y="{height + 12}" class="tick" text-anchor="middle">+{tick:.0f} s</text>')
        parts.append(f'<text x="{x:.1f}" y="{height + 24}" class="wall" text-anchor="middle">{_wall(start + tick)}</text>')
        tick += step
    return parts


def _plot_svg(plot: Plot, start: float, end: float) -> str:
    highest = max([v for points in plot.series.values() for _, v in points] + list(plot.lines.values()), default=0.0)
    top = 1.0 if plot.unit == "ratio" and highest <= 1.0 else max(highest * 1.05, 1e-9)

    def y(value: float) -> float:
        return PLOT_HEIGHT - min(max(value, 0.0), top) / top * PLOT_HEIGHT

    parts = [f'<svg viewBox="0 -8 {WIDTH} {PLOT_HEIGHT + 40}" width="{WIDTH}" role="img" aria-label="{html.escape(plot.title)}">']
    parts += _time_axis(start, end, PLOT_HEIGHT)
    for fraction in (0.0, 0.5, 1.0):
        level = PLOT_HEIGHT - fraction * PLOT_HEIGHT
        parts.append(f'<line x1="{LEFT}" y1="{level:.1f}" x2="{WIDTH - RIGHT}" y2="{level:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{level + 4:.1f}" class="tick" text-anchor="end">{html.escape(_format(top * fraction, plot.unit))}</text>')
    for index, (label, points) in enumerate(plot.series.items()):
        path = " ".join(f"{_x(t, start, end):.1f},{y(v):.1f}" for t, v in points if start <= t <= end)
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="{COLORS[index % len(COLORS)]}" stroke-width="1.4"><title>{html.escape(label)}</title></polyline>'
        )
    for label, value in plot.lines.items():
        parts.append(f'<line x1="{LEFT}" y1="{y(value):.1f}" x2="{WIDTH - RIGHT}" y2="{y(value):.1f}" class="limit"><title>{html.escape(label)}</title></line>')
    parts.append("</svg>")
    legend = "".join(
        f'<span class="key"><i style="background:{COLORS[i % len(COLORS)]}"></i>{html.escape(label)}</span>' for i, label in enumerate(plot.series)
    ) + "".join(
        f'<span class="key"><i class="dashed"></i>{html.escape(label)} ({html.escape(_format(v, plot.unit))})</span>' for label, v in plot.lines.items()
    )
    return f'<section class="plot"><h3>{html.escape(plot.title)}</h3>{"".join(parts)}<div class="legend">{legend}</div></section>'


def _bands_svg(found: list[Span], start: float, end: float) -> str:
    conditions = list(dict.fromkeys(s.condition for s in found))
    height = max(1, len(conditions)) * LANE_HEIGHT
    parts = [f'<svg viewBox="0 -8 {WIDTH} {height + 40}" width="{WIDTH}" role="img" aria-label="verdict timeline">']
    parts += _time_axis(start, end, height)
    for lane, condition in enumerate(conditions):
        top = lane * LANE_HEIGHT
        parts.append(f'<text x="{LEFT - 6}" y="{top + 15}" class="lane" text-anchor="end">{html.escape(condition)}</text>')
        for span in (s for s in found if s.condition == condition):
            x0, x1 = _x(span.start, start, end), _x(span.end, start, end)
            width = max(x1 - x0, 2.0)
            color = SEVERITY_COLORS.get(span.severity, "#7f8c8d")
            label = f"{condition} ({', '.join(span.causes)})" if span.causes else condition
            tip = f"{label}: {_led(span, start)}, +{span.start - start:.0f} s to +{span.end - start:.0f} s"
            if span.onset < start:  # active before the page begins: drawn from its edge, with an arrow and its onset
                tip += f" (active since {_wall(span.onset)} UTC, before this page)"
                parts.append(f'<text x="{x0 - 2:.1f}" y="{top + 15}" class="lane" text-anchor="end">◂</text>')
            box = f'x="{x0:.1f}" y="{top + 3}" width="{width:.1f}" height="{LANE_HEIGHT - 6}"'
            parts.append(f'<rect {box} fill="{color}" class="secondary"><title>{html.escape(tip)}</title></rect>')
            for a, b in span.primary_runs:  # dark where it led: at any moment one lane at most
                a0, a1 = _x(a, start, end), _x(b, start, end)
                lead = f'x="{a0:.1f}" y="{top + 3}" width="{max(a1 - a0, 2.0):.1f}" height="{LANE_HEIGHT - 6}"'
                led = html.escape(f"{label}: primary, +{a - start:.0f} s to +{b - start:.0f} s")
                parts.append(f'<rect {lead} fill="{color}" class="primary"><title>{led}</title></rect>')
            if width > 60 and span.causes:
                parts.append(f'<text x="{x0 + 4:.1f}" y="{top + 15}" class="cause">{html.escape(", ".join(span.causes))}</text>')
    parts.append("</svg>")
    return "".join(parts)


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;max-width:1040px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 6px}h3{font-size:14px;margin:14px 0 2px}
.meta{color:#555}.grid{stroke:#e3e3e3;stroke-width:1}.limit{stroke:#555;stroke-dasharray:5 4;stroke-width:1}
.tick{font-size:10px;fill:#555}.wall{font-size:9px;fill:#999}.lane{font-size:11px;fill:#333}.cause{font-size:10px;fill:#fff}
rect.secondary{opacity:.45}.legend{font-size:12px;color:#333}.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin-right:4px}.key i.dashed{border-top:2px dashed #555;height:0}
.span{border-left:4px solid #999;padding:2px 10px;margin:10px 0}.span ul{margin:4px 0 4px 18px;padding:0}
"""


def render(readings: list[Reading], snapshots: list[Snapshot], title: str) -> str:
    """The page: `readings` (what the sources saw) and `snapshots` (the pipeline's verdict at each tick) over one range."""
    if not snapshots:
        raise ValueError("no evaluation in the range: nothing to report")
    start, end = snapshots[0].timestamp, snapshots[-1].timestamp
    inside = [r for r in readings if start - 1 <= r.timestamp <= end]
    found = spans(snapshots)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">{dt.datetime.fromtimestamp(start, dt.timezone.utc):%Y-%m-%d %H:%M:%S} to {_wall(end)} UTC ({end - start:.0f} s), '
        f"{len(snapshots)} evaluations every {(end - start) / max(len(snapshots) - 1, 1):.0f} s. Time axes: seconds from the start, wall time (UTC) "
        "below. Bands: dark = the primary verdict (its fix comes first), light = secondary.</p>",
        "<h2>Verdicts</h2>",
        _bands_svg(found, start, end) if found else "<p>No verdict was active in this range.</p>",
        "<h2>The three layers</h2>",
        *(_plot_svg(plot, start, end) for plot in plots(inside, snapshots)),
        "<h2>Each verdict, its evidence and next actions (most severe first)</h2>",
    ]
    for span in sorted(found, key=lambda s: (SEVERITY_ORDER.get(s.severity, 9), not s.primary, s.start)):
        verdict = span.verdict
        causes = f" (cause {', '.join(span.causes)})" if span.causes else ""
        advice = (
            "<b>Advice (computed from what was observed)</b><ul>" + "".join(f"<li>{html.escape(a)}</li>" for a in verdict.advice) + "</ul>"
            if verdict.advice
            else ""
        )
        body.append(
            f'<div class="span" style="border-color:{SEVERITY_COLORS.get(span.severity, "#999")}"><h3>{html.escape(span.condition)}{html.escape(causes)}: '
            f"{html.escape(span.severity)}, {html.escape(_led(span, start))}, +{span.start - start:.0f} s to +{span.end - start:.0f} s "
            f"({_wall(span.start)}–{_wall(span.end)} UTC)</h3>"
            + (
                f"<p><b>Active since {_wall(span.onset)} UTC</b>, {span.start - span.onset:.0f} s before this page begins: shown from its edge.</p>"
                if span.onset < start
                else ""
            )
            + f"<p>{html.escape(verdict.summary)}</p><b>"
            + ("Evidence at the page's first tick" if span.onset < start else "Evidence when it became active")
            + "</b><ul>"
            + "".join(f"<li>{html.escape(e.text)}</li>" for e in verdict.evidence)
            + "</ul>"
            + advice
            + "<b>Next actions</b><ul>"
            + "".join(f"<li>{html.escape(a)}</li>" for a in verdict.next_actions)
            + "</ul></div>"
        )
    if not found:
        body.append("<p>None.</p>")
    head = f'<head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style></head>'
    return f'<!DOCTYPE html>\n<html lang="en">{head}<body>{"".join(body)}</body></html>\n'
