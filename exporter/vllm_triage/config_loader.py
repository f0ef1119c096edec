"""Loading the settings: defaults < YAML file < VLLM_TRIAGE_* env < flags, every value checked by its option's parser;
the config file's JSON Schema (the chart's values.schema.json embeds it) and the command line's flags, from the same
table (config.OPTIONS).

A wrong value stops start-up with a ConfigError naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import yaml

from .config import OPTIONS, OPTIONS_BY_KEY, SOURCE_OPTION_KINDS, Config
from .diagnosis.conditions import CONDITIONS, CONDITIONS_BY_ID, ConditionSettings, default_settings
from .options import SCHEMAS, ConfigError, bad, boolean, number

CONDITION_KEYS = ("enabled", "for_seconds", "clear_for_seconds", "window_seconds")


def _condition_settings(raw: Any, options: Mapping[str, Any]) -> dict[str, ConditionSettings]:
    """Each condition's defaults (a threshold that follows an option takes its value where set), then its overrides."""
    window_seconds = options["window_seconds"]
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
        thresholds.update({t.name: options[t.option] for t in condition.thresholds if t.option is not None and options[t.option] is not None})
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
    sources = {kind: kind(**{f.name: values.pop(f.name) for f in fields(kind)}) for kind in SOURCE_OPTION_KINDS}
    return Config(**values, conditions=_condition_settings(file_conditions, values), source_options=sources)


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
