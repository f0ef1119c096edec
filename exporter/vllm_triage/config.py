"""Settings: one table of options, read from defaults < YAML file < VLLM_TRIAGE_* env < flags.

A wrong value stops start-up with a ConfigError naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

import yaml

from .catalog import SOURCE_NAMES
from .diagnosis.conditions import CONDITIONS, CONDITIONS_BY_ID, ConditionSettings, default_settings

# A real vLLM 0.32.0 page has ~320 `vllm:` series per engine; wide expert-parallel deployments run
# 64-128 data-parallel engines behind one API server. Past these limits a label is exploding
# (or this is not a plain vLLM): judging every engine would cost seconds per tick and export an
# unbounded number of series, so the page is refused, as Prometheus refuses a scrape over sample_limit.
DEFAULT_MAX_SERIES = 15_000
DEFAULT_MAX_ENGINES = 32
# A label value longer than this is refused on vLLM's page (as Prometheus' label_value_length_limit).
DEFAULT_MAX_LABEL_VALUE_LENGTH = 1024


def redact_url(url: str) -> str:
    """The URL as it may be shown (logs, /diagnosis, reports): user:password@ and query values hidden."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid URL>"
    netloc = ("***@" if parts.username or parts.password else "") + (f"[{host}]" if ":" in host else host) + port
    query = "&".join(f"{pair.partition('=')[0]}=***" for pair in parts.query.split("&") if pair) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


DEFAULT_PORT = 10290
ENV_PREFIX = "VLLM_TRIAGE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "logfmt", "json")


class ConfigError(ValueError):
    pass


def _bad(key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"config key '{key}': {value!r} is not allowed; {allowed}")


Parse = Callable[[str, Any], Any]
# each parser's JSON Schema (values.schema.json refuses what it refuses); weak: parsers made per call go with it
_SCHEMAS: weakref.WeakKeyDictionary[Parse, dict[str, Any]] = weakref.WeakKeyDictionary()


def _described(schema: dict[str, Any]) -> Callable[[Parse], Parse]:
    def register(parse: Parse) -> Parse:
        _SCHEMAS[parse] = schema
        return parse

    return register


def _number(minimum: float, maximum: float | None = None, integer: bool = False) -> Callable[[str, Any], Any]:
    kind = "an integer" if integer else "a number"
    span = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")

    def parse(key: str, raw: Any) -> Any:
        try:
            if isinstance(raw, bool):
                raise ValueError
            value: float | int = int(raw) if integer else float(raw)
            if integer and isinstance(raw, float) and raw != int(raw):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise _bad(key, raw, f"expected {kind} {span}") from None
        if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):
            raise _bad(key, raw, f"expected {kind} {span}")
        return value

    bounds = {"minimum": minimum, **({"maximum": maximum} if maximum is not None else {})}
    return _described({"type": "integer" if integer else "number", **bounds})(parse)


def _optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def wrapped(key: str, raw: Any) -> Any:
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "auto")):
            return None
        return parse(key, raw)

    return _described({"anyOf": [_SCHEMAS[parse], {"type": "null"}, {"enum": ["", "none", "auto"]}]})(wrapped)


@_described({"type": "boolean"})
def _boolean(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise _bad(key, raw, "expected true or false")


@_described({"type": "string", "pattern": "^https?://[^/]"})
def _url(key: str, raw: Any) -> str:
    allowed = "expected an http:// or https:// URL such as http://127.0.0.1:8000"
    try:
        parsed = urlparse(str(raw))
        parsed.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError as error:
        raise _bad(key, redact_url(str(raw)), f"{allowed} ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise _bad(key, redact_url(str(raw)), allowed)
    return str(raw).rstrip("/")


@_described({"type": "string", "pattern": "^https?://[^/]"})
def _base_url(key: str, raw: Any) -> str:
    """A server's base URL; one given with its page's path (`http://vllm:8000/metrics`, as Prometheus' targets are
    often written) is taken without it, instead of fetching /metrics/metrics."""
    url = urlparse(_url(key, raw))
    return url._replace(path=url.path.removesuffix("/metrics")).geturl()


@_described({"type": "string", "pattern": "^/"})
def _path_component(key: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw.startswith("/"):
        raise _bad(key, raw, "expected a path starting with '/'")
    return raw


@_described({"type": "string", "pattern": ":[0-9]{1,5}$"})
def _listen(key: str, raw: Any) -> str:
    host, sep, port = str(raw).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(key, raw, "expected HOST:PORT such as 0.0.0.0:10290 (or :10290 for every interface)")
    return f"{host or '0.0.0.0'}:{port}"


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, raw: Any) -> str:
        if str(raw).lower() not in choices:
            raise _bad(key, raw, f"expected one of {', '.join(choices)}")
        return str(raw).lower()

    return _described({"enum": list(choices)})(parse)


@_described({"type": "string", "minLength": 1})
def _text(key: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise _bad(key, raw, "expected a non-empty string")
    return raw


def _items(raw: Any) -> list[str]:
    """A list from YAML, or a comma-separated string; anything else (a mapping, a number list's
    nested list) is no list of names: empty, which every caller refuses."""
    if isinstance(raw, (list, tuple)):
        if not all(isinstance(item, (str, int)) and not isinstance(item, bool) for item in raw):
            return []
        return [str(item).strip() for item in raw]
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        return []
    return [item.strip() for item in str(raw).split(",") if item.strip()]


_SOURCE_NAMES = list(SOURCE_NAMES)


@_described({"anyOf": [{"type": "array", "items": {"enum": _SOURCE_NAMES}, "minItems": 1}, {"type": "string", "minLength": 1}]})
def _source_list(key: str, raw: Any) -> tuple[str, ...]:
    items = _items(raw)
    if not items or any(item not in _SOURCE_NAMES for item in items):
        raise _bad(key, raw, f"expected a comma-separated subset of {', '.join(_SOURCE_NAMES)}")
    return tuple(dict.fromkeys(items))


MAX_GPUS = 256  # a node holds 8-16; more is a wrong value (a config once listed 300,000)


@_described(
    {
        "anyOf": [
            {"type": "array", "items": {"type": ["string", "integer"]}, "minItems": 1, "maxItems": MAX_GPUS},
            {"type": ["string", "integer"]},
        ]
    }
)
def _gpu_list(key: str, raw: Any) -> tuple[str, ...]:
    items = tuple(_items(raw))
    if not items or len(items) > MAX_GPUS or not all(re.fullmatch(r"[0-9]{1,4}|(GPU|MIG)-[0-9A-Za-z-]{1,96}", item) for item in items):
        shown = f"{len(items)} of them" if len(items) > MAX_GPUS else raw
        raise _bad(key, shown, f"expected at most {MAX_GPUS} GPU indices or UUIDs, comma-separated (e.g. 0,1 or GPU-8f2c...)")
    return items


@dataclass(frozen=True)
class Option:
    key: str
    default: Any
    parse: Callable[[str, Any], Any]
    help: str
    metavar: str = ""

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


CONDITION_KEYS = ("enabled", "for_seconds", "clear_for_seconds", "window_seconds")


def option(default: Any, parse: Callable[[str, Any], Any], help: str, metavar: str = "") -> Any:
    """A Config field that is an option: a default, its parser (which names a wrong value), its help."""
    return field(default=default, metadata={"parse": parse, "help": help, "metavar": metavar})


@dataclass(frozen=True)
class Config:
    """Every setting, typed: the fields are the options table (a YAML key, a VLLM_TRIAGE_* variable and a
    flag each), plus the per-condition settings."""

    vllm_url: str = option("http://127.0.0.1:8000", _base_url, "Base URL of the vLLM server to watch (one ending in /metrics is taken without it).", "URL")
    metrics_path: str = option("/metrics", _path_component, "Path of vLLM's Prometheus endpoint.", "PATH")
    listen: str = option(f"0.0.0.0:{DEFAULT_PORT}", _listen, f"Address the sidecar serves on (default port {DEFAULT_PORT}).", "HOST:PORT")
    max_connections: int = option(128, _number(1, integer=True), "Most connections the sidecar's listener holds at once; more get HTTP 503.", "N")
    http_header_timeout_seconds: float = option(
        15.0,
        _number(0.5),
        "Close a connection whose request headers are not complete after this long (also the keep-alive idle time).",
        "S",
    )
    web_config_file: str | None = option(
        None, _optional(_text), "Web-config file in the exporter-toolkit format: TLS and basic auth on the listener (read at start).", "FILE"
    )
    scrape_interval_seconds: float = option(2.0, _number(0.1), "How often to scrape vLLM's /metrics.", "S")
    scrape_timeout_seconds: float = option(5.0, _number(0.1), "Give up on a vLLM scrape after this long.", "S")
    connect_timeout_seconds: float = option(2.0, _number(0.1), "Give up connecting to vLLM after this long.", "S")
    max_page_bytes: int = option(10 * 1024 * 1024, _number(1024, integer=True), "Refuse /metrics pages larger than this.", "BYTES")
    max_series: int = option(DEFAULT_MAX_SERIES, _number(100, integer=True), "Refuse /metrics pages with more vllm: series than this (~320 per engine).", "N")
    max_engines: int = option(DEFAULT_MAX_ENGINES, _number(1, integer=True), "Refuse /metrics pages with more engine/model label combinations than this.", "N")
    max_label_value_length: int = option(
        DEFAULT_MAX_LABEL_VALUE_LENGTH,
        _number(16, integer=True),
        "Refuse vLLM series with a label value longer than this (as Prometheus' label_value_length_limit).",
        "CHARS",
    )
    stale_after_seconds: float | None = option(
        None,
        _optional(_number(0.0)),
        "How long a failing source's last readings still count as evidence (verdicts ride through a slow scrape); "
        "longer outages make dependent conditions unknown. Default: 3 collection intervals, at least 15 s.",
        "S",
    )
    tick_seconds: float = option(2.0, _number(0.1), "How often conditions are evaluated and /metrics re-rendered.", "S")
    window_seconds: float = option(60.0, _number(2.0), "Default window W for signals and conditions.", "S")
    max_num_seqs: int | None = option(
        None,
        _optional(_number(1, 2**20, integer=True)),
        "vLLM's --max-num-seqs; default: read from vLLM's command line when visible, else vLLM's default.",
        "N",
    )
    sources: tuple[str, ...] = option(
        ("vllm", "process", "gpu", "gil"),
        _source_list,
        "Sources to run, comma-separated: vllm (its /metrics), process (psutil; needs a shared PID namespace), gpu (NVML/GPM), "
        "gil (py-spy; needs ptrace rights).",
        "LIST",
    )
    process_interval_seconds: float = option(2.0, _number(0.5), "How often to sample vLLM's processes' CPU (new processes are looked for every 30 s).", "S")
    gpu_interval_seconds: float = option(2.0, _number(0.1), "How often to read the GPUs (GPM covers each interval whole).", "S")
    gpus: tuple[str, ...] | None = option(None, _optional(_gpu_list), "GPUs to watch (indices or UUIDs); default: those vLLM's processes use.", "LIST")
    gpus_file: str | None = option(
        None,
        _optional(_text),
        "A file naming the GPUs vLLM's container was given (UUIDs or indices, one per line), written by that container; read until it appears.",
        "FILE",
    )
    gpu_source: str = option(
        "nvml",
        _choice("nvml", "dcgm"),
        "Where the GPU readings come from: nvml (the sidecar reads the GPUs itself) or dcgm (the node's dcgm-exporter, at dcgm_url).",
        "NAME",
    )
    dcgm_url: str | None = option(
        None,
        _optional(_text),
        "dcgm-exporter's /metrics (gpu_source: dcgm), e.g. http://$(NODE_IP):9400/metrics; its GPUs of this pod (POD_NAME, POD_NAMESPACE) are read.",
        "URL",
    )
    gpm: bool = option(True, _boolean, "Use GPM (SM activity, tensor, DRAM bandwidth) where the GPU supports it.", "BOOL")
    bundle_dir: str | None = option(
        None,
        _optional(_text),
        "Where a critical verdict writes its incident bundle (the window's capture, the verdict trail, the stack dumps, vLLM's "
        "processes, GPUs and flags; at most 5 MiB, one per verdict per 10 minutes, the newest 10 kept); unset: none.",
        "DIR",
    )
    envelope_file: str | None = option(
        None,
        _optional(_text),
        "Where vLLM's performance envelope per configuration is kept across the sidecar's restarts (regression_after_change "
        "compares after a change with before it, at the same load); put it on a volume that outlives the pod. Unset: in "
        "memory only, and a change made by a rollout that restarts the sidecar too is not seen.",
        "FILE",
    )
    # py-spy reads vLLM's memory without pausing it (nonblocking): a window cost a CPU-bound real engine nothing
    # measurable while open, where blocking cost it 2-7 % (README, bench/real_engine.py gil_window).
    gil_interval_seconds: float = option(120.0, _number(5.0), "How often to sample the GIL of the engine core and the API server with py-spy.", "S")
    gil_window_seconds: float = option(3.0, _number(0.5), "Length of each py-spy window (one process at a time).", "S")
    gil_rate: int = option(20, _number(1, 1000, integer=True), "py-spy samples per second.", "HZ")
    gil_nonblocking: bool = option(
        True,
        _boolean,
        "py-spy --nonblocking: vLLM is not paused (false: py-spy's blocking mode stops every thread for each sample, which costs "
        "vLLM throughput while a window is open; docs/measurements.md has the figures).",
        "BOOL",
    )
    engine_liveness_endpoint: bool = option(
        False,
        _boolean,
        "Serve /engine-liveness: 503 while engine_wedged is active, else 200; for a liveness probe on vLLM's container (off: 404).",
        "BOOL",
    )
    process_title_prefix: str = option("VLLM", _text, "vLLM's VLLM_PROCESS_NAME_PREFIX (process titles VLLM::EngineCore...).", "PREFIX")
    demo: bool = option(False, _boolean, "Replay the bundled capture in a loop instead of scraping vLLM.", "BOOL")
    demo_capture: str | None = option(None, _optional(_text), "Capture file for --demo (default: the bundled one).", "FILE")
    demo_speed: float = option(
        1.0,
        _number(0.1, 100.0),
        "--demo replays this many times faster than the capture was recorded; the sidecar's clock runs as fast (windows, "
        "`for` durations and the timestamps it exports are in capture time).",
        "X",
    )
    log_level: str = option("info", _choice(*LOG_LEVELS), "Log level.", "LEVEL")
    log_format: str = option(
        "text", _choice(*LOG_FORMATS), "Log lines as text, logfmt (key=value) or json (one object per line): time, level, logger, msg. Read at start.", "FORMAT"
    )
    conditions: dict[str, ConditionSettings] = field(default_factory=dict)

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def vllm_url_shown(self) -> str:
        """vllm_url as logs, reports and /diagnosis show it (credentials and query values hidden)."""
        return redact_url(self.vllm_url)

    @property
    def vllm_port(self) -> int | None:
        parsed = urlparse(self.vllm_url)
        return parsed.port or (443 if parsed.scheme == "https" else 80)


OPTIONS: tuple[Option, ...] = tuple(
    Option(f.name, f.default, f.metadata["parse"], f.metadata["help"], f.metadata["metavar"]) for f in fields(Config) if "parse" in f.metadata
)
OPTIONS_BY_KEY = {o.key: o for o in OPTIONS}


def _condition_settings(raw: Any, window_seconds: float) -> dict[str, ConditionSettings]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise _bad("conditions", raw, "expected a mapping of condition id to overrides")
    unknown = sorted(set(raw) - set(CONDITIONS_BY_ID))
    if unknown:
        raise _bad(f"conditions.{unknown[0]}", unknown[0], f"expected a condition id: {', '.join(CONDITIONS_BY_ID)}")
    settings: dict[str, ConditionSettings] = {}
    for condition in CONDITIONS:
        base = default_settings(condition, window_seconds)
        overrides = raw.get(condition.id) or {}
        if not isinstance(overrides, Mapping):
            raise _bad(f"conditions.{condition.id}", overrides, "expected a mapping of threshold or duration to value")
        thresholds = dict(base.thresholds)
        by_name = {t.name: t for t in condition.thresholds}
        values: dict[str, Any] = {}
        for key, value in overrides.items():
            path = f"conditions.{condition.id}.{key}"
            if key == "enabled":
                values[key] = _boolean(path, value)
            elif key in ("for_seconds", "clear_for_seconds"):
                values[key] = _number(0.0)(path, value)
            elif key == "window_seconds":
                values[key] = _number(2.0)(path, value)
            elif key in by_name:
                t = by_name[key]
                thresholds[key] = _number(t.minimum, t.maximum)(path, value)
            else:
                allowed = ", ".join([*CONDITION_KEYS, *by_name])
                raise _bad(path, key, f"expected one of: {allowed}")
        settings[condition.id] = ConditionSettings(
            enabled=values.get("enabled", True),
            for_seconds=values.get("for_seconds", base.for_seconds),
            clear_seconds=values.get("clear_for_seconds", base.clear_seconds),
            window_seconds=values.get("window_seconds", base.window_seconds),
            thresholds=thresholds,
        )
    return settings


def config_schema() -> dict[str, Any]:
    """JSON Schema of the config file: every option of the table, and `conditions` with each condition's
    durations and thresholds (embedded in the chart's values.schema.json, so `helm install` names a typo)."""
    properties: dict[str, Any] = {o.key: {**_SCHEMAS[o.parse], "description": o.help} for o in OPTIONS}
    conditions: dict[str, Any] = {}
    for condition in CONDITIONS:
        keys: dict[str, Any] = {
            "enabled": _SCHEMAS[_boolean],
            "for_seconds": _SCHEMAS[_number(0.0)],
            "clear_for_seconds": _SCHEMAS[_number(0.0)],
            "window_seconds": _SCHEMAS[_number(2.0)],
        }
        for t in condition.thresholds:
            keys[t.name] = {**_SCHEMAS[_number(t.minimum, t.maximum)], "description": t.description}
        conditions[condition.id] = {"type": ["object", "null"], "additionalProperties": False, "properties": keys}
    properties["conditions"] = {"type": ["object", "null"], "additionalProperties": False, "properties": conditions}
    return {"type": "object", "additionalProperties": False, "properties": properties}


MAX_YAML_BYTES = 1024 * 1024  # a config or web config is a few kB; a 22 MB one took the loop 11 s to parse


def read_yaml_mapping(file: str, what: str) -> Mapping[Any, Any]:
    """A YAML file whose top level is a mapping (an empty file is an empty one), or a ConfigError naming the file."""
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_YAML_BYTES + 1)
        if len(data) > MAX_YAML_BYTES:
            raise ConfigError(f"{what} {file} is over {MAX_YAML_BYTES // 1024} KiB: not a config a person wrote")
        document = yaml.safe_load(data.decode("utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {file}: {exc.strerror}") from None
    except RecursionError:
        raise ConfigError(f"{what} {file} nests too deeply to be a config") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {file} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {file} is not valid YAML: {exc}") from None
    if not isinstance(document, Mapping):
        raise ConfigError(f"{what} {file}: expected a mapping of keys to values at the top level")
    return document


def load(config_file: str | None = None, env: Mapping[str, str] | None = None, flags: Mapping[str, Any] | None = None) -> Config:
    """Merge the sources in order of precedence and validate every value."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    file_conditions: Any = None
    if config_file:
        for key, value in read_yaml_mapping(config_file, "config file").items():
            if key == "conditions":
                file_conditions = value
            elif key in OPTIONS_BY_KEY:
                raw[key] = value
            else:
                raise _bad(str(key), key, f"unknown key; expected one of: {', '.join([*OPTIONS_BY_KEY, 'conditions'])}")
    for option in OPTIONS:
        if option.env in env:
            raw[option.key] = env[option.env]
    for key, value in (flags or {}).items():
        if value is not None and key in OPTIONS_BY_KEY:
            raw[key] = value
    values = {}
    for option in OPTIONS:
        values[option.key] = option.parse(option.key, raw[option.key]) if option.key in raw else option.default
    if values["gpu_source"] == "dcgm" and not values["dcgm_url"]:
        raise _bad("dcgm_url", values["dcgm_url"], "gpu_source: dcgm needs dcgm-exporter's URL, e.g. http://10.0.0.5:9400/metrics")
    return Config(**values, conditions=_condition_settings(file_conditions, values["window_seconds"]))


def _shown(default: object) -> str:
    """A default as one would write it in the flag or the env variable (a list comma-separated, not a Python tuple)."""
    if isinstance(default, (tuple, list)):
        return ",".join(str(item) for item in default)
    if isinstance(default, bool):
        return str(default).lower()
    return "unset" if default is None else str(default)


def add_flags(parser: argparse.ArgumentParser, keys: tuple[str, ...] | None = None) -> None:
    """One flag per option, documented with its env variable and default."""
    for option in OPTIONS:
        if keys is not None and option.key not in keys:
            continue
        described = f"{option.help} [env {option.env}; default {_shown(option.default)}]"
        if option.parse is _boolean:
            parser.add_argument(option.flag, dest=option.key, default=None, action=argparse.BooleanOptionalAction, help=described)
        else:
            parser.add_argument(option.flag, dest=option.key, default=None, metavar=option.metavar or None, help=described)
