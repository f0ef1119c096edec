"""Every place derived from the sources' catalog covers every source: a source added to the catalog (docs/development.md,
Adding a source) is built, validated, kept fresh, exported with its help, queried from Prometheus' history and documented,
or this fails."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from vllm_triage.catalog import CATALOG, EXPORTED_PREFIX, SOURCE_NAMES, stale_after
from vllm_triage.config_loader import load
from vllm_triage.exposition import SnapshotCollector
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.history.prometheus import _LATEST_QUERY
from vllm_triage.model import ProcessTargets
from vllm_triage.registry import builder

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
DATA = Path(__file__).resolve().parents[1] / "data"


def test_every_source_is_named_built_at_its_own_cadence_and_kept_fresh_by_it():
    assert tuple(entry.name for entry in CATALOG) == SOURCE_NAMES
    for entry in CATALOG:
        config = load(env={"VLLM_TRIAGE_SOURCES": entry.name, f"VLLM_TRIAGE_{entry.interval_option.upper()}": "10"})
        assert config.sources == (entry.name,)
        loop = builder(entry.name)(config, time.time, ProcessTargets())
        asyncio.run(loop.close())
        assert (loop.name, loop.interval) == (entry.name, 10.0)  # its module builds it at the catalog's cadence
        assert stale_after(config)[entry.name] == 30.0  # three of its own intervals, not another source's
        assert stale_after(load(env={"VLLM_TRIAGE_STALE_AFTER_SECONDS": "7"}))[entry.name] == 7.0


@pytest.mark.parametrize("capture", [demo_capture_path(), *sorted(DATA.glob("real-vllm-h*.jsonl.gz"))], ids=lambda p: p.name)
def test_every_family_a_source_exports_as_read_has_its_help_and_its_history(capture: Path):
    """On the real captures: each sample a source exports as read is documented, has its own help on /metrics (not its
    name repeated), and is in the query that rebuilds it from Prometheus' history."""
    latest = {entry.name: entry for entry in CATALOG if entry.exports_latest}
    seen: dict[str, set[str]] = {}
    for reading in read_readings(capture):
        if reading.source in latest and reading.ok:
            seen.setdefault(reading.source, set()).update(name for name, _ in reading.samples)
    assert seen, "the capture has no source exported as read"
    reference = REFERENCE.read_text()
    for source, names in seen.items():
        entry = latest[source]
        for name in sorted(names):
            assert name in entry.latest_help, f"{source} exports {name} with no help in the catalog"
            assert f"`{EXPORTED_PREFIX}{name}`" in reference, name
            assert re.fullmatch(_LATEST_QUERY, f"{EXPORTED_PREFIX}{name}"), name
            (family,) = SnapshotCollector._latest({(name, ()): 1.0})
            assert family.documentation == entry.latest_help[name]


def test_every_windowed_signal_is_documented_under_its_exported_name():
    reference = REFERENCE.read_text()
    for entry in CATALOG:
        for signal in entry.signals:
            assert f"| `{signal.id}` | `{EXPORTED_PREFIX}{entry.exported_as}{signal.family}` |" in reference, signal.id
