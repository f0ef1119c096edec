"""The incident bundle: when a critical verdict rises, one bounded folder of what the sidecar knew at that moment, so
that a restart (the usual remedy) does not destroy the evidence: the capture of its window (`replay` and `replay --html`
read it), the verdict trail, the stack dumps, and vLLM's processes, GPUs, version and flags (in diagnosis.json). No
prompt or output text is ever read; the URL is written without its credentials."""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .capture import CaptureWriter
from .config import redact_url
from .model import Reading, Snapshot, diagnosis_json

log = logging.getLogger(__name__)

MAX_BUNDLE_BYTES = 5 * 2**20
KEEP_BUNDLES = 10  # the newest; older ones are removed as new ones are written
MIN_SECONDS_BETWEEN = 600.0  # per condition: a verdict that flaps writes one bundle, not one per activation
README = """An incident bundle of vllm-triage, written when {condition} became active at {when} UTC.

- capture.jsonl.gz: the readings the sidecar held ({seconds:.0f} s of vLLM, its processes and the GPUs). Replay it:
    vllm-triage replay capture.jsonl.gz --html report.html
- diagnosis.json: /diagnosis at that moment: every verdict with its evidence, the stack dumps, and what was found of
  vLLM (version, flags, processes, GPUs, the rank map).
- verdicts.json: the verdict trail before it, one entry per tick: the primary verdict and the active ones.
- stacks.json: the Python stacks py-spy took of the process the verdict names (engine_wedged), where it stands.
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
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
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
    used = sum(f.stat().st_size for f in partial.iterdir())
    kept = list(readings)
    while True:
        _write_capture(partial / "capture.jsonl.gz", kept, condition, target)
        size = (partial / "capture.jsonl.gz").stat().st_size
        if used + size <= MAX_BUNDLE_BYTES or len(kept) <= 1:
            break
        kept = kept[len(kept) // 2 :]  # the older half goes
    seconds = kept[-1].timestamp - kept[0].timestamp if kept else 0.0
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(snapshot.timestamp))
    (partial / "README.txt").write_text(README.format(condition=condition, when=when, seconds=seconds))
    partial.rename(folder)
    _prune(directory)
    return folder


def _write_capture(path: Path, readings: Sequence[Reading], condition: str, target: str) -> None:
    span = readings[-1].timestamp - readings[0].timestamp if readings else 0.0
    description = {"scenario": f"incident: {condition}", "vllm_url": redact_url(target), "phases": [["incident", span, 0]]}
    with CaptureWriter(path, description) as writer:
        for reading in readings:
            writer.write(reading)


def _prune(directory: Path) -> None:
    bundles = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    for old in bundles[:-KEEP_BUNDLES]:
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
