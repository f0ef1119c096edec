"""Settings as data: the sidecar's own options (Config's fields) and each source's (its catalog entry's options class)
in one table, OPTIONS. config_loader.py reads them from defaults < YAML file < VLLM_TRIAGE_* env < flags."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar
from urllib.parse import urlparse

from .catalog import CATALOG, SOURCE_NAMES
from .diagnosis.conditions import ConditionSettings
from .options import (
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


_Options = TypeVar("_Options")
SOURCE_OPTION_KINDS = tuple(e.options for e in CATALOG if e.options)
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
    scrape_interval_seconds: float = option(5.0, number(0.1), "How often to scrape vLLM's /metrics.", "S")
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
    tick_seconds: float = option(5.0, number(0.1), "How often conditions are evaluated and /metrics re-rendered.", "S")
    window_seconds: float = option(60.0, number(2.0), "Default window W for signals and conditions.", "S")
    max_num_seqs: int | None = option(
        None,
        optional(number(1, 2**20, integer=True)),
        "vLLM's --max-num-seqs; default: read from vLLM's command line when visible, else vLLM's default.",
        "N",
    )
    vllm_startup_seconds: float | None = option(
        None,
        optional(number(1.0)),
        "How long vLLM may load its model before its first answer without being unreachable (the chart passes its "
        "vllm.startupSeconds): the default of vllm_unreachable's startup_grace_seconds and startup_grace_no_process_seconds.",
        "S",
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
    source_options: dict[type[Any], Any] = field(default_factory=lambda: {kind: kind() for kind in SOURCE_OPTION_KINDS})

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
_OPTION_KIND.update({o.key: None for o in _declared(Config)} | {f.name: kind for kind in SOURCE_OPTION_KINDS for f in fields(kind)})
if len(OPTIONS_BY_KEY) != len(OPTIONS):
    raise RuntimeError(f"an option key is declared twice: {sorted(o.key for o in OPTIONS if sum(p.key == o.key for p in OPTIONS) > 1)}")
