"""docs/development.md's recipe for a new source, followed on a copy of the package: a toy source is its module in
sources/, its signal table in signals/ and one catalog entry with its own options, and nothing else is edited. The
sidecar then takes it in everywhere a user meets a source: the `sources` setting and its stale-after default, its own
option (a YAML key, an environment variable and a flag, checked, in the chart's schema), the daemon's builder, the
judge's window, /metrics (its windowed signal and its last reading, each with its help), /diagnosis, the
Prometheus-history query and docs/reference.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "exporter" / "vllm_triage"

TOY_MODULE = '''"""A toy source: how deep its queue is, read from nowhere."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..catalog import ToyOptions
from ..model import Reading, make_labels
from . import Clock, SourceLoop, nothing_to_close

if TYPE_CHECKING:
    from ..config import Config
    from ..model import ProcessTargets


def build(config: Config, clock: Clock, _: ProcessTargets) -> SourceLoop:
    options = config.options(ToyOptions)

    async def collect() -> Reading:
        return Reading("toy", clock(), True, {("toy_queue_depth", make_labels({"role": "engine_core"})): options.toy_depth})

    return SourceLoop("toy", options.toy_interval_seconds, collect, nothing_to_close)
'''

TOY_SIGNALS = '''"""The toy source's signals."""

from __future__ import annotations

from ..scope import role_scope
from .window import SignalContext, SignalDef, mean_of


def _depth(ctx: SignalContext) -> float | None:
    points = ctx.view.gauge_points("toy_queue_depth", role_scope("engine_core"))
    return mean_of(points) if points else None


TOY_SIGNALS: tuple[SignalDef, ...] = (
    SignalDef("host_toy_queue_depth_mean", "queue_depth_mean", "The toy queue's mean depth over the window.", _depth, (("role", "engine_core"),)),
)
'''

TOY_OPTIONS = """

@dataclass(frozen=True)
class ToyOptions:
    toy_interval_seconds: float = option(5.0, number(1.0), "How often to read the toy queue.", "S")
    toy_depth: float = option(3.0, number(0.0, 100.0), "How deep the toy queue reads.", "N")

"""
TOY_ENTRY = (
    '    SourceEntry("toy", TOY_SIGNALS, "host", "toy_window_", "toy_interval_seconds", "Toy signals", '
    'latest_help={"toy_queue_depth": "How deep the toy queue is."}, options=ToyOptions),\n'
)

# Run in the copy: everything a user meets, read back as the sidecar serves it.
CHECK = r"""
import argparse, asyncio, json, re, time
from vllm_triage import catalog
from vllm_triage.config_loader import add_flags, config_schema
from vllm_triage.config_loader import load
from vllm_triage.options import ConfigError
from vllm_triage.exposition import Exposition
from vllm_triage.model import ProcessTargets
from vllm_triage.pipeline import Pipeline
from vllm_triage.registry import build_sources
from vllm_triage.history.prometheus import _LATEST_QUERY
from mixin.generate import reference_markdown

config = load(env={"VLLM_TRIAGE_SOURCES": "vllm,toy", "VLLM_TRIAGE_TOY_INTERVAL_SECONDS": "10"}, flags={"toy_depth": "7"})
def refusal(**env):
    try:
        load(env=env)
        return ""
    except ConfigError as error:
        return str(error)
refused = refusal(VLLM_TRIAGE_SOURCES="vllm,toys")
parser = argparse.ArgumentParser()
add_flags(parser)
(loop,) = [l for l in build_sources(config, time.time, ProcessTargets()) if l.name == "toy"]
clock = [1000.0]
toy = [l for l in build_sources(config, lambda: clock[0], ProcessTargets()) if l.name == "toy"][0]
pipeline = Pipeline(config)
for step in range(16):
    clock[0] = 1000.0 + 2 * step
    pipeline.feed(asyncio.run(toy.collect()))
snapshot = pipeline.evaluate(clock[0])
exposition = Exposition(config.conditions, config.tick_seconds)
exposition.update(snapshot)
metrics = exposition.render(False).decode()
print(json.dumps({
    "sources": list(config.sources),
    "refused": refused,
    "stale_after": catalog.stale_after(config)["toy"],
    "default_interval": load().value("toy_interval_seconds"),
    "depth_refused": refusal(VLLM_TRIAGE_TOY_DEPTH="deep"),
    "flag": "--toy-depth" in parser.format_help(),
    "schema": config_schema()["properties"].get("toy_depth"),
    "interval": loop.interval,
    "diagnosis": snapshot.to_json()["signals"]["host"].get("host_toy_queue_depth_mean"),
    "metrics": [line for line in metrics.splitlines() if "toy" in line],
    "history": bool(re.fullmatch(_LATEST_QUERY, "vllm_triage_toy_queue_depth")),
    "reference": [line for line in reference_markdown().splitlines() if "toy" in line.lower()],
}))
"""


def test_a_toy_source_added_by_the_guides_three_files_is_served_everywhere(tmp_path: Path):
    copy = tmp_path / "vllm_triage"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "sources" / "toy.py").write_text(TOY_MODULE)
    (copy / "signals" / "toy.py").write_text(TOY_SIGNALS)
    catalog = copy / "catalog.py"
    text = catalog.read_text()
    imports, table, table_end = "from .signals.window import SignalDef\n", "\nCATALOG: tuple[SourceEntry, ...] = (", ")\nSOURCE_NAMES = "
    assert imports in text and table in text and table_end in text, "the catalog's layout changed: update this test with the guide"
    text = (
        text.replace(imports, imports + "from .signals.toy import TOY_SIGNALS\n").replace(table, TOY_OPTIONS + table).replace(table_end, TOY_ENTRY + table_end)
    )
    catalog.write_text(text)
    originals = {p: PACKAGE / p.relative_to(copy) for p in copy.rglob("*.py")}
    changed = sorted(str(p.relative_to(tmp_path)) for p, original in originals.items() if not original.exists() or original.read_bytes() != p.read_bytes())
    assert changed == ["vllm_triage/catalog.py", "vllm_triage/signals/toy.py", "vllm_triage/sources/toy.py"]

    # The copy first on the path (the working directory), the repository's mixin after it.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])

    assert seen["sources"] == ["vllm", "toy"]
    assert "toys" in seen["refused"] and "toy" in seen["refused"]  # a misspelt source is named, and the choices with it
    assert seen["stale_after"] == 30.0 and seen["interval"] == 10.0  # three of its own intervals
    assert seen["default_interval"] == 5.0
    # its own option: a wrong value is named with what is allowed; a flag; in the chart's schema
    assert "toy_depth" in seen["depth_refused"] and "'deep'" in seen["depth_refused"] and "<= 100.0" in seen["depth_refused"]
    assert seen["flag"] and seen["schema"]["maximum"] == 100.0 and seen["schema"]["description"] == "How deep the toy queue reads."
    assert seen["diagnosis"] == 7.0  # the depth its option set, read by its builder
    metrics = "\n".join(seen["metrics"])
    assert "# HELP vllm_triage_toy_window_queue_depth_mean The toy queue's mean depth over the window." in metrics
    assert 'vllm_triage_toy_window_queue_depth_mean{role="engine_core"} 7.0' in metrics
    assert "# HELP vllm_triage_toy_queue_depth How deep the toy queue is." in metrics
    assert 'vllm_triage_toy_queue_depth{role="engine_core"} 7.0' in metrics
    assert 'vllm_triage_source_up{source="toy"} 1.0' in metrics
    assert seen["history"]
    reference = "\n".join(seen["reference"])
    assert "### The toy source's own options" in reference and "`VLLM_TRIAGE_TOY_DEPTH`" in reference
    assert "## Toy signals" in reference and "`vllm_triage_toy_window_queue_depth_mean`" in reference and "`vllm_triage_toy_queue_depth`" in reference
