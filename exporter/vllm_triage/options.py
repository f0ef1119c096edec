"""Options as data: an option is a field with its default, its parser (which names a wrong value and what is
allowed) and its help; a parser's JSON Schema is kept beside it. The config's own options and each source's (in its
catalog entry) are declared with `option`; config.py assembles them into one table and loads it."""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

ENV_PREFIX = "VLLM_TRIAGE_"


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


# A key or flag whose name says its value is a secret (--api-key, hf_token, "password": ...).
SECRET_NAME = re.compile(
    r"(?:api|access|private|secret|auth)[_-]?key|secret|passw(?:or)?d|credential|signature|authori[sz]ation|(?<![a-z])auth(?![a-z])|token(?![a-z])", re.I
)
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"',]+")
_BEARER = re.compile(r"\b(bearer|basic)\s+[\w.~+/=-]+", re.I)
_SECRET_PAIR = re.compile(r"(?P<name>[\w.-]+)(?P<sep>[=:]\s*)(?P<value>[^\s&,;\"'}]+)")


def redact_value(text: str) -> str:
    """A value from the monitored host (a flag's value, a model path) as it may be shown or kept: URLs without their
    user:password@ and query values (signed URLs), JSON without the values of keys that name secrets, name=secret pairs
    hidden. Each outlet and file gets values through this: /diagnosis, the report, bundles, the envelope file."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            parsed = json.loads(stripped)
            redacted = _redact_json(parsed)
            return text if redacted == parsed else json.dumps(redacted, separators=(",", ":"))
        except (ValueError, RecursionError):
            pass
    unurled = _BEARER.sub(lambda m: f"{m[1]} ***", _URL.sub(lambda m: redact_url(m.group(0)), text))
    return _SECRET_PAIR.sub(lambda m: f"{m['name']}{m['sep']}***" if SECRET_NAME.search(m["name"]) else m.group(0), unurled)


def _redact_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "***" if isinstance(k, str) and SECRET_NAME.search(k) and not isinstance(v, (dict, list)) else _redact_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json(v) for v in value]
    return redact_value(value) if isinstance(value, str) else value


class ConfigError(ValueError):
    pass


def bad(key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"config key '{key}': {value!r} is not allowed; {allowed}")


Parse = Callable[[str, Any], Any]
# each parser's JSON Schema (values.schema.json refuses what it refuses); weak: parsers made per call go with it
SCHEMAS: weakref.WeakKeyDictionary[Parse, dict[str, Any]] = weakref.WeakKeyDictionary()


def described(schema: dict[str, Any]) -> Callable[[Parse], Parse]:
    def register(parse: Parse) -> Parse:
        SCHEMAS[parse] = schema
        return parse

    return register


def number(minimum: float, maximum: float | None = None, integer: bool = False) -> Callable[[str, Any], Any]:
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
            raise bad(key, raw, f"expected {kind} {span}") from None
        if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):
            raise bad(key, raw, f"expected {kind} {span}")
        return value

    bounds = {"minimum": minimum, **({"maximum": maximum} if maximum is not None else {})}
    return described({"type": "integer" if integer else "number", **bounds})(parse)


def optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def wrapped(key: str, raw: Any) -> Any:
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "none", "auto")):
            return None
        return parse(key, raw)

    return described({"anyOf": [SCHEMAS[parse], {"type": "null"}, {"enum": ["", "none", "auto"]}]})(wrapped)


@described({"type": "boolean"})
def boolean(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise bad(key, raw, "expected true or false")


@described({"type": "string", "pattern": "^https?://[^/]"})
def http_url(key: str, raw: Any) -> str:
    allowed = "expected an http:// or https:// URL such as http://127.0.0.1:8000"
    try:
        parsed = urlparse(str(raw))
        parsed.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError as error:
        raise bad(key, redact_url(str(raw)), f"{allowed} ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise bad(key, redact_url(str(raw)), allowed)
    return str(raw).rstrip("/")


@described({"type": "string", "pattern": "^https?://[^/]"})
def base_url(key: str, raw: Any) -> str:
    """A server's base URL; one given with its page's path (`http://vllm:8000/metrics`, as Prometheus' targets are
    often written) is taken without it, instead of fetching /metrics/metrics."""
    url = urlparse(http_url(key, raw))
    return url._replace(path=url.path.removesuffix("/metrics")).geturl()


@described({"type": "string", "pattern": "^/"})
def path_component(key: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw.startswith("/"):
        raise bad(key, raw, "expected a path starting with '/'")
    return raw


@described({"type": "string", "pattern": ":[0-9]{1,5}$"})
def listen_address(key: str, raw: Any) -> str:
    host, sep, port = str(raw).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(key, raw, "expected HOST:PORT such as 0.0.0.0:10290 (or :10290 for every interface)")
    return f"{host or '0.0.0.0'}:{port}"


def choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, raw: Any) -> str:
        if str(raw).lower() not in choices:
            raise bad(key, raw, f"expected one of {', '.join(choices)}")
        return str(raw).lower()

    return described({"enum": list(choices)})(parse)


@described({"type": "string", "minLength": 1})
def text(key: str, raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise bad(key, raw, "expected a non-empty string")
    return raw


def split_items(raw: Any) -> list[str]:
    """A list from YAML, or a comma-separated string; anything else (a mapping, a number list's
    nested list) is no list of names: empty, which every caller refuses."""
    if isinstance(raw, (list, tuple)):
        if not all(isinstance(item, (str, int)) and not isinstance(item, bool) for item in raw):
            return []
        return [str(item).strip() for item in raw]
    if not isinstance(raw, (str, int)) or isinstance(raw, bool):
        return []
    return [item.strip() for item in str(raw).split(",") if item.strip()]


MAX_GPUS = 256  # a node holds 8-16; more is a wrong value (a config once listed 300,000)


@described(
    {
        "anyOf": [
            {"type": "array", "items": {"type": ["string", "integer"]}, "minItems": 1, "maxItems": MAX_GPUS},
            {"type": ["string", "integer"]},
        ]
    }
)
def gpu_list(key: str, raw: Any) -> tuple[str, ...]:
    items = tuple(split_items(raw))
    if not items or len(items) > MAX_GPUS or not all(re.fullmatch(r"[0-9]{1,4}|(GPU|MIG)-[0-9A-Za-z-]{1,96}", item) for item in items):
        shown = f"{len(items)} of them" if len(items) > MAX_GPUS else raw
        raise bad(key, shown, f"expected at most {MAX_GPUS} GPU indices or UUIDs, comma-separated (e.g. 0,1 or GPU-8f2c...)")
    return items


@dataclass(frozen=True)
class Option:
    key: str
    default: Any
    parse: Callable[[str, Any], Any]
    help: str
    metavar: str = ""
    source: str = ""  # the source that declares it; "" for the config's own

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


def option(default: Any, parse: Callable[[str, Any], Any], help: str, metavar: str = "") -> Any:
    """A field that is an option (of the Config, or of a source's options class): a default, its parser (which names a wrong value), its help."""
    return field(default=default, metadata={"parse": parse, "help": help, "metavar": metavar})
