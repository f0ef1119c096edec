"""Captures: Readings as gzip-compressed JSON lines, one header line first.

The header names the format; every following line is one Reading (model.Reading.to_json).
Replaying a capture feeds the same Readings to the same pipeline, so verdicts are reproducible.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import IO, Any

from .model import Reading

log = logging.getLogger(__name__)

FORMAT = "vllm-triage-capture"
VERSION = 1
DEMO_CAPTURE = "demo.jsonl.gz"


class CaptureError(ValueError):
    pass


class CaptureWriter:
    def __init__(self, path: str | Path, description: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self._handle: IO[str] = gzip.open(self.path, "wt", encoding="utf-8")
        header = {"format": FORMAT, "version": VERSION, **(description or {})}
        self._write(header)

    def _write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, separators=(",", ":")) + "\n")

    def write(self, reading: Reading) -> None:
        self._write(reading.to_json())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: str | Path) -> IO[str]:
    try:
        return gzip.open(path, "rt", encoding="utf-8")
    except OSError as exc:
        raise CaptureError(f"cannot open capture {path}: {exc.strerror}") from None


def _header(handle: IO[str], path: str | Path) -> dict[str, Any]:
    try:
        header = json.loads(handle.readline())
    except (OSError, EOFError, json.JSONDecodeError) as exc:
        raise CaptureError(f"{path} is not a vllm-triage capture (gzip JSON lines): {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CaptureError(f"{path} is not a vllm-triage capture: the first line has no format={FORMAT!r}")
    if header.get("version") != VERSION:
        raise CaptureError(f"{path} is capture version {header.get('version')}, this sidecar reads version {VERSION}")
    return header


def read_description(path: str | Path) -> dict[str, Any]:
    """The header a recorder wrote (format, version and what it recorded, e.g. the phases it drove)."""
    with _open(path) as handle:
        return _header(handle, path)


def read_readings(path: str | Path) -> Iterator[Reading]:
    """The Readings of a capture in timestamp order (stable for equal timestamps)."""
    readings = []
    with _open(path) as handle:
        _header(handle, path)
        number, line = 1, ""
        try:
            for line in handle:
                number += 1
                if line.strip():
                    readings.append(Reading.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as exc:
            if not line.endswith("\n"):  # the last line of a recording cut short
                log.warning("%s: line %d is incomplete; using the %d readings before it", path, number, len(readings))
            else:
                raise CaptureError(f"{path} line {number}: not a reading ({exc})") from None
        except (OSError, EOFError) as exc:
            # A recorder that was killed leaves no gzip trailer: keep what was written.
            log.warning("%s is truncated after line %d (%s); using the %d readings before it", path, number, exc, len(readings))
    readings.sort(key=lambda r: r.timestamp)
    return iter(readings)


def demo_capture_path() -> Path:
    return Path(str(resources.files("vllm_triage") / "data" / DEMO_CAPTURE))
