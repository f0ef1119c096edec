"""`vllm-triage serve | diagnose | record | replay`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from . import __version__, traces
from .capture import CaptureError, CaptureWriter, demo_capture_path, read_readings
from .config import DEFAULT_PORT, OPTIONS, Config, ConfigError, add_flags, load
from .daemon import ConfigWatch, serve_forever, steady_wall_clock
from .model import PROCESS_SOURCE, VLLM_SOURCE, Reading, Snapshot, diagnosis_json
from .pipeline import judge_at, replay
from .registry import SourceLoop, build_sources
from .report import format_report, format_transition
from .webconfig import load_web_config

SCRAPE_KEYS = (
    "vllm_url",
    "metrics_path",
    "scrape_interval_seconds",
    "scrape_timeout_seconds",
    "connect_timeout_seconds",
    "max_page_bytes",
    "max_series",
    "max_engines",
    "max_label_value_length",
    "max_num_seqs",
    "sources",
    "process_title_prefix",
    "process_interval_seconds",
    "gpu_interval_seconds",
    "gpus",
    "gpm",
    "gil_interval_seconds",
    "gil_window_seconds",
    "gil_rate",
    "gil_nonblocking",
    "log_level",
)


def _seconds(text: str) -> float:
    """A duration for --seconds: finite, above zero, at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds above 0 and at most 86400")
    return value


def _offset(text: str) -> float:
    """An offset into a capture for --at: finite and not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds from the capture's start, 0 or more")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-triage",
        description="Tells why a vLLM server is slow: joins vLLM's metrics, the GPUs and the host, and exports the diagnosis.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-triage {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--config", metavar="FILE", help="YAML config file (keys as the flags, plus per-condition overrides).")

    serve = commands.add_parser("serve", help="Run the sidecar (scrape, diagnose, serve /metrics and /diagnosis).")
    with_config(serve)
    add_flags(serve)

    diagnose = commands.add_parser("diagnose", help="Observe a vLLM (or a capture) and print a report an on-call engineer can act on.")
    with_config(diagnose)
    add_flags(diagnose, SCRAPE_KEYS)
    diagnose.add_argument("--seconds", type=_seconds, default=30.0, help="How long to observe (the report's window). Default 30.")
    diagnose.add_argument("--capture", metavar="FILE", help="Diagnose a recorded capture instead of a live vLLM ('demo': the bundled one).")
    diagnose.add_argument("--at", type=_offset, metavar="S", help="With --capture: judge at S seconds after the capture's start (default: its end).")
    diagnose.add_argument("--json", action="store_true", help="Print the /diagnosis JSON instead of the report.")

    record = commands.add_parser("record", help="Write raw readings to a capture file (gzip JSON lines) for replay.")
    with_config(record)
    add_flags(record, SCRAPE_KEYS)
    record.add_argument("--out", required=True, metavar="FILE", help="Capture file to write (.jsonl.gz).")
    record.add_argument("--seconds", type=_seconds, default=60.0, help="How long to record. Default 60.")

    report = commands.add_parser("report", help="Print a running sidecar's report (or its /diagnosis JSON): in its container, where there is no curl.")
    report.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}", help=f"The sidecar's address. Default http://127.0.0.1:{DEFAULT_PORT}.")
    report.add_argument("--json", action="store_true", help="Print the /diagnosis JSON instead of the report.")
    report.add_argument("--condition", metavar="ID", help="With --json: only this condition's verdict, evidence and next actions.")
    report.add_argument("--timeout", type=_seconds, default=10.0, help="Give up after this many seconds. Default 10.")

    play = commands.add_parser("replay", help="Run the pipeline over a capture on a virtual clock; print the verdict timeline.")
    with_config(play)
    add_flags(play, ("tick_seconds", "window_seconds", "max_num_seqs", "log_level"))
    play.add_argument("capture", metavar="FILE", help="Capture file ('demo': the bundled one).")
    play.add_argument("--json", action="store_true", help="Print one JSON object per state change.")

    trace = commands.add_parser("trace", help="Summarise a torch profiler trace (vLLM's profiler output, *.pt.trace.json.gz).")
    trace.add_argument("trace", metavar="PATH", nargs="+", help="Trace files (gzip or plain Chrome trace JSON) or folders of them (one per worker).")
    trace.add_argument("--top", type=int, default=5, help="Kernels and host ops to list. Default 5.")
    trace.add_argument("--slices", type=int, default=10, help="Slices of the traced window in the timeline. Default 10.")
    trace.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    return parser


def _config(args: argparse.Namespace) -> Config:
    flags = {o.key: getattr(args, o.key, None) for o in OPTIONS}
    return load(getattr(args, "config", None), flags=flags)


def _report(args: argparse.Namespace) -> int:
    """GET /report or /diagnosis from a running sidecar and print it."""
    url = args.url.rstrip("/") + ("/diagnosis" if args.json else "/report")
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:
            body = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:  # 503 while starting: its body says why
        print(f"vllm-triage: {url} answered {error.code}: {error.read().decode('utf-8', errors='replace').strip()}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        print(f"vllm-triage: no sidecar answers at {url}: {reason}", file=sys.stderr)
        return 1
    if args.json and args.condition:
        conditions = json.loads(body)["conditions"]
        found = [c for c in conditions if c["condition"] == args.condition]
        if not found:
            print(f"vllm-triage: no condition {args.condition!r}; expected one of {', '.join(c['condition'] for c in conditions)}", file=sys.stderr)
            return 2
        body = json.dumps(found[0], indent=1)
    print(body.rstrip("\n"))
    return 0


def _capture_path(name: str) -> Path:
    return demo_capture_path() if name == "demo" else Path(name)


def _instant(config: Config, window_seconds: float) -> Config:
    """Settings for a one-shot judgement: no debouncing, one window over the whole observation."""
    conditions = {cid: dataclasses.replace(s, for_seconds=0.0, clear_seconds=0.0, window_seconds=window_seconds) for cid, s in config.conditions.items()}
    return dataclasses.replace(config, window_seconds=window_seconds, conditions=conditions)


async def observe(config: Config, seconds: float, writer: CaptureWriter | None = None) -> list[Reading]:
    """Run the configured sources for `seconds`, each on its own interval; return what they read."""
    readings: list[Reading] = []

    def keep(reading: Reading) -> None:
        readings.append(reading)
        if writer is not None:
            writer.write(reading)

    loops = build_sources(config, steady_wall_clock(), lambda: next((r for r in reversed(readings) if r.source == PROCESS_SOURCE), None))
    deadline = time.monotonic() + seconds

    async def run(loop_: SourceLoop, started: float) -> None:
        while started + loop_.interval <= deadline:
            await asyncio.sleep(max(0.0, loop_.interval - (time.monotonic() - started)))
            started = time.monotonic()
            keep(await loop_.collect())

    try:
        # One round in order first: the GPU source maps the processes found to their GPUs.
        for loop_ in loops:
            keep(await loop_.collect())
        now = time.monotonic()
        await asyncio.gather(*(run(loop_, now) for loop_ in loops))
    finally:
        for loop_ in loops:
            await loop_.close()
    return readings


def _diagnose(args: argparse.Namespace, config: Config) -> int:
    if args.capture:
        readings = list(read_readings(_capture_path(args.capture)))
        if not readings:
            print(f"{args.capture}: the capture has no readings", file=sys.stderr)
            return 2
        start, end = readings[0].timestamp, readings[-1].timestamp
        if args.at is not None and start + args.at > end:
            print(f"vllm-triage: --at {args.at:g} is past the capture's end ({end - start:.0f} s after its start)", file=sys.stderr)
            return 2
        now = start + args.at if args.at is not None else end
        target = f"capture {args.capture}"
    else:
        print(f"observing {config.vllm_url_shown} for {args.seconds:.0f} s ...", file=sys.stderr)
        readings = asyncio.run(observe(config, args.seconds))
        now = readings[-1].timestamp
        target = config.vllm_url_shown
    snapshot = judge_at(_instant(config, args.seconds), readings, now, captured=bool(args.capture))
    if args.json:
        print(diagnosis_json(snapshot).decode())
    else:
        print(format_report(snapshot, target), end="")
    # vLLM never read: the finding is the outage, and no other verdict could be made (exit 1, as a check would)
    never_read = any(h.source == VLLM_SOURCE and h.last_success_timestamp is None and h.up is False for h in snapshot.sources)
    return 1 if never_read else 0


def _record(args: argparse.Namespace, config: Config) -> int:
    description: dict[str, Any] = {"vllm_url": config.vllm_url_shown, "created": time.time(), "seconds": args.seconds}
    with CaptureWriter(args.out, description) as writer:
        readings = asyncio.run(observe(config, args.seconds, writer))
    ok = sum(1 for r in readings if r.ok and r.source == VLLM_SOURCE)
    print(f"wrote {len(readings)} readings ({ok} successful vLLM scrapes) to {args.out}")
    return 0


def _replay(args: argparse.Namespace, config: Config) -> int:
    readings = list(read_readings(_capture_path(args.capture)))
    if not readings:
        print(f"{args.capture}: the capture has no readings", file=sys.stderr)
        return 2
    start = readings[0].timestamp
    states: dict[str, str] = {}

    def on_tick(snapshot: Snapshot) -> None:
        for verdict in snapshot.verdicts:
            before = states.get(verdict.condition)
            if before != verdict.state:
                states[verdict.condition] = verdict.state
                if args.json:
                    record = {"offset_seconds": round(snapshot.timestamp - start, 3), "from": before, **verdict.to_json()}
                    print(json.dumps(record))
                elif before is not None or verdict.state == "active":
                    print(format_transition(start, snapshot.timestamp, before, verdict))

    final = replay(readings, config, on_tick)
    if final is not None and not args.json:
        active = [v.condition for v in final.verdicts if v.active]
        span = readings[-1].timestamp - start
        print(f"replayed {len(readings)} readings over {span:.0f} s; active at the end: {', '.join(active) or 'none'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "serve":
            watch = ConfigWatch(Path(args.config), partial(_config, args)) if getattr(args, "config", None) else None
            try:
                web = load_web_config(config.web_config_file) if config.web_config_file else None
            except ConfigError as exc:
                print(f"vllm-triage: {exc}", file=sys.stderr)
                return 2
            asyncio.run(serve_forever(config, watch, web))
            return 0
        if args.command == "diagnose":
            return _diagnose(args, config)
        if args.command == "report":
            return _report(args)
        if args.command == "record":
            return _record(args, config)
        if args.command == "trace":
            summaries, skipped = traces.summarize_paths(args.trace, top=max(1, args.top), slices=max(1, args.slices))
            for note in skipped:
                print(f"vllm-triage: {note}", file=sys.stderr)
            if args.json:
                print(json.dumps([s.to_json() for s in summaries], indent=2))
            else:
                print("\n\n".join(traces.report(s) for s in summaries))
            return 0
        return _replay(args, config)
    except (CaptureError, traces.TraceError) as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
