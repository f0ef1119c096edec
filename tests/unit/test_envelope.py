"""vLLM's envelope per configuration (envelope.py): what a change is told by, a restart that changes nothing, and a
state file that is garbage or cannot be written. The readings are the real eager_change capture's (a 1B model on an
H100 under 32 clients with CUDA graphs, then relaunched with --enforce-eager)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from vllm_triage.config_loader import load
from vllm_triage.envelope import Configuration, Envelope, Point, differences
from vllm_triage.history.capture import read_readings
from vllm_triage.model import Reading
from vllm_triage.pipeline import Pipeline

from harness.cadence import as_read, every

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURE = DATA / "real-vllm-h100-eager_change.jsonl.gz"
MARKS = {name: at for name, at in json.loads((DATA / "real-vllm-h100-eager_change.json").read_text())}


def graphs_half() -> list[Reading]:
    return [r for r in read_readings(str(CAPTURE)) if r.timestamp < MARKS["relaunch"]]


def state_of(snapshot) -> str:
    return next(v.state for v in snapshot.verdicts if v.condition == "regression_after_change")


def regression_states(readings: list[Reading], envelope_file: Path | None = None) -> set[str]:
    config = load(env={}, flags={"envelope_file": str(envelope_file)} if envelope_file else {})
    pipeline = Pipeline(config)
    states: set[str] = set()
    pipeline.replay(readings, lambda s: states.add(state_of(s)))
    return states


def test_what_changed_is_said_over_what_both_sides_know():
    before = {"version": "0.26.0", "flag --max-num-seqs": "256", "flag --port": "8000", "cache block_size": "16"}
    after = {"version": "0.26.1", "flag --max-num-seqs": "8", "flag --enforce-eager": "", "cache block_size": "16"}
    assert differences(before, after) == ["--enforce-eager added", "--max-num-seqs 256 -> 8", "--port removed (was 8000)", "vLLM 0.26.0 -> 0.26.1"]
    # read without the process view on one side: its flags are not a change, its version still is
    assert differences({"version": "0.26.0", "cache block_size": "16"}, after) == ["vLLM 0.26.0 -> 0.26.1"]
    assert differences(before, dict(before)) == []


def test_a_restart_that_changes_nothing_goes_on_with_the_same_envelope():
    """The graphs half twice, with 40 s of vLLM not answering between (a plain restart, the same flags): one
    configuration, no change, no verdict."""
    first = graphs_half()
    shift = first[-1].timestamp - first[0].timestamp + 40
    down = [Reading("vllm", first[-1].timestamp + t, False, error="connection refused", error_reason="connect") for t in range(2, 40, 2)]
    again = [dataclasses.replace(r, timestamp=r.timestamp + shift) for r in first]
    pipeline = Pipeline(load(env={}))
    states: set[str] = set()
    pipeline.replay(
        sorted(first + down + again, key=lambda r: r.timestamp),
        lambda s: states.add(next(v.state for v in s.verdicts if v.condition == "regression_after_change")),
    )
    assert "active" not in states
    assert len(pipeline.envelope.configurations) == 1 and pipeline.envelope.changed_at is None


def test_a_garbled_state_file_is_said_and_the_envelope_starts_again(tmp_path, caplog):
    state = tmp_path / "envelope.json"
    for garbage in ("{not json", json.dumps({"version": 1, "configurations": [{"identity": {}, "first_seen": "x", "points": []}]}), json.dumps([1, 2])):
        state.write_text(garbage)
        with caplog.at_level(logging.WARNING, logger="vllm_triage.envelope"):
            envelope = Envelope(str(state), tick_seconds=2.0)
        assert envelope.configurations == [] and envelope.changed_at is None
        assert str(state) in caplog.text and "starts again now" in caplog.text
        caplog.clear()
    # and the sidecar judges on, writing a good one over it
    states = regression_states(graphs_half(), state)
    assert "inactive" in states and "active" not in states
    assert json.loads(state.read_text())["configurations"]


def test_a_state_file_that_cannot_be_written_is_said_and_judging_goes_on(tmp_path, caplog):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the envelope's folder should be")
    with caplog.at_level(logging.WARNING, logger="vllm_triage.envelope"):
        states = regression_states(graphs_half(), blocked / "envelope.json")
    assert "inactive" in states and "active" not in states
    assert caplog.text.count("cannot write vLLM's envelope") == 1 and "kept in memory only" in caplog.text


def test_only_the_same_load_and_prompt_length_are_compared():
    """Traffic that changed with the configuration is not blamed on it: after a change, prompts four times as long (each
    request slower for that alone) match nothing before it, and a different number of requests in flight neither."""
    envelope = Envelope(None, tick_seconds=2.0)
    envelope.configurations = [Configuration({"flag --max-num-seqs": "8"}, 0.0), Configuration({"flag --max-num-seqs": "2"}, 100.0)]
    envelope.changed_at = 100.0
    envelope.configurations[0].points.extend(Point(t, 16.0, 10.0, 0.05, 0.5, 200.0) for t in range(40))
    envelope.configurations[1].points.extend(Point(100.0 + t, 16.0, 4.0, 0.05, 0.5, 800.0) for t in range(40))
    assert envelope.comparison() is None
    envelope.configurations[1].points.clear()
    envelope.configurations[1].points.extend(Point(100.0 + t, 40.0, 4.0, 0.05, 0.5, 200.0) for t in range(40))
    assert envelope.comparison() is None
    envelope.configurations[1].points.clear()
    envelope.configurations[1].points.extend(Point(100.0 + t, 17.0, 4.0, 0.05, 0.5, 220.0) for t in range(40))
    assert envelope.comparison() == (17.0, 0.4, 1.0, 1.0)


def test_a_change_is_judged_as_soon_at_a_longer_tick():
    """The envelope compares a minute of points after the change with at least half a minute before it, in seconds and
    not in points: a sidecar ticking every 4 s (its readings thinned to one per 4 s, as it would read them) says the
    --enforce-eager regression at most two of its ticks after one ticking every 2 s, not a minute later."""
    readings = list(read_readings(str(CAPTURE)))
    first_active = {}
    for seconds in (2.0, 4.0):
        config = load(env={}, flags=every(seconds))
        active: list[float] = []
        Pipeline(config).replay(as_read(readings, config), lambda s, seen=active: seen.extend([s.timestamp] if state_of(s) == "active" else []))
        assert active, f"no regression_after_change at a {seconds:g} s tick"
        first_active[seconds] = active[0]
    assert first_active[4.0] - first_active[2.0] <= 8.0, first_active


def unreachable_and_starting(pipeline: Pipeline, readings: list[Reading]) -> list[tuple[float, str, float | None]]:
    """(time, vllm_unreachable's state, how long vLLM counts as starting) at each tick."""
    ticks: list[tuple[float, str, float | None]] = []
    pipeline.replay(
        readings, lambda s: ticks.append((s.timestamp, next(v.state for v in s.verdicts if v.condition == "vllm_unreachable"), s.vllm_starting_seconds))
    )
    return ticks


def test_a_sidecar_restarted_while_vllm_is_down_judges_the_outage_not_a_start(tmp_path):
    """The real killed capture (every vLLM process SIGKILLed on an H200): the sidecar restarts 30 s into the outage. With
    its state file it knows vLLM answered before, so the outage stays an outage (the page neither resolves nor comes
    again after the start-up budget); a sidecar without one would count vLLM as starting."""
    killed = {name: at for name, at in json.loads((DATA / "real-vllm-h200-killed.json").read_text())}["vllm_killed"]
    readings = list(read_readings(str(DATA / "real-vllm-h200-killed.jsonl.gz")))
    before, after = [r for r in readings if r.timestamp < killed + 20], [r for r in readings if r.timestamp >= killed + 30]
    state = tmp_path / "envelope.json"
    config = load(env={}, flags={"envelope_file": str(state)})
    first = Pipeline(config)
    first.replay(before, lambda s: None)
    first.envelope.save()  # the daemon's clean stop (a kill: the save at vLLM's first answer holds it)
    assert json.loads(state.read_text())["answered"]["at"] <= killed
    restarted = unreachable_and_starting(Pipeline(config), after)
    start = after[0].timestamp
    scraped = next(r.timestamp for r in after if r.source == "vllm")
    assert all(starting is None for t, _, starting in restarted if t >= scraped), "the restarted sidecar counted vLLM as starting"
    active = [t - start for t, state, _ in restarted if state == "active"]
    assert active and active[0] <= 35 and restarted[-1][1] == "active"
    forgetful = unreachable_and_starting(Pipeline(load(env={})), after)
    assert all(state == "inactive" and starting is not None for t, state, starting in forgetful if t >= scraped), "without the state file it is a start"


def test_a_sidecar_restarted_while_a_new_vllm_loads_judges_it_starting(tmp_path):
    """The real eager_change capture: vLLM relaunched (a new API server process) and loading for 44 s. A sidecar that
    restarts in the load recalls that vLLM answered before, but from another process: this one is starting."""
    marks = MARKS
    readings = list(read_readings(str(CAPTURE)))
    before = [r for r in readings if r.timestamp < marks["relaunch"]]
    during = [r for r in readings if marks["vllm_launched"] + 15 <= r.timestamp < marks["vllm_ready"]]
    state = tmp_path / "envelope.json"
    config = load(env={}, flags={"envelope_file": str(state)})
    first = Pipeline(config)
    first.replay(before, lambda s: None)
    first.envelope.save()
    ticks = unreachable_and_starting(Pipeline(config), during)
    assert {state for _, state, _ in ticks} == {"inactive"} and all(starting is not None for _, _, starting in ticks[1:])


def test_a_state_file_with_impossible_numbers_a_fifo_or_a_failed_save_starts_again_and_judging_goes_on(tmp_path, caplog, monkeypatch):
    """A changed_at of 1e300 or NaN once made every evaluation fail, and a clean stop wrote it back; a FIFO in the file's
    place blocked the start; a save that failed left its temporary file. Each is refused with a warning, judging goes on."""
    import os

    state = tmp_path / "envelope.json"
    good = {"version": 1, "changed_at": None, "configurations": [{"identity": {"version": "0.26.0"}, "first_seen": 1.0e9, "points": []}]}
    for bad in ({**good, "changed_at": 1e300}, {**good, "changed_at": float("nan")}, {**good, "answered": {"at": -5, "api_server": None}}):
        state.write_text(json.dumps(bad))
        with caplog.at_level(logging.WARNING, logger="vllm_triage.envelope"):
            envelope = Envelope(str(state), tick_seconds=2.0)
        assert envelope.configurations == [] and envelope.changed_at is None and envelope.answered_before is None
        assert "is not one this sidecar wrote" in caplog.text and "starts again now" in caplog.text
        caplog.clear()
        states = regression_states(graphs_half(), state)  # evaluations go on and write a good file over it
        assert "inactive" in states and json.loads(state.read_text())["changed_at"] is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with caplog.at_level(logging.WARNING, logger="vllm_triage.envelope"):
        envelope = Envelope(str(fifo), tick_seconds=2.0)  # returns: nothing waits for a writer
    assert envelope.configurations == [] and "not a regular file" in caplog.text

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    writing = Envelope(str(tmp_path / "full" / "envelope.json"), tick_seconds=2.0)
    writing.save()
    assert list((tmp_path / "full").iterdir()) == []
