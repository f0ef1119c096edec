"""Settings: one table of options, read from defaults < YAML file < VLLM_TRIAGE_* env < flags.

A wrong value stops start-up with a ConfigError naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import urlparse

import yaml

from .catalog import CATALOG, SOURCE_NAMES
from .diagnosis.conditions import CONDITIONS, CONDITIONS_BY_ID, ConditionSettings, default_settings
from .options import (
    SCHEMAS,
    ConfigError,
    Option,
    bad,
    base_url,
    boolean,
    choice,
    described,
    listen_address,
    number,
    option,
    optional,
    path_component,
    redact_url,
    split_items,
    text,
)

# A real vLLM 0.32.0 page has ~320 `vllm:` series per engine; wide expert-parallel deployments run
# 64-128 data-parallel engines behind one API server. Past these limits a label is exploding
# (or this is not a plain vLLM): judging every engine would cost seconds per tick and export an
# unbounded number of series, so the page is refused, as Prometheus refuses a scrape over sample_limit.
DEFAULT_MAX_SERIES = 15_000
DEFAULT_MAX_ENGINES = 32
# A label value longer than this is refused on vLLM's page (as Prometheus' label_value_length_limit).
DEFAULT_MAX_LABEL_VALUE_LENGTH = 1024


DEFAULT_PORT = 10290
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "logfmt", "json")


_SOURCE_NAMES = list(SOURCE_NAMES)


@described({"anyOf": [{"type": "array", "items": {"enum": _SOURCE_NAMES}, "minItems": 1}, {"type": "string", "minLength": 1}]})
def _source_list(key: str, raw: Any) -> tuple[str, ...]:
    items = split_items(raw)
    if not items or any(item not in _SOURCE_NAMES for item in items):
        raise bad(key, raw, f"expected a comma-separated subset of {', '.join(_SOURCE_NAMES)}")
    return tuple(dict.fromkeys(items))


CONDITION_KEYS = ("enabled", "for_seconds", "clear_for_seconds", "window_seconds")


_Options = TypeVar("_Options")
_SOURCE_OPTION_KINDS = tuple(e.options for e in CATALOG if e.options)
# where each option is declared: None for the config's own, else its source's options class (filled below the table)
_OPTION_KIND: dict[str, type[Any] | None] = {}


@dataclass(frozen=True)
class Config:
    """Every setting, typed: the fields are the options table (a YAML key, a VLLM_TRIAGE_* variable and a
    flag each), plus the per-condition settings."""

    vllm_url: str = option("http://127.0.0.1:8000", base_url, "Base URL of the vLLM server to watch (one ending in /metrics is taken without it).", "URL")
    metrics_path: str = option("/metrics", path_component, "Path of vLLM's Prometheus endpoint.", "PATH")
    listen: str = option(f"0.0.0.0:{DEFAULT_PORT}", listen_address, f"Address the sidecar serves on (default port {DEFAULT_PORT}).", "HOST:PORT")
    max_connections: int = option(128, number(1, integer=True), "Most connections the sidecar's listener holds at once; more get HTTP 503.", "N")
    http_header_timeout_seconds: float = option(
        15.0,
        number(0.5),
        "Close a connection whose request headers are not complete after this long (also the keep-alive idle time).",
        "S",
    )
    web_config_file: str | None = option(
        None, optional(text), "Web-config file in the exporter-toolkit format: TLS and basic auth on the listener (read at start).", "FILE"
    )
    scrape_interval_seconds: float = option(2.0, number(0.1), "How often to scrape vLLM's /metrics.", "S")
    scrape_timeout_seconds: float = option(5.0, number(0.1), "Give up on a vLLM scrape after this long.", "S")
    connect_timeout_seconds: float = option(2.0, number(0.1), "Give up connecting to vLLM after this long.", "S")
    max_page_bytes: int = option(10 * 1024 * 1024, number(1024, integer=True), "Refuse /metrics pages larger than this.", "BYTES")
    max_series: int = option(DEFAULT_MAX_SERIES, number(100, integer=True), "Refuse /metrics pages with more vllm: series than this (~320 per engine).", "N")
    max_engines: int = option(DEFAULT_MAX_ENGINES, number(1, integer=True), "Refuse /metrics pages with more engine/model label combinations than this.", "N")
    max_label_value_length: int = option(
        DEFAULT_MAX_LABEL_VALUE_LENGTH,
        number(16, integer=True),
        "Refuse vLLM series with a label value longer than this (as Prometheus' label_value_length_limit).",
        "CHARS",
    )
    stale_after_seconds: float | None = option(
        None,
        optional(number(0.0)),
        "How long a failing source's last readings still count as evidence (verdicts ride through a slow scrape); "
        "longer outages make dependent conditions unknown. Default: 3 collection intervals, at least 15 s.",
        "S",
    )
    tick_seconds: float = option(2.0, number(0.1), "How often conditions are evaluated and /metrics re-rendered.", "S")
    window_seconds: float = option(60.0, number(2.0), "Default window W for signals and conditions.", "S")
    max_num_seqs: int | None = option(
        None,
        optional(number(1, 2**20, integer=True)),
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
    bundle_dir: str | None = option(
        None,
        optional(text),
        "Where a critical verdict writes its incident bundle (the window's capture, the verdict trail, the stack dumps, vLLM's "
        "processes, GPUs and flags; at most 5 MiB, one per verdict per 10 minutes, the newest 10 kept); unset: none.",
        "DIR",
    )
    envelope_file: str | None = option(
        None,
        optional(text),
        "Where vLLM's performance envelope per configuration is kept across the sidecar's restarts (regression_after_change "
        "compares after a change with before it, at the same load); put it on a volume that outlives the pod. Unset: in "
        "memory only, and a change made by a rollout that restarts the sidecar too is not seen.",
        "FILE",
    )
    engine_liveness_endpoint: bool = option(
        False,
        boolean,
        "Serve /engine-liveness: 503 while engine_wedged is active, else 200; for a liveness probe on vLLM's container (off: 404).",
        "BOOL",
    )
    demo: bool = option(False, boolean, "Replay the bundled capture in a loop instead of scraping vLLM.", "BOOL")
    demo_capture: str | None = option(None, optional(text), "Capture file for --demo (default: the bundled one).", "FILE")
    demo_speed: float = option(
        1.0,
        number(0.1, 100.0),
        "--demo replays this many times faster than the capture was recorded; the sidecar's clock runs as fast (windows, "
        "`for` durations and the timestamps it exports are in capture time).",
        "X",
    )
    log_level: str = option("info", choice(*LOG_LEVELS), "Log level.", "LEVEL")
    log_format: str = option(
        "text", choice(*LOG_FORMATS), "Log lines as text, logfmt (key=value) or json (one object per line): time, level, logger, msg. Read at start.", "FORMAT"
    )
    conditions: dict[str, ConditionSettings] = field(default_factory=dict)
    # each source's own options (its catalog entry's `options`), by their class
    source_options: dict[type[Any], Any] = field(default_factory=lambda: {kind: kind() for kind in _SOURCE_OPTION_KINDS})

    def options(self, kind: type[_Options]) -> _Options:
        """A source's own options: `config.options(GilOptions).gil_rate`."""
        found: _Options = self.source_options[kind]
        return found

    def value(self, key: str) -> Any:
        """An option's value by its key, wherever it is declared (the config's own or a source's)."""
        kind = _OPTION_KIND[key]
        return getattr(self if kind is None else self.source_options[kind], key)

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


def _declared(kind: type[Any], source: str = "") -> tuple[Option, ...]:
    meta = [(f, f.metadata) for f in fields(kind) if "parse" in f.metadata]
    return tuple(Option(f.name, f.default, m["parse"], m["help"], m["metavar"], source) for f, m in meta)


# The options table: the config's own, then each source's in the catalog's order.
OPTIONS: tuple[Option, ...] = _declared(Config) + tuple(o for e in CATALOG if e.options for o in _declared(e.options, e.name))
OPTIONS_BY_KEY = {o.key: o for o in OPTIONS}
_OPTION_KIND.update({o.key: None for o in _declared(Config)} | {f.name: kind for kind in _SOURCE_OPTION_KINDS for f in fields(kind)})
if len(OPTIONS_BY_KEY) != len(OPTIONS):
    raise RuntimeError(f"an option key is declared twice: {sorted(o.key for o in OPTIONS if sum(p.key == o.key for p in OPTIONS) > 1)}")


def _condition_settings(raw: Any, window_seconds: float) -> dict[str, ConditionSettings]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise bad("conditions", raw, "expected a mapping of condition id to overrides")
    unknown = sorted(set(raw) - set(CONDITIONS_BY_ID))
    if unknown:
        raise bad(f"conditions.{unknown[0]}", unknown[0], f"expected a condition id: {', '.join(CONDITIONS_BY_ID)}")
    settings: dict[str, ConditionSettings] = {}
    for condition in CONDITIONS:
        base = default_settings(condition, window_seconds)
        overrides = raw.get(condition.id) or {}
        if not isinstance(overrides, Mapping):
            raise bad(f"conditions.{condition.id}", overrides, "expected a mapping of threshold or duration to value")
        thresholds = dict(base.thresholds)
        by_name = {t.name: t for t in condition.thresholds}
        values: dict[str, Any] = {}
        for key, value in overrides.items():
            path = f"conditions.{condition.id}.{key}"
            if key == "enabled":
                values[key] = boolean(path, value)
            elif key in ("for_seconds", "clear_for_seconds"):
                values[key] = number(0.0)(path, value)
            elif key == "window_seconds":
                values[key] = number(2.0)(path, value)
            elif key in by_name:
                t = by_name[key]
                thresholds[key] = number(t.minimum, t.maximum)(path, value)
            else:
                allowed = ", ".join([*CONDITION_KEYS, *by_name])
                raise bad(path, key, f"expected one of: {allowed}")
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
    properties: dict[str, Any] = {o.key: {**SCHEMAS[o.parse], "description": o.help} for o in OPTIONS}
    conditions: dict[str, Any] = {}
    for condition in CONDITIONS:
        keys: dict[str, Any] = {
            "enabled": SCHEMAS[boolean],
            "for_seconds": SCHEMAS[number(0.0)],
            "clear_for_seconds": SCHEMAS[number(0.0)],
            "window_seconds": SCHEMAS[number(2.0)],
        }
        for t in condition.thresholds:
            keys[t.name] = {**SCHEMAS[number(t.minimum, t.maximum)], "description": t.description}
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
                raise bad(str(key), key, f"unknown key; expected one of: {', '.join([*OPTIONS_BY_KEY, 'conditions'])}")
    for declared in OPTIONS:
        if declared.env in env:
            raw[declared.key] = env[declared.env]
    for key, value in (flags or {}).items():
        if value is not None and key in OPTIONS_BY_KEY:
            raw[key] = value
    values = {}
    for declared in OPTIONS:
        values[declared.key] = declared.parse(declared.key, raw[declared.key]) if declared.key in raw else declared.default
    # a source's options check themselves together (e.g. gpu_source: dcgm needs dcgm_url)
    sources = {kind: kind(**{f.name: values.pop(f.name) for f in fields(kind)}) for kind in _SOURCE_OPTION_KINDS}
    return Config(**values, conditions=_condition_settings(file_conditions, values["window_seconds"]), source_options=sources)


def _shown(default: object) -> str:
    """A default as one would write it in the flag or the env variable (a list comma-separated, not a Python tuple)."""
    if isinstance(default, (tuple, list)):
        return ",".join(str(item) for item in default)
    if isinstance(default, bool):
        return str(default).lower()
    return "unset" if default is None else str(default)


def add_flags(parser: argparse.ArgumentParser, keys: tuple[str, ...] | None = None) -> None:
    """One flag per option, documented with its env variable and default."""
    for declared in OPTIONS:
        if keys is not None and declared.key not in keys:
            continue
        shown = f"{declared.help} [env {declared.env}; default {_shown(declared.default)}]"
        if declared.parse is boolean:
            parser.add_argument(declared.flag, dest=declared.key, default=None, action=argparse.BooleanOptionalAction, help=shown)
        else:
            parser.add_argument(declared.flag, dest=declared.key, default=None, metavar=declared.metavar or None, help=shown)
