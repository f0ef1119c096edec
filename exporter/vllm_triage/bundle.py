"""The incident bundle: when a critical verdict rises, one bounded folder of what the sidecar knew at that moment, so
that a restart (the usual remedy) does not destroy the evidence: the capture of its window (`replay` and `replay --html`
read it), the verdict trail, the stack dumps, and vLLM's processes, GPUs, version and flags (in diagnosis.json). No
prompt or output text is ever read; the URL is written without its credentials."""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .history.capture import CaptureWriter
from .model import VLLM_SOURCE, Reading, Snapshot, diagnosis_json
from .options import redact_url
from .signals.window import HistogramDelta, WindowView
from .store import Store

log = logging.getLogger(__name__)

MAX_BUNDLE_BYTES = 5 * 2**20
KEEP_BUNDLES = 10  # the newest; older ones are removed as new ones are written
MIN_SECONDS_BETWEEN = 600.0  # per condition: a verdict that flaps writes one bundle, not one per activation
# In every folder the sidecar writes: the bundle directory may be a volume shared with other files (bundles.volume takes
# any), and only what carries it is ever pruned or cleaned.
MARKER = ".vllm-triage-bundle"
README = """An incident bundle of vllm-triage, written when {condition} became active at {when} UTC.

- capture.jsonl.gz: the readings the sidecar held ({seconds:.0f} s of vLLM, its processes and the GPUs). Replay it:
    vllm-triage replay capture.jsonl.gz --html report.html
- diagnosis.json: /diagnosis at that moment: every verdict with its evidence, the stack dumps, and what was found of
  vLLM (version, flags, processes, GPUs, the rank map).
- verdicts.json: the verdict trail before it, one entry per tick: the primary verdict and the active ones.
- stacks.json: the Python stacks py-spy took of the process the verdict names (engine_wedged), where it stands.
- load.json: the load vLLM was under over those readings, per engine: requests arriving and finishing per second,
  running and waiting, and the prompt and output lengths (vLLM's histograms: counts per bucket, mean, p50, p95).
"""


def write_bundle(
    directory: Path,
    condition: str,
    snapshot: Snapshot,
    trail: Sequence[Snapshot],
    readings: Sequence[Reading],
    target: str,
    stack_dumps: Sequence[dict[str, object]] = (),
) -> Path:
    """Write the bundle of `condition` rising at `snapshot` into a new folder of `directory` and return it; the newest
    readings are kept when the whole window would not fit MAX_BUNDLE_BYTES."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(snapshot.timestamp))
    folder = directory / f"{stamp}-{condition}"
    partial = directory / f".{folder.name}.partial"  # renamed when whole: a reader never sees half a bundle
    _clean_partials(directory)  # a write killed with the sidecar (bundles are written one at a time)
    partial.mkdir()
    try:
        _fill(partial, condition, snapshot, trail, readings, target, stack_dumps)
        partial.rename(folder)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # a full volume keeps no half bundle
        raise
    _prune(directory, folder)
    return folder


def _fill(
    partial: Path,
    condition: str,
    snapshot: Snapshot,
    trail: Sequence[Snapshot],
    readings: Sequence[Reading],
    target: str,
    stack_dumps: Sequence[dict[str, object]],
) -> None:
    (partial / MARKER).write_text("written by vllm-triage: an incident bundle, pruned with the others\n")
    (partial / "diagnosis.json").write_bytes(diagnosis_json(snapshot))
    verdicts = [
        {
            "timestamp": s.timestamp,
            "primary": s.primary,
            "active": [{"condition": v.condition, "severity": v.severity, "cause": v.cause, "since": v.since} for v in s.verdicts if v.active],
        }
        for s in trail
    ]
    (partial / "verdicts.json").write_text(json.dumps(verdicts, indent=1))
    (partial / "stacks.json").write_text(json.dumps(list(stack_dumps), indent=1, default=str))
    (partial / "load.json").write_text(json.dumps(load_shape(readings), indent=1))
    used = sum(f.stat().st_size for f in partial.iterdir())
    kept = list(readings)
    while True:
        # bounded while it is written: the compressed bytes are counted as they go, and a capture over what is left of
        # the bound is stopped there (never written whole, then cut), and written again with fewer readings
        try:
            with open(partial / "capture.jsonl.gz", "wb") as raw:
                _write_capture(_Budget(MAX_BUNDLE_BYTES - used, raw), kept, condition, target)
            break
        except _OverBudget:
            if not kept:
                raise OSError(f"the bundle's other parts leave no room for its capture within {MAX_BUNDLE_BYTES} bytes") from None
            kept = _fewer(kept)
    seconds = kept[-1].timestamp - kept[0].timestamp if kept else 0.0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(snapshot.timestamp))
    (partial / "README.txt").write_text(README.format(condition=condition, when=when, seconds=seconds))


def load_shape(readings: Sequence[Reading]) -> dict[str, object]:
    """The load's shape over the readings' vLLM scrapes, per engine, through the window maths the verdicts use (counter
    resets across a restart count nothing). vLLM counts no arrivals: arriving is finishing plus the growth of running
    and waiting. Lengths come from vLLM's request_prompt_tokens and request_generation_tokens histograms."""
    store = Store(horizon_seconds=math.inf, max_frames=len(readings) + 1)
    for reading in sorted((r for r in readings if r.source == VLLM_SOURCE), key=lambda r: r.timestamp):
        store.add(reading)
    view = WindowView(store.window(VLLM_SOURCE, -math.inf, math.inf))
    engines: dict[str, object] = {}
    for scope in view.scopes() if view.span_seconds > 0 else ():
        running, waiting = view.gauge_points("vllm:num_requests_running", scope), view.gauge_points("vllm:num_requests_waiting", scope)
        finished = view.increase("vllm:request_success_total", scope)
        pending = [r + w for r, w in zip(running, waiting, strict=False)]
        arrived = None if finished is None or not pending else finished + pending[-1] - pending[0]
        engines[scope.key] = {
            "requests_arriving_per_second": None if arrived is None else round(max(arrived, 0.0) / view.span_seconds, 3),
            "requests_finishing_per_second": None if finished is None else round(finished / view.span_seconds, 3),
            "requests_running": _spread(running),
            "requests_waiting": _spread(waiting),
            "prompt_tokens": _lengths(view.histogram("vllm:request_prompt_tokens", scope)),
            "output_tokens": _lengths(view.histogram("vllm:request_generation_tokens", scope)),
        }
    return {"seconds": round(view.span_seconds, 1), "scrapes": len(view.frames), "engines": engines}


def _spread(points: list[float]) -> dict[str, float] | None:
    return {"mean": round(sum(points) / len(points), 2), "max": max(points)} if points else None


def _lengths(delta: HistogramDelta | None) -> dict[str, object] | None:
    """Requests finished in the span by length: each bucket's count (not cumulative; `le` as Prometheus writes it)."""
    if delta is None or delta.count <= 0:
        return None
    buckets, below = {}, 0.0
    for bound, cumulative in sorted(delta.buckets):
        buckets["+Inf" if math.isinf(bound) else f"{bound:g}"] = round(cumulative - below)
        below = cumulative
    quantiles = {f"p{round(q * 100)}": None if (v := delta.quantile(q)) is None else round(v, 1) for q in (0.5, 0.95)}
    return {"requests": round(delta.count), "mean": round(delta.mean() or 0.0, 1), **quantiles, "buckets": buckets}


class _OverBudget(Exception):
    pass


class _Budget(io.RawIOBase):
    """A binary sink into `out` that refuses (_OverBudget) the write that would take it past `budget` bytes."""

    def __init__(self, budget: int, out: io.BufferedWriter) -> None:
        self.budget, self.out, self.written = budget, out, 0

    def writable(self) -> bool:
        return True

    def write(self, data: object) -> int:
        chunk = memoryview(data)  # type: ignore[arg-type]  # bytes-like, as gzip hands it
        if self.written + chunk.nbytes > self.budget:
            raise _OverBudget
        self.written += chunk.nbytes
        self.out.write(chunk)
        return chunk.nbytes


def _fewer(readings: list[Reading]) -> list[Reading]:
    """The readings without the older half of the good ones: the failed scrapes (small, and what an outage's bundle is
    about) and the newest good readings stay; with no good reading left to drop, the older half of all."""
    good = [r.timestamp for r in readings if r.ok]
    if len(good) > 1:
        cut = sorted(good)[len(good) // 2]
        return [r for r in readings if not r.ok or r.timestamp >= cut]
    return readings[len(readings) // 2 :] if len(readings) > 1 else []


def _write_capture(path: Path | io.RawIOBase, readings: Sequence[Reading], condition: str, target: str) -> None:
    span = readings[-1].timestamp - readings[0].timestamp if readings else 0.0
    description = {"scenario": f"incident: {condition}", "vllm_url": redact_url(target), "phases": [["incident", span, 0]]}
    with CaptureWriter(path, description) as writer:
        for reading in readings:
            writer.write(reading)


def _ours(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def _clean_partials(directory: Path) -> None:
    for partial in directory.glob(".*.partial"):
        if _ours(partial):
            shutil.rmtree(partial, ignore_errors=True)


def _prune(directory: Path, written: Path) -> None:
    """The newest KEEP_BUNDLES of the sidecar's own bundles stay (the one just written always); nothing else is touched."""
    bundles = sorted(p for p in directory.iterdir() if not p.name.startswith(".") and p != written and _ours(p))
    for old in bundles[: max(0, len(bundles) - (KEEP_BUNDLES - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def bundle_archive(
    condition: str, snapshot: Snapshot, trail: Sequence[Snapshot], readings: Sequence[Reading], target: str, stack_dumps: Sequence[dict[str, object]] = ()
) -> bytes:
    """The bundle of this moment as a .tar.gz (`vllm-triage bundle`, GET /bundle.tar.gz): the same folder, not kept."""
    with tempfile.TemporaryDirectory(prefix="vllm-triage-bundle-") as scratch:
        folder = write_bundle(Path(scratch), condition, snapshot, trail, readings, target, stack_dumps)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            archive.add(folder, arcname=folder.name)
        return buffer.getvalue()
