"""Incidents as long as people live through them, made of real captures: a stretch of a capture played over and over
in place (its readings moved on in time, its counters going on at the rate they went), and a capture served back as
the vLLM /metrics page it was read from, on the clock of a sidecar replaying it (`serve --demo --demo-speed`)."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from vllm_triage.history.capture import CaptureWriter, read_description, read_readings
from vllm_triage.model import VLLM_SOURCE, Reading, SeriesKey

COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")  # vLLM's, the process source's and the GPU source's counters


def marks(capture: Path) -> dict[str, float]:
    """The scenario's marks (phase starts, actions) beside a capture: `<name>.json`."""
    return dict(json.loads(capture.with_name(capture.name.removesuffix(".jsonl.gz") + ".json").read_text()))


def stretched(readings: list[Reading], start: float, end: float, seconds: float) -> list[Reading]:
    """`readings` with their [start, end) stretch played in whole repeats until it lasts at least `seconds`; what came
    after follows, moved on in time. Each repeat's counters go on from where the last one left them, by what they rose
    over the stretch, so rates stay what they were (and a stretch where nothing counted stays one)."""
    period = end - start
    repeats = max(1, math.ceil(seconds / period))
    stretch = [r for r in readings if start <= r.timestamp < end]
    rise = {
        source_key: after - before
        for source_key, before in _first_values(readings, start).items()
        if (after := _first_values(readings, end).get(source_key)) is not None
    }

    def moved(reading: Reading, times: int) -> Reading:
        samples = {
            key: value + times * rise.get((reading.source, key), 0.0) if key[0].endswith(COUNTER_SUFFIXES) else value for key, value in reading.samples.items()
        }
        return dataclasses.replace(reading, timestamp=reading.timestamp + times * period, samples=samples)

    return (
        [r for r in readings if r.timestamp < start]
        + [moved(r, times) for times in range(repeats) for r in stretch]
        + [moved(r, repeats - 1) for r in readings if r.timestamp >= end]
    )


def _first_values(readings: list[Reading], at: float) -> dict[tuple[str, SeriesKey], float]:
    """Each counter series' value in the first reading of its source at or after `at` (the last before, if none)."""
    values: dict[tuple[str, SeriesKey], float] = {}
    for reading in sorted(readings, key=lambda r: (r.timestamp < at, abs(r.timestamp - at))):
        for key, value in reading.samples.items():
            if key[0].endswith(COUNTER_SUFFIXES):
                values.setdefault((reading.source, key), value)
    return values


def write(path: Path, source: Path, readings: list[Reading], how: str) -> Path:
    """A capture of `readings`, its header the source capture's with how it was made from it."""
    description = {**read_description(source), "made_from": f"{source.name}: {how}"}
    with CaptureWriter(path, description) as writer:
        for reading in readings:
            writer.write(reading)
    return path


def load(capture: Path) -> list[Reading]:
    return list(read_readings(capture))


def exposition(reading: Reading) -> bytes:
    """A vLLM reading as the text page it was parsed from (untyped samples: what rules and rate() read)."""

    def labels(pairs: tuple[tuple[str, str], ...]) -> str:
        inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in pairs)
        return "{" + inner + "}" if inner else ""

    def number(value: float) -> str:
        return repr(value) if math.isfinite(value) else {"inf": "+Inf", "-inf": "-Inf"}.get(repr(value), "NaN")

    return "".join(f"{name}{labels(pairs)} {number(value)}\n" for (name, pairs), value in reading.samples.items()).encode()


class ReplayedVllm:
    """vLLM's /metrics as a capture read it, at the capture time of a sidecar started now with the same capture and
    speed; 503 where the capture's scrape failed (nothing answered: Prometheus' `up` is 0 either way)."""

    def __init__(self, readings: list[Reading], speed: float) -> None:
        self.pages = [(r.timestamp, exposition(r) if r.ok else None) for r in readings if r.source == VLLM_SOURCE]
        self.first = min(r.timestamp for r in readings)
        self.speed = speed
        self.started = time.monotonic()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = outer.page()
                self.send_response(200 if page is not None else 503)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(page or b"")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def restart_clock(self) -> None:
        """Time 0 of the capture is now (call when the sidecar started replaying)."""
        self.started = time.monotonic()

    def page(self) -> bytes | None:
        now = self.first + (time.monotonic() - self.started) * self.speed
        latest = None
        for timestamp, page in self.pages:
            if timestamp > now:
                break
            latest = (page,)
        return latest[0] if latest else None

    def stop(self) -> None:
        self.server.shutdown()
