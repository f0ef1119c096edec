"""The one path from Readings to a Snapshot: a store fed with readings and the condition engine
evaluating it on a clock. The daemon (serve), replay and diagnose all go through it, so a verdict from a
capture is the verdict the live sidecar gave on the same readings."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from .catalog import lookbacks, stale_after
from .config import Config
from .derive import DeriveSettings, derive
from .diagnosis.engine import Engine
from .envelope import Envelope
from .model import PROCESS_SOURCE, SIDECAR_AT_START, VLLM_SOURCE, Reading, SidecarState, Snapshot
from .store import Store


class Pipeline:
    """Readings in, Snapshots out. For live readings the sources are the configured ones; for a
    capture's or a history's, the ones it holds (a source it lacks is "not in the recorded readings", not "turned off")."""

    def __init__(self, config: Config, captured: Iterable[Reading] | None = None) -> None:
        if captured is None:
            sources, absent = tuple(config.sources), "turned off (the sources setting)"
        else:
            sources, absent = tuple(sorted({r.source for r in captured})), "not in the recorded readings (the capture, or Prometheus' history)"
        self.engine = Engine(config.conditions, config.window_seconds, sources=sources, absent_reason=absent)
        lookback = lookbacks(config)
        self.derive_settings = DeriveSettings(config.max_num_seqs, stale_after(config), lookback)
        # A capture's envelope is its own: only the live sidecar keeps one across its restarts.
        self.envelope = Envelope(config.envelope_file if captured is None else None, config.tick_seconds)
        # Keep a little more than the longest window so edge frames are always present; sources that
        # look further back (py-spy's windows come minutes apart) keep their lookback, only they (every
        # vLLM page for 3 minutes cost 3x the memory).
        margin = 4 * config.scrape_interval_seconds
        horizons = {name: max(self.engine.horizon_seconds, seconds) + margin for name, seconds in lookback.items()}
        self.store = Store(horizon_seconds=self.engine.horizon_seconds + margin, horizons=horizons)
        self.tick_seconds = config.tick_seconds
        self.reach_seconds = max(self.store.horizon_seconds, *horizons.values())  # how far back any window looks

    def feed(self, reading: Reading) -> None:
        self.store.add(reading)

    def evaluate(
        self, now: float, stuck: tuple[tuple[str, str, str], ...] = (), stack_dumps: tuple[dict[str, Any], ...] = (), sidecar: SidecarState = SIDECAR_AT_START
    ) -> Snapshot:
        return evaluate(self.engine, self.store, now, stuck, stack_dumps, sidecar, derive_settings=self.derive_settings, envelope=self.envelope)

    def fed(self) -> bool:
        """Whether any reading arrived yet, ok or failed."""
        return bool(self.store.sources())

    def replay(self, readings: list[Reading], on_tick: Callable[[Snapshot], None], until: float | None = None) -> Snapshot | None:
        """Feed recorded readings on a virtual clock, one evaluation per tick from the first reading to
        `until` (default: one tick past the last)."""
        if not readings:
            return None
        now = readings[0].timestamp
        end = readings[-1].timestamp + self.tick_seconds if until is None else until
        index = 0
        snapshot: Snapshot | None = None
        while now <= end:
            while index < len(readings) and readings[index].timestamp <= now:
                self.feed(readings[index])
                index += 1
            snapshot = self.evaluate(now)
            on_tick(snapshot)
            now += self.tick_seconds
            # A gap in the recording longer than any window: once every window is past the last reading nothing changes
            # until the next one comes into reach, so the ticks in between are skipped (two readings days apart replay
            # in two windows' ticks, not days of them).
            if 0 < index < len(readings) and now - readings[index - 1].timestamp > self.reach_seconds:
                ahead = readings[index].timestamp - self.reach_seconds - now
                if ahead > self.tick_seconds:
                    now += math.floor(ahead / self.tick_seconds) * self.tick_seconds
        return snapshot


def evaluate(
    engine: Engine,
    store: Store,
    now: float,
    stuck: tuple[tuple[str, str, str], ...] = (),
    stack_dumps: tuple[dict[str, Any], ...] = (),
    sidecar: SidecarState = SIDECAR_AT_START,
    *,
    derive_settings: DeriveSettings | None = None,
    envelope: Envelope | None = None,
) -> Snapshot:
    """The one evaluation step: derive what the store holds at `now` (health, discovery, signals), add this tick to
    vLLM's envelope (what a change cost), hand the judge the values its conditions declare (and where stack dumps found
    vLLM's processes waiting: (role, place, frame)), and assemble the Snapshot (with the stack dumps taken for the
    active verdicts, shown in /diagnosis, and the sidecar's own state the daemon carries from one evaluation to the
    next)."""
    if envelope is not None and envelope.answered_before is not None and store.latest(VLLM_SOURCE) is not None and store.last_success(VLLM_SOURCE) is None:
        answered = envelope.recall(store, engine.sources is None or PROCESS_SOURCE in engine.sources)
        if answered is not None:
            store.recall_success(VLLM_SOURCE, answered)
    derived = derive(store, now, derive_settings or DeriveSettings())
    wants = engine.wants()
    change: tuple[str, ...] = ()
    usual: tuple[str, ...] = ()
    if envelope is not None:
        envelope.observe(store, derived.discovery, now)
        signals, change, usual = envelope.judged(now, wants.notes)
        derived.global_signals.update(signals)
    judgement = engine.judge(derived.inputs(wants, stuck, change, usual))
    found = derived.discovery.view()
    if envelope is not None and envelope.served_models and not found.served_models:  # vLLM down: the model it served
        found = replace(found, served_models=envelope.served_models)
    return Snapshot(
        timestamp=now,
        signals=derived.shown(engine.window_seconds),
        verdicts=judgement.verdicts,
        primary=judgement.primary,
        sources=derived.sources,
        evaluations=judgement.evaluations,
        window_seconds=engine.window_seconds,
        discovery=found,
        latest=derived.latest_exported(),
        vllm_starting_seconds=judgement.vllm_starting_seconds,
        stack_dumps=stack_dumps,
        sidecar=sidecar,
    )


def replay(readings: list[Reading], config: Config, on_tick: Callable[[Snapshot], None], until: float | None = None) -> Snapshot | None:
    """Run a capture's (or a history's) readings through a fresh pipeline on a virtual clock (see Pipeline.replay)."""
    return Pipeline(config, readings).replay(readings, on_tick, until)


def judge_at(config: Config, readings: list[Reading], now: float, captured: bool) -> Snapshot:
    """One evaluation at `now` over the readings up to it (diagnose)."""
    pipeline = Pipeline(config, readings if captured else None)
    for reading in readings:
        if reading.timestamp <= now:
            pipeline.feed(reading)
    return pipeline.evaluate(now)
