"""The incident bundle (bundle.py): what a critical verdict leaves behind for after the restart, bounded."""

from __future__ import annotations

import gzip
import json
from hashlib import sha256
from pathlib import Path

import pytest
from vllm_triage import bundle
from vllm_triage.config_loader import load
from vllm_triage.history.capture import read_readings
from vllm_triage.model import Reading, make_labels
from vllm_triage.pipeline import Pipeline, replay

DATA = Path(__file__).resolve().parents[1] / "data"


def test_a_hung_kernel_s_bundle_replays_to_the_same_verdict_and_holds_no_credentials(tmp_path):
    """Written at the tick engine_wedged rose on the H200's hung kernel capture: its capture replays to engine_wedged
    again, and the scraped URL's password is nowhere in it."""
    readings = list(read_readings(DATA / "real-vllm-h200-hung_kernel.jsonl.gz"))
    config = load(env={})
    pipeline = Pipeline(config, readings)
    trail: list = []
    written: list[Path] = []

    def on_tick(snapshot) -> None:
        trail.append(snapshot)
        if not written and next(v for v in snapshot.verdicts if v.condition == "engine_wedged").active:
            written.append(bundle.write_bundle(tmp_path, "engine_wedged", snapshot, trail, pipeline.store.readings(), "http://ops:s3cret@vllm:8000"))

    pipeline.replay(readings, on_tick)
    folder = written[0]
    assert sorted(p.name for p in folder.iterdir()) == [
        bundle.MARKER,
        "README.txt",
        "capture.jsonl.gz",
        "diagnosis.json",
        "load.json",
        "stacks.json",
        "verdicts.json",
    ]
    assert sum(p.stat().st_size for p in folder.iterdir()) <= bundle.MAX_BUNDLE_BYTES
    assert '"primary": "engine_wedged"' in (folder / "diagnosis.json").read_text()
    again: list = []
    replay(list(read_readings(folder / "capture.jsonl.gz")), config, again.append)
    assert next(v for v in again[-1].verdicts if v.condition == "engine_wedged").active
    assert not [p for p in folder.iterdir() if b"s3cret" in (gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())]


def test_a_bundle_keeps_the_newest_readings_within_its_bound_and_the_newest_bundles(tmp_path, monkeypatch):
    """A window too large for the bound keeps its newest readings; past KEEP_BUNDLES the oldest bundles go."""
    monkeypatch.setattr(bundle, "MAX_BUNDLE_BYTES", 200_000)
    monkeypatch.setattr(bundle, "KEEP_BUNDLES", 3)
    snapshot = Pipeline(load(env={})).evaluate(1_000.0)
    noisy = [  # label values that do not compress: 400 series a reading, 60 readings
        Reading(
            "vllm",
            1_000.0 + t,
            True,
            {("vllm:num_requests_running", make_labels({"n": sha256(f"{t}-{i}".encode()).hexdigest()})): float(i) for i in range(400)},
        )
        for t in range(60)
    ]
    folder = bundle.write_bundle(tmp_path, "vllm_unreachable", snapshot, [], noisy, "http://vllm:8000")
    kept = list(read_readings(folder / "capture.jsonl.gz"))
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 200_000
    assert 0 < len(kept) < len(noisy) and kept[-1].timestamp == noisy[-1].timestamp  # the newest stay
    for moment in range(4):
        bundle.write_bundle(tmp_path, "engine_wedged", Pipeline(load(env={})).evaluate(2_000.0 + moment), [], noisy[-2:], "http://vllm:8000")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 3 and all("engine_wedged" in n for n in names)  # the oldest three went, the first one with them


def test_a_killed_vllm_s_bundle_holds_its_failed_scrapes_and_the_load_it_was_under(tmp_path):
    """Written when vllm_unreachable rose on the H200's killed capture (16 clients, then every vLLM process SIGKILLed):
    the scrapes that failed after the kill are in its capture, so a replay of it reaches vllm_unreachable again, and
    load.json says what vLLM served before: about 16 requests running, none waiting, their prompt and output lengths."""
    readings = list(read_readings(DATA / "real-vllm-h200-killed.jsonl.gz"))
    config = load(env={})
    pipeline = Pipeline(config, readings)
    written: list[Path] = []

    def on_tick(snapshot) -> None:
        if not written and next(v for v in snapshot.verdicts if v.condition == "vllm_unreachable").active:
            written.append(bundle.write_bundle(tmp_path, "vllm_unreachable", snapshot, [], pipeline.store.readings(), "http://vllm:8000"))

    pipeline.replay(readings, on_tick)
    folder = written[0]
    kept = list(read_readings(folder / "capture.jsonl.gz"))
    assert [r for r in kept if r.source == "vllm" and not r.ok], "the failed scrapes after the kill"
    again: list = []
    replay(kept, config, again.append)
    assert next(v for v in again[-1].verdicts if v.condition == "vllm_unreachable").active
    shape = json.loads((folder / "load.json").read_text())
    (engine,) = shape["engines"].values()
    assert 12 <= engine["requests_running"]["max"] <= 16 and engine["requests_waiting"]["max"] == 0, engine
    assert engine["requests_finishing_per_second"] > 0 and engine["requests_arriving_per_second"] > 0
    assert engine["prompt_tokens"]["requests"] == sum(engine["prompt_tokens"]["buckets"].values()) > 0
    assert 0 < engine["prompt_tokens"]["p50"] <= engine["prompt_tokens"]["p95"] and engine["output_tokens"]["mean"] > 0


def test_pruning_touches_only_the_sidecars_own_bundles_and_never_the_one_just_written(tmp_path, monkeypatch):
    """A shared volume (bundles.volume takes any) holds other folders and files: they stay whatever their names. A bundle
    whose name sorts before the others (a clock set back) is still kept as the newest written. A write killed with the
    sidecar leaves a partial folder that the next write removes; a write that fails (a full volume) leaves none."""
    monkeypatch.setattr(bundle, "KEEP_BUNDLES", 2)
    others = [tmp_path / "aaa-model-cache", tmp_path / "00000000T000000Z-notes"]
    for other in others:
        other.mkdir()
        (other / "keep.txt").write_text("not the sidecar's")
    (tmp_path / "readme.txt").write_text("not a folder")
    killed = tmp_path / ".20260101T000000Z-engine_wedged.partial"
    killed.mkdir()
    (killed / bundle.MARKER).write_text("")
    snapshot = Pipeline(load(env={})).evaluate(2_000_000_000.0)
    written = [bundle.write_bundle(tmp_path, "engine_wedged", Pipeline(load(env={})).evaluate(t), [], [], "http://vllm:8000") for t in (2e9 + 1, 2e9 + 2)]
    assert not killed.exists()
    early = bundle.write_bundle(tmp_path, "vllm_unreachable", Pipeline(load(env={})).evaluate(1_000_000.0), [], [], "http://vllm:8000")
    assert early.exists() and all(o.exists() and (o / "keep.txt").exists() for o in others) and (tmp_path / "readme.txt").exists()
    assert sorted(p for p in tmp_path.iterdir() if (p / bundle.MARKER).exists()) == sorted([early, written[-1]])

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundle, "load_shape", full)
    with pytest.raises(OSError):
        bundle.write_bundle(tmp_path, "engine_wedged", snapshot, [], [], "http://vllm:8000")
    assert not list(tmp_path.glob(".*.partial"))


def test_a_bundle_is_bounded_while_it_is_written_and_an_outage_keeps_its_failed_scrapes(tmp_path, monkeypatch):
    """Under a page inside every default limit a bundle once wrote 100 MiB before cutting itself to 6.5 MiB (the chart's
    64 MiB emptyDir, and with it vLLM's pod, evicted), and the halving dropped an outage's good readings first. The capture
    now never passes what the bound leaves for it, even for a moment, and the failed scrapes stay with the newest good
    readings."""
    monkeypatch.setattr(bundle, "MAX_BUNDLE_BYTES", 200_000)
    peak = []
    real = bundle._Budget.write

    def watched(self, data):
        written = real(self, data)
        peak.append(self.written)
        return written

    monkeypatch.setattr(bundle._Budget, "write", watched)
    good = [
        Reading(
            "vllm", 1_000.0 + t, True, {("vllm:num_requests_running", make_labels({"n": sha256(f"{t}-{i}".encode()).hexdigest()})): 1.0 for i in range(400)}
        )
        for t in range(60)
    ]
    down = [Reading("vllm", 1_060.0 + t, False, error="connection refused", error_reason="connect") for t in range(30)]
    folder = bundle.write_bundle(tmp_path, "vllm_unreachable", Pipeline(load(env={})).evaluate(1_090.0), [], good + down, "http://vllm:8000")
    assert peak and max(peak) <= 200_000
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 200_000
    kept = list(read_readings(folder / "capture.jsonl.gz"))
    assert [r for r in kept if not r.ok] == down  # every failed scrape
    assert 0 < sum(r.ok for r in kept) < len(good) and max(r.timestamp for r in kept if r.ok) == good[-1].timestamp
