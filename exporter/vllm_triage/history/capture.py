"""Captures: Readings as gzip-compressed JSON lines, one header line first.

The header names the format; every following line is one Reading (model.Reading.to_json).
Replaying a capture feeds the same Readings to the same pipeline, so verdicts are reproducible.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import zlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import IO, Any

from ..config import DEFAULT_MAX_ENGINES, DEFAULT_MAX_SERIES
from ..model import VLLM_SOURCE, Reading
from ..scope import scope_of

log = logging.getLogger(__name__)

FORMAT = "vllm-triage-capture"
VERSION = 1
DEMO_CAPTURE = "demo.jsonl.gz"


class CaptureError(ValueError):
    pass


class CaptureWriter:
    def __init__(self, path: str | Path | IO[bytes] | io.RawIOBase, description: dict[str, Any] | None = None) -> None:
        """Into the file at `path`, or into a binary file object (a sink that refuses past a byte budget: bundle.py)."""
        self._handle: IO[str] = gzip.open(path, "wt", encoding="utf-8")
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


# A capture is minutes to hours of one server; a span past this means a reading with a wrong timestamp,
# which would make replay step through it tick by tick for ever.
MAX_SPAN_SECONDS = 7 * 86_400
# One reading's line, decompressed: a page at max_page_bytes recorded as JSON is a few MB; a longer line is a crafted one
# (400 MB in a 400 kB gzip) and is refused before it is held whole.
MAX_LINE_CHARS = 32 * 2**20
# What a corrupt gzip stream raises: OSError (BadGzipFile), EOFError (cut short), zlib.error (bad
# deflate data), UnicodeDecodeError (not UTF-8 text).
_CORRUPT = (OSError, EOFError, zlib.error, UnicodeDecodeError)


def _header(handle: IO[str], path: str | Path) -> dict[str, Any]:
    try:
        header = json.loads(handle.readline())
    except (*_CORRUPT, json.JSONDecodeError) as exc:
        raise CaptureError(f"{path} is not a vllm-triage capture (gzip JSON lines): {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CaptureError(f"{path} is not a vllm-triage capture: the first line has no format={FORMAT!r}")
    if header.get("version") != VERSION or isinstance(header.get("version"), bool):
        raise CaptureError(f"{path} has capture version {header.get('version')!r}; this sidecar reads version {VERSION} (the number)")
    return header


def read_description(path: str | Path) -> dict[str, Any]:
    """The header a recorder wrote (format, version and what it recorded, e.g. the phases it drove)."""
    with _open(path) as handle:
        return _header(handle, path)


def _over_live_limits(reading: Reading, max_series: int, max_engines: int) -> str | None:
    """What a reading holds past the live path's limits (a page the vLLM source would have refused), else None."""
    if len(reading.samples) > max_series:
        return f"{len(reading.samples)} series, over max_series {max_series}"
    if reading.source == VLLM_SOURCE:
        engines = {scope for _, labels in reading.samples if (scope := scope_of(labels)).kind == "engine"}
        if len(engines) > max_engines:
            return f"{len(engines)} vLLM engines, over max_engines {max_engines}"
    return None


def read_readings(path: str | Path, max_series: int = DEFAULT_MAX_SERIES, max_engines: int = DEFAULT_MAX_ENGINES) -> Iterator[Reading]:
    """The Readings of a capture in timestamp order (stable for equal timestamps), each within the live path's series
    and engine limits (a crafted 5,000-engine capture once took 588 MB)."""
    readings = []
    with _open(path) as handle:
        _header(handle, path)
        number, line = 1, ""
        try:
            for line in iter(lambda: handle.readline(MAX_LINE_CHARS + 1), ""):
                number += 1
                if len(line) > MAX_LINE_CHARS:
                    raise CaptureError(f"{path} line {number} is over {MAX_LINE_CHARS // 2**20} MiB decompressed: not a reading this sidecar wrote")
                if line.strip():
                    reading = Reading.from_json(json.loads(line))
                    if (over := _over_live_limits(reading, max_series, max_engines)) is not None:
                        raise CaptureError(f"{path} line {number}: a {reading.source} reading of {over}: raise the limit to replay it")
                    readings.append(reading)
        except CaptureError:
            raise
        except (*_CORRUPT, EOFError) as exc:
            # A recorder that was killed leaves no gzip trailer; a damaged file stops somewhere: keep what was read.
            if not readings:
                raise CaptureError(f"{path} is damaged before its first reading ({type(exc).__name__}: {exc})") from None
            log.warning("%s is truncated or damaged after line %d (%s); using the %d readings before it", path, number, exc, len(readings))
        except (ValueError, KeyError, TypeError) as exc:
            if not line.endswith("\n"):  # the last line of a recording cut short
                log.warning("%s: line %d is incomplete; using the %d readings before it", path, number, len(readings))
            else:
                raise CaptureError(f"{path} line {number}: not a reading ({type(exc).__name__}: {exc})") from None
    readings.sort(key=lambda r: r.timestamp)
    if readings and readings[-1].timestamp - readings[0].timestamp > MAX_SPAN_SECONDS:
        raise CaptureError(f"{path} spans {readings[-1].timestamp - readings[0].timestamp:.3g} s, over {MAX_SPAN_SECONDS} s: a reading has a wrong timestamp")
    return iter(readings)


def demo_capture_path() -> Path:
    return Path(str(resources.files("vllm_triage") / "data" / DEMO_CAPTURE))
