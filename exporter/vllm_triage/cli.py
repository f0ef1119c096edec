"""`vllm-triage serve | diagnose | record | replay | report | bundle | fleet | trace`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
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

from . import __version__, html_report, traces
from .config import DEFAULT_PORT, OPTIONS, Config
from .config_loader import add_flags, load
from .daemon import ConfigWatch, serve_forever, steady_wall_clock
from .history.capture import CaptureError, CaptureWriter, demo_capture_path, read_readings
from .history.fleet import fleet_json, format_fleet, judge_fleet
from .history.prometheus import HistoryError, HistoryLimits, PrometheusHistory
from .model import PROCESS_SOURCE, VLLM_SOURCE, ProcessTargets, Reading, Snapshot, diagnosis_json
from .options import ConfigError, redact_url
from .pipeline import judge_at, replay
from .registry import build_sources, start_sources
from .report import SEVERITY_ORDER, format_report, format_transition
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
    "log_format",
)


def _logfmt_value(value: str) -> str:
    return json.dumps(value) if not value or any(c in value for c in ' ="\n') else value


class StructuredLines(logging.Formatter):
    """One log line of time, level, logger and msg that log pipelines parse without a pattern, as node_exporter's
    --log.format: a JSON object, or logfmt's key=value pairs (values with a space, a quote or = quoted)."""

    def __init__(self, logfmt: bool) -> None:
        super().__init__()
        self.logfmt = logfmt

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if not self.logfmt:
            return json.dumps(entry)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in entry.items())


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


def _slices(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of slices") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: between 1 and 1000 slices (a timeline line each)")
    return value


LATEST_TIME = 4102444800.0  # 2100-01-01T00:00:00Z


def _time(text: str) -> float:
    """A point in time for --at/--from/--to with --prometheus: Unix seconds, ISO 8601 (2026-12-01T02:40:00Z) or now."""
    if text == "now":
        return time.time()
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected Unix seconds, an ISO 8601 time (2026-12-01T02:40:00Z) or now") from None
        if moment.tzinfo is None:
            raise argparse.ArgumentTypeError(f"{text!r}: give the time zone (Z or +02:00): a bare time is ambiguous at 3 a.m.") from None
        value = moment.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: not a time")
    if value > LATEST_TIME:  # far enough out, adding a 2 s step no longer changes the float: a replay would never end
        raise argparse.ArgumentTypeError(f"{text!r}: after the year 2100, not a time Prometheus holds")
    return value


def _history_flags(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--prometheus", metavar="URL", help="Judge the history a Prometheus holds instead (vLLM's series, and the sidecar's where it ran).")
    sub.add_argument(
        "--selector", default="", metavar="'{...}'", help='With --prometheus: label matchers that pick one server, e.g. \'{namespace="llm",pod="vllm-0"}\'.'
    )
    sub.add_argument("--step", type=_seconds, default=2.0, help="With --prometheus: seconds between the points read (vLLM's scrape interval). Default 2.")


EXIT_CODES = """exit codes:
  0    done (diagnose: nothing active at --fail-on's severity or above)
  1    diagnose: a verdict active at --fail-on's severity or above, or vLLM never answered; report, bundle: the sidecar
       did not answer; a file could not be read or written
  2    a wrong flag, config value or capture, named on standard error
  130  interrupted"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-triage",
        description="Tells why a vLLM server is slow: joins vLLM's metrics, the GPUs and the host, and exports the diagnosis.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    diagnose.add_argument(
        "--seconds", type=_seconds, help="How long to observe (the report's window). Default 30; with --prometheus, the history judged before --at: 600."
    )
    diagnose.add_argument("--capture", metavar="FILE", help="Diagnose a recorded capture instead of a live vLLM ('demo': the bundled one).")
    diagnose.add_argument(
        "--at", metavar="WHEN", help="With --capture: seconds after its start (default: its end). With --prometheus: a time (Unix, ISO 8601, now)."
    )
    _history_flags(diagnose)
    diagnose.add_argument("--json", action="store_true", help="Print the /diagnosis JSON instead of the report.")
    diagnose.add_argument("--verbose", action="store_true", help="The report with the next actions for causes not observed too.")
    diagnose.add_argument(
        "--fail-on",
        choices=("critical", "warning", "info"),
        help="Exit 1 when a verdict of this severity or a more severe one is active (a check in CI or a cron job). Default: exit 0 whatever is found.",
    )

    record = commands.add_parser("record", help="Write raw readings to a capture file (gzip JSON lines) for replay.")
    with_config(record)
    add_flags(record, SCRAPE_KEYS)
    record.add_argument("--out", required=True, metavar="FILE", help="Capture file to write (.jsonl.gz).")
    record.add_argument("--seconds", type=_seconds, default=60.0, help="How long to record. Default 60.")

    report = commands.add_parser("report", help="Print a running sidecar's report (or its /diagnosis JSON): in its container, where there is no curl.")
    report.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}", help=f"The sidecar's address. Default http://127.0.0.1:{DEFAULT_PORT}.")
    report.add_argument("--json", action="store_true", help="Print the /diagnosis JSON instead of the report.")
    report.add_argument("--condition", metavar="ID", help="With --json: only this condition's verdict, evidence and next actions.")
    report.add_argument("--verbose", action="store_true", help="The report with the next actions for causes not observed too.")
    report.add_argument("--timeout", type=_seconds, default=10.0, help="Give up after this many seconds. Default 10.")
    report.add_argument(
        "--html",
        metavar="OUT",
        help="Write the sidecar's incident page of its last minutes (its /report.html) to OUT; of a capture or Prometheus: replay --html.",
    )

    bundle = commands.add_parser(
        "bundle", help="Fetch a running sidecar's incident bundle of this moment (its window's capture, verdicts, stacks, vLLM's processes and flags)."
    )
    bundle.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}", help=f"The sidecar's address. Default http://127.0.0.1:{DEFAULT_PORT}.")
    bundle.add_argument("--out", metavar="FILE", help="Where to write the .tar.gz. Default vllm-triage-bundle-<UTC time>.tar.gz here.")
    bundle.add_argument("--timeout", type=_seconds, default=30.0, help="Give up after this many seconds. Default 30.")

    play = commands.add_parser("replay", help="Run the pipeline over a capture on a virtual clock; print the verdict timeline.")
    with_config(play)
    add_flags(play, ("tick_seconds", "window_seconds", "max_num_seqs", "log_level"))
    play.add_argument("capture", metavar="FILE", nargs="?", help="Capture file ('demo': the bundled one).")
    _history_flags(play)
    play.add_argument("--from", dest="start", type=_time, metavar="WHEN", help="With --prometheus: where the history starts.")
    play.add_argument("--to", dest="end", type=_time, metavar="WHEN", help="With --prometheus: where it ends. Default now.")
    play.add_argument("--json", action="store_true", help="Print one JSON object per state change.")
    play.add_argument(
        "--html",
        metavar="OUT",
        help="Also write the incident page to OUT: one self-contained HTML file (verdict bands over the three layers' plots, "
        "then each verdict's evidence and next actions), readable offline.",
    )

    fleet = commands.add_parser("fleet", help="Every vLLM a Prometheus scraped, judged on its history, by severity; replicas out of balance.")
    with_config(fleet)
    add_flags(fleet, ("window_seconds", "max_num_seqs", "log_level"))
    fleet.add_argument("--prometheus", metavar="URL", required=True, help="The Prometheus that scraped them.")
    fleet.add_argument("--selector", default="", metavar="'{...}'", help="Label matchers that pick the servers, e.g. '{namespace=\"llm\"}'.")
    fleet.add_argument("--at", type=_time, default=None, metavar="WHEN", help="Judge at this time (Unix, ISO 8601, now). Default now.")
    fleet.add_argument("--seconds", type=_seconds, default=600.0, help="History judged before --at, per server. Default 600.")
    fleet.add_argument("--step", type=_seconds, default=2.0, help="Seconds between the points read. Default 2.")
    fleet.add_argument("--json", action="store_true", help="Print JSON instead of the list.")

    trace = commands.add_parser("trace", help="Summarise a torch profiler trace (vLLM's profiler output, *.pt.trace.json.gz).")
    trace.add_argument("trace", metavar="PATH", nargs="+", help="Trace files (gzip or plain Chrome trace JSON) or folders of them (one per worker).")
    trace.add_argument("--top", type=int, default=5, help="Kernels and host ops to list. Default 5.")
    trace.add_argument("--slices", type=_slices, default=10, help="Slices of the traced window in the timeline, 1-1000. Default 10.")
    trace.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    return parser


def _config(args: argparse.Namespace) -> Config:
    flags = {o.key: getattr(args, o.key, None) for o in OPTIONS}
    return load(getattr(args, "config", None), flags=flags)


def _from_sidecar(url: str, timeout: float) -> bytes | None:
    """GET one of a running sidecar's pages; None, said on stderr, when it does not answer or answers an error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as error:  # 503 while starting: its body says why
        print(f"vllm-triage: {url} answered {error.code}: {error.read().decode('utf-8', errors='replace').strip()}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        print(f"vllm-triage: no sidecar answers at {url}: {reason}", file=sys.stderr)
    return None


def _bundle(args: argparse.Namespace) -> int:
    """GET /bundle.tar.gz from a running sidecar and write it."""
    archive = _from_sidecar(args.url.rstrip("/") + "/bundle.tar.gz", args.timeout)
    if archive is None:
        return 1
    out = Path(args.out or time.strftime("vllm-triage-bundle-%Y%m%dT%H%M%SZ.tar.gz", time.gmtime()))
    out.write_bytes(archive)
    print(f"wrote {out} ({len(archive) / 1e3:.0f} kB): tar xzf it; its capture.jsonl.gz replays (vllm-triage replay)", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    """GET /report or /diagnosis from a running sidecar and print it (or /report.html, written to a file)."""
    url = args.url.rstrip("/") + ("/report.html" if args.html else "/diagnosis" if args.json else "/report?verbose=1" if args.verbose else "/report")
    fetched = _from_sidecar(url, args.timeout)
    if fetched is None:
        return 1
    body = fetched.decode("utf-8", errors="replace")
    if args.html:
        Path(args.html).write_text(body, encoding="utf-8")
        print(f"wrote {args.html} ({len(body.encode()) / 1e3:.0f} kB)", file=sys.stderr)
        return 0
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


# vllm_unreachable's bars before vLLM's first answer (how long a start may take, by what the host shows)
START_BARS = ("startup_grace_seconds", "not_started_seconds", "startup_grace_no_process_seconds")


def _instant(config: Config, window_seconds: float) -> Config:
    """Settings for a one-shot judgement: no debouncing, one window over the whole observation, and no startup grace
    (whoever asks wants to know whether vLLM answers now)."""
    conditions = {
        cid: dataclasses.replace(
            s,
            for_seconds=0.0,
            clear_seconds=0.0,
            window_seconds=window_seconds,
            thresholds={**s.thresholds, **{name: 0.0 for name in START_BARS if name in s.thresholds}},
        )
        for cid, s in config.conditions.items()
    }
    return dataclasses.replace(config, window_seconds=window_seconds, conditions=conditions)


async def observe(config: Config, seconds: float, writer: CaptureWriter | None = None) -> list[Reading]:
    """Run the configured sources for `seconds`, each on its own interval; return what they read."""
    readings: list[Reading] = []
    targets = ProcessTargets()

    async def keep(reading: Reading) -> None:
        readings.append(reading)
        if reading.source == PROCESS_SOURCE:
            targets.update(reading)
        if writer is not None:
            writer.write(reading)

    loops = build_sources(config, steady_wall_clock(), targets)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    try:
        # a reading under way when the time is up is kept: the last py-spy window or scrape is whole
        await (await start_sources(loops, keep, stop))
    finally:
        stop.set()
        for loop_ in loops:
            await loop_.close()
    return readings


def _history(args: argparse.Namespace, start: float, end: float) -> list[Reading]:
    """The readings a Prometheus holds for [start, end] (vLLM's carry the max_num_seqs a sidecar beside it exported)."""
    history = PrometheusHistory(args.prometheus, args.selector, HistoryLimits(step_seconds=args.step))
    readings = asyncio.run(history.readings(start, end))
    for note in history.notes:
        print(f"vllm-triage: note: {note}", file=sys.stderr)
    return readings


def _diagnose(args: argparse.Namespace, config: Config) -> int:
    if args.prometheus:
        at = args.at or time.time()
        readings = _history(args, at - (args.seconds or 600.0), at)
        snapshot = replay(readings, config, lambda _: None, until=at)
        assert snapshot is not None
        when = datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(timespec="seconds")
        target = f"Prometheus {redact_url(args.prometheus)} {args.selector or '(every series)'} at {when}"
        return _print_diagnosis(args, snapshot, target)
    if args.seconds is None:
        args.seconds = 30.0
    if args.capture:
        readings = list(read_readings(_capture_path(args.capture), config.max_series, config.max_engines))
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
    return _print_diagnosis(args, snapshot, target)


def _print_diagnosis(args: argparse.Namespace, snapshot: Snapshot, target: str) -> int:
    if args.json:
        print(diagnosis_json(snapshot).decode())
    else:
        print(format_report(snapshot, target, verbose=args.verbose), end="")
    # vLLM never read: the finding is the outage, and no other verdict could be made (exit 1, as a check would)
    never_read = any(h.source == VLLM_SOURCE and h.last_success_timestamp is None and h.up is False for h in snapshot.sources)
    worst = SEVERITY_ORDER[args.fail_on] if args.fail_on else -1
    failing = [v.condition for v in snapshot.verdicts if v.active and SEVERITY_ORDER.get(v.severity, 9) <= worst]
    if failing:
        print(f"vllm-triage: {', '.join(failing)} active (--fail-on {args.fail_on})", file=sys.stderr)
    return 1 if never_read or failing else 0


def _record(args: argparse.Namespace, config: Config) -> int:
    description: dict[str, Any] = {"vllm_url": config.vllm_url_shown, "created": time.time(), "seconds": args.seconds}
    with CaptureWriter(args.out, description) as writer:
        readings = asyncio.run(observe(config, args.seconds, writer))
    ok = sum(1 for r in readings if r.ok and r.source == VLLM_SOURCE)
    print(f"wrote {len(readings)} readings ({ok} successful vLLM scrapes) to {args.out}")
    return 0


def _replay(args: argparse.Namespace, config: Config) -> int:
    if args.prometheus:
        if args.start is None:
            print("vllm-triage: replay --prometheus needs --from", file=sys.stderr)
            return 2
        if args.start >= (args.end or time.time()):
            print("vllm-triage: --from must come before --to (or before now)", file=sys.stderr)
            return 2
        readings = _history(args, args.start, args.end or time.time())
    elif args.capture:
        readings = list(read_readings(_capture_path(args.capture), config.max_series, config.max_engines))
    else:
        print("vllm-triage: replay needs a capture file or --prometheus URL --from WHEN", file=sys.stderr)
        return 2
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

    snapshots: list[Snapshot] = []

    def on_each(snapshot: Snapshot) -> None:
        on_tick(snapshot)
        if args.html:
            snapshots.append(snapshot)

    final = replay(readings, config, on_each)
    if final is not None and not args.json:
        active = [v.condition for v in final.verdicts if v.active]
        span = readings[-1].timestamp - start
        print(f"replayed {len(readings)} readings over {span:.0f} s; active at the end: {', '.join(active) or 'none'}")
    if args.html:
        source = f"Prometheus {redact_url(args.prometheus)} {args.selector}".rstrip() if args.prometheus else str(args.capture)
        page = html_report.render(readings, snapshots, f"vllm-triage: {source}")
        Path(args.html).write_text(page, encoding="utf-8")
        print(f"wrote {args.html} ({len(page.encode()) / 1e3:.0f} kB)", file=sys.stderr)
    return 0


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices[command]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser: its usage, not the top level's
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "diagnose":  # --at is a time with --prometheus, an offset into a capture otherwise
        try:
            args.at = _time(args.at) if args.prometheus and args.at else (_offset(args.at) if args.at is not None else None)
        except argparse.ArgumentTypeError as error:
            parser.error(f"argument --at: {error}")
    try:
        config = _config(args)
    except ConfigError as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)
    text = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(text if config.log_format == "text" else StructuredLines(logfmt=config.log_format == "logfmt"))
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler])
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
        if args.command == "bundle":
            return _bundle(args)
        if args.command == "record":
            return _record(args, config)
        if args.command == "fleet":
            at = args.at or time.time()
            servers = asyncio.run(judge_fleet(args.prometheus, args.selector, at, args.seconds, config, args.step))
            print(fleet_json(servers) if args.json else format_fleet(servers, f"Prometheus {redact_url(args.prometheus)} {args.selector}").rstrip("\n"))
            return 0
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
    except (CaptureError, traces.TraceError, HistoryError, argparse.ArgumentTypeError) as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vllm-triage: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
