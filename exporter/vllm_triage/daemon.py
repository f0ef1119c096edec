"""The serving process: source loops feed the store, a tick loop evaluates and prepares outlets."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import math
import signal
import ssl
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from aiohttp.web import Application, AppRunner

from . import html_report
from .bundle import MIN_SECONDS_BETWEEN, bundle_archive, write_bundle
from .config import Config
from .cpu_account import CPU
from .diagnosis.condition import Condition
from .diagnosis.conditions import CONDITIONS_BY_ID
from .exposition import Exposition
from .history.capture import demo_capture_path, read_readings
from .model import GIL_SOURCE, PROCESS_SOURCE, SIDECAR_AT_START, ProcessEntry, ProcessTargets, Reading, SidecarState, Snapshot
from .options import ConfigError
from .pipeline import Pipeline
from .registry import build_sources, every, start_sources
from .server import PROBE_PATHS, CappedTCPSite, ProbeAnswer, make_app, probe_answer, serve
from .sources import SourceLoop
from .sources.gil import dump_stacks, where_stuck
from .webconfig import OPEN_PATHS, WebConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
ASKED_BUNDLE_SECONDS = 30.0  # GET /bundle.tar.gz builds at most one bundle this often; the requests between share it
BUNDLE_WAITS_FOR_STACKS_SECONDS = 3.0  # the stack dump the verdict asked for goes in its bundle, unless it takes longer


def steady_wall_clock(wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> Callable[[], float]:
    """Wall time read once, then advanced by the monotonic clock. Readings are ordered and windowed by
    this clock, so a step of the system clock (NTP, a resumed VM) can neither reorder them nor empty the
    windows (an hour back blinded every vLLM condition for an hour); shown times drift by the step."""
    anchor_wall, anchor = wall(), monotonic()
    return lambda: anchor_wall + (monotonic() - anchor)


def _faster(clock: Callable[[], float], speed: float) -> Callable[[], float]:
    """`clock`, run `speed` times as fast from now on."""
    anchor = clock()
    return lambda: anchor + (clock() - anchor) * speed


CONFIG_CHECK_SECONDS = 5.0  # how often the config file is looked at (a mounted ConfigMap changes within a minute)


@dataclass(frozen=True)
class ConfigWatch:
    """The config file to watch and how to load it again (the same flags and environment as at start)."""

    path: Path
    load: Callable[[], Config]


class Daemon:
    def __init__(self, config: Config, clock: Callable[[], float] | None = None, watch: ConfigWatch | None = None) -> None:
        self.config = config
        self.watch = watch
        self._watched = _read(watch.path) if watch else None
        self.reloaded: Config | None = None  # set when run() returned to be started again with this config
        self.clock = clock or steady_wall_clock()
        self.speed = config.demo_speed if config.demo else 1.0  # capture seconds per wall second
        if self.speed != 1.0:
            self.clock = _faster(self.clock, self.speed)
        self.demo_capture: Path | None = None
        self.demo_readings: list[Reading] = []
        if config.demo:  # judged as a capture: its sources are the ones it holds
            self.demo_capture = Path(config.demo_capture) if config.demo_capture else demo_capture_path()
            self.demo_readings = list(read_readings(self.demo_capture, config.max_series, config.max_engines))
        self.pipeline = Pipeline(config, self.demo_readings if config.demo else None)
        self.targets = ProcessTargets()  # vLLM's processes as the process source last listed them
        self.exposition = Exposition(config.conditions, config.tick_seconds)
        self.snapshot: Snapshot | None = None
        self.sidecar = SIDECAR_AT_START  # what the next snapshot carries of the sidecar itself (failures, the last reload)
        self._stop = asyncio.Event()
        # The store, the engine and the exposition are touched by this one thread only: ingest and
        # tick take it in turn, so no locks, and the event loop stays free to answer /metrics while a
        # tick over many engines takes a second (the handlers read bytes prepared here).
        self._pipeline = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline")
        self.stack_dumps: tuple[dict[str, object], ...] = ()  # the last stack dump of a wedged engine, shown in /diagnosis
        self._dumped_for: float | None = None  # the activation (its `since`) the last dump was taken for
        self._dumping: asyncio.Task[None] | None = None
        self._bundled: dict[str, tuple[float | None, float]] = {}  # condition -> (the activation bundled, when)
        self._bundling: asyncio.Task[None] | None = None
        self._asked: tuple[float, bytes] | None = None  # the last bundle asked for: when it was built (monotonic), its bytes
        self._asking: asyncio.Task[bytes] | None = None
        self._page_lock = asyncio.Lock()
        self._page: tuple[Snapshot | None, bytes] | None = None  # the incident page and the snapshot it was made at
        # The snapshots this sidecar served over the store's horizon: the incident page shows the verdicts as they were
        # given (onsets at their `since`, outages, conditions whose `for` is longer than the window), not judged again.
        self.history: collections.deque[Snapshot] = collections.deque(maxlen=math.ceil(self.pipeline.store.horizon_seconds / config.tick_seconds) + 1)

    # --- outlets (read by server.py) ---
    async def metrics_body(self, openmetrics: bool) -> bytes:
        self.exposition.scraped(openmetrics, time.monotonic())
        body = self.exposition.rendered(openmetrics)
        if body is None:  # not rendered at this tick (the first scrape, or one not expected): rendered now, on the pipeline thread
            body = await self._in_pipeline(partial(CPU.run, "render", self.exposition.render, openmetrics))
        return body

    async def report_page(self) -> bytes:
        """The incident page of the in-memory window: its readings plotted under the verdicts this sidecar gave at each
        tick (off the loop and off the pipeline thread, one at a time), made once per tick however often it is asked
        for. During a reload the last page made is served."""
        async with self._page_lock:
            snapshot = self.snapshot
            if self._page is None or self._page[0] is not snapshot:
                try:
                    readings = await self._in_pipeline(partial(self.pipeline.store.readings, html_report.PLOTTED))
                except RuntimeError:  # the pipeline thread is shut down: this daemon is being replaced by a reload
                    return self._page[1] if self._page else b"<!DOCTYPE html>\n<p>Reloading the configuration: ask again.</p>\n"
                title = f"vllm-triage: {self.target}, its last {self.pipeline.store.horizon_seconds:.0f} s"
                page = await asyncio.to_thread(_incident_page, readings, list(self.history), title)
                self._page = (snapshot, page)
            return self._page[1]

    async def bundle_archive(self) -> bytes:
        """The incident bundle of this moment as a .tar.gz, asked for (GET /bundle.tar.gz, `vllm-triage bundle`), off the
        loop: one is built at a time and at most one every ASKED_BUNDLE_SECONDS; every request meanwhile gets that one, so
        that a flood of requests costs one bundle, not one each. RuntimeError while a reload replaces this daemon."""
        built = self._asked
        if built is not None and time.monotonic() - built[0] < ASKED_BUNDLE_SECONDS:
            return built[1]
        if self._asking is None or self._asking.done():
            self._asking = asyncio.create_task(self._build_asked())
        return await asyncio.shield(self._asking)  # a requester that goes away cancels only its own wait

    async def _build_asked(self) -> bytes:
        snapshot = self.snapshot
        assert snapshot is not None  # the handler answers 503 before the first evaluation
        readings = await self._in_pipeline(self.pipeline.store.readings)
        body = await asyncio.to_thread(bundle_archive, "asked", snapshot, list(self.history), readings, self.target, self.stack_dumps)
        self._asked = (time.monotonic(), body)
        return body

    @property
    def target(self) -> str:
        """What the report says it diagnosed."""
        return "the bundled demo capture" if self.config.demo else self.config.vllm_url_shown

    # --- pipeline ---
    def ingest(self, reading: Reading) -> None:
        self.pipeline.feed(reading)
        if reading.source == PROCESS_SOURCE:
            self.targets.update(reading)

    @property
    def engine_liveness_endpoint(self) -> bool:
        return self.config.engine_liveness_endpoint

    @property
    def evaluation_error(self) -> str | None:
        return self.sidecar.evaluation_error

    def tick(self) -> Snapshot:
        failing = self.sidecar.evaluation_error is not None
        # the error cleared is carried only if this evaluation succeeds; a healthy tick makes no new state
        sidecar = replace(self.sidecar, evaluation_error=None) if failing else self.sidecar
        snapshot = CPU.run("evaluate", self.pipeline.evaluate, self.clock(), self._stuck(), self.stack_dumps, sidecar)
        if failing:
            log.info("evaluation recovered")
        self.sidecar = sidecar
        CPU.run("render", self.exposition.update, snapshot, time.monotonic())
        if self.snapshot is None:
            log.info("first evaluation done: ready")
        self._log_transitions(self.snapshot, snapshot)
        self.snapshot = snapshot
        self.history.append(snapshot)
        return snapshot

    def _sidecar_changed(self, sidecar: SidecarState) -> None:
        """The sidecar's state changed between evaluations: the snapshot served carries it now (a new value, the last
        good one's verdicts and signals), and the next evaluation carries it on."""
        self.sidecar = sidecar
        if self.snapshot is not None:
            self.snapshot = replace(self.snapshot, sidecar=self.sidecar)
        self.exposition.update(self.snapshot)

    def _reload_seen(self, successful: bool) -> None:
        # on the pipeline thread, as every change of self.sidecar: a failure counted meanwhile is not lost
        self._sidecar_changed(replace(self.sidecar, config_reload_successful=successful))

    @staticmethod
    def _log_transitions(before: Snapshot | None, after: Snapshot) -> None:
        previous = {v.condition: v.state for v in before.verdicts} if before else {}
        for verdict in after.verdicts:
            old = previous.get(verdict.condition)
            if old is not None and old != verdict.state and "active" in (old, verdict.state):
                log.warning("condition %s: %s -> %s (%s)", verdict.condition, old, verdict.state, verdict.summary)

    async def _check_config(self) -> None:
        """A changed config file is loaded: a valid one ends run() so that serve_forever continues with a
        daemon made from it (vLLM and the pod are untouched; the readings are taken over); an invalid one
        is reported and the running configuration kept."""
        assert self.watch is not None
        content = await asyncio.to_thread(_read, self.watch.path)  # a huge or slow file must not hold up /metrics
        if content == self._watched:
            return
        self._watched = content
        try:
            config = await asyncio.to_thread(self.watch.load)
        except ConfigError as error:
            log.error("config file %s changed but is invalid, the running configuration is kept: %s", self.watch.path, error)
            await self._in_pipeline(partial(self._reload_seen, False))
            return
        if config.web_config_file != self.config.web_config_file:
            # The listener's TLS and users come from the file named at start; another file needs a restart.
            log.error("config file %s changed web_config_file: that needs a restart; the running configuration is kept", self.watch.path)
            await self._in_pipeline(partial(self._reload_seen, False))
            return
        if not self.sidecar.config_reload_successful:
            await self._in_pipeline(partial(self._reload_seen, True))
        if config != self.config:
            log.warning("config file %s changed: continuing with it (vLLM is not touched; the windows are kept)", self.watch.path)
            self.reloaded = config
            self._stop.set()

    async def _in_pipeline(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pipeline, work)

    async def _ingest(self, reading: Reading) -> None:
        await self._in_pipeline(partial(CPU.run, "ingest", self.ingest, reading))

    def _tick_if_fed(self) -> None:
        # Ready means "judged on something": wait for the first reading, ok or failed.
        if not self.pipeline.fed():
            return
        try:
            self.tick()
        except Exception as error:
            # A tick that fails must show: /readyz turns 503 with the error, the failure counter rises,
            # and /metrics keeps the last good snapshot (its evaluation timestamp stops moving).
            message = f"{type(error).__name__}: {error}"
            if message != self.sidecar.evaluation_error:
                log.exception("evaluation failed (the last good snapshot is served)")
            self._sidecar_changed(replace(self.sidecar, evaluation_failures=self.sidecar.evaluation_failures + 1, evaluation_error=message))

    async def _tick(self) -> None:
        await self._in_pipeline(self._tick_if_fed)
        self._dump_stacks_if_asked()
        self._bundle_if_critical()

    def _stuck(self) -> tuple[tuple[str, str, str], ...]:
        """Where the stack dump of a verdict's current activation found its process waiting (role, place, frame): an
        input of the next evaluations while that activation lasts."""
        active = {v.condition: v.since for v in self.snapshot.verdicts if v.active} if self.snapshot else {}
        return tuple(
            (str(d["role"]), str(d["stuck_in"]), str(d["frame"]))
            for d in self.stack_dumps
            if "stuck_in" in d and active.get(str(d["condition"])) == d["activation"]
        )

    def _dump_stacks_if_asked(self) -> None:
        """Once per activation of a condition that asks for stacks (Condition.stack_dump_role: engine_wedged), take that
        process's Python stacks (py-spy dump): the page then says where it is stuck. Only where py-spy may run (the gil
        source is on) and vLLM is live."""
        if self.config.demo or GIL_SOURCE not in self.config.sources or self.snapshot is None:
            return
        asking = next((v for v in self.snapshot.verdicts if v.active and _wants_stacks(CONDITIONS_BY_ID[v.condition], v.cause)), None)
        if asking is None or asking.since == self._dumped_for or (self._dumping is not None and not self._dumping.done()):
            return
        self._dumped_for = asking.since
        role = CONDITIONS_BY_ID[asking.condition].stack_dump_role
        processes = self.pipeline.store.latest(PROCESS_SOURCE)
        found = [p for p in (processes.process_meta().get("processes", []) if processes else []) if p.get("role") == role]
        if not found:
            self.stack_dumps = ({"condition": asking.condition, "error": f"no {role} process is visible (is the process namespace shared?)"},)
            return
        self._dumping = asyncio.create_task(self._dump(asking.condition, asking.since, found[0]))

    def _bundle_if_critical(self) -> None:
        """Once per activation of a critical verdict (and at most once per condition in MIN_SECONDS_BETWEEN), with
        bundle_dir set: write the incident bundle, after the stack dump the verdict asked for, off the loop."""
        if self.config.bundle_dir is None or self.config.demo or self.snapshot is None or (self._bundling is not None and not self._bundling.done()):
            return
        now = self.snapshot.timestamp
        for verdict in self.snapshot.verdicts:
            since, written = self._bundled.get(verdict.condition, (None, -math.inf))
            if verdict.active and verdict.severity == "critical" and verdict.since != since and now - written >= MIN_SECONDS_BETWEEN:
                self._bundled[verdict.condition] = (verdict.since, now)
                self._bundling = asyncio.create_task(self._bundle(verdict.condition, self.snapshot, Path(self.config.bundle_dir)))
                return

    async def _bundle(self, condition: str, snapshot: Snapshot, directory: Path) -> None:
        if self._dumping is not None and not self._dumping.done():
            await asyncio.wait([self._dumping], timeout=BUNDLE_WAITS_FOR_STACKS_SECONDS)
        try:
            readings = await self._in_pipeline(self.pipeline.store.readings)
            trail = list(self.history)
            folder = await asyncio.to_thread(write_bundle, directory, condition, snapshot, trail, readings, self.target, self.stack_dumps)
        except Exception as exc:  # a full or read-only volume: said, and the sidecar goes on
            log.error("%s: the incident bundle could not be written to %s: %s", condition, directory, exc)
            # this activation is not tried again, but the condition's next one is not kept waiting MIN_SECONDS_BETWEEN
            self._bundled[condition] = (self._bundled[condition][0], -math.inf)
        else:
            log.warning("%s: incident bundle written to %s", condition, folder)

    async def _dump(self, condition: str, activation: float | None, process: ProcessEntry) -> None:
        pid = process["pid"]
        taken_at = self.clock()
        result = await dump_stacks(pid)
        where = where_stuck(result.get("stacks", ""))
        role = process.get("role")
        self.stack_dumps = (
            {
                "condition": condition,
                "activation": activation,
                "role": role,
                "pid": pid,
                "status": process.get("status"),
                "taken_at": taken_at,
                **result,
                **({"stuck_in": where[0], "frame": where[1]} if where else {}),
            },
        )
        log.warning("%s: stacks of the %s (pid %d): %s", condition, role, pid, result.get("stacks", result.get("error", ""))[:2000])

    async def _demo_loop(self) -> None:
        """Replay a capture at real speed onto the wall clock, looping forever."""
        readings = self.demo_readings
        if not readings:
            log.error("demo capture %s has no readings", self.demo_capture)
            return
        first, last = readings[0].timestamp, readings[-1].timestamp
        gap = self.config.scrape_interval_seconds
        log.info("demo: replaying %s (%d readings, %.0f s) in a loop", self.demo_capture, len(readings), last - first)
        while not self._stop.is_set():
            offset = self.clock() - first
            for reading in readings:
                delay = (reading.timestamp + offset - self.clock()) / self.speed
                if delay > 0:
                    try:
                        await asyncio.wait_for(self._stop.wait(), timeout=delay)
                        return
                    except asyncio.TimeoutError:
                        pass
                await self._ingest(reading.shifted(offset))
            await asyncio.sleep(gap / self.speed)

    async def run(self) -> None:
        """Collect and evaluate until stop() or until a changed config file was loaded (self.reloaded)."""
        config = self.config
        tasks: list[asyncio.Task[None]] = []
        loops: list[SourceLoop] = []
        if config.demo:
            tasks.append(asyncio.create_task(self._demo_loop()))
        else:
            loops = build_sources(config, self.clock, self.targets)
            tasks.append(await start_sources(loops, self._ingest, self._stop))
        tasks.append(asyncio.create_task(every(config.tick_seconds / self.speed, "tick", self._tick, self._stop)))
        if self.watch is not None:
            tasks.append(asyncio.create_task(every(CONFIG_CHECK_SECONDS, "config", self._check_config, self._stop)))
        try:
            await self._stop.wait()
        finally:
            if self._dumping is not None:
                tasks.append(self._dumping)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for loop_ in loops:
                await loop_.close()

    def stop(self) -> None:
        self._stop.set()

    def take_over(self, before: Daemon) -> None:
        """Continue from the daemon a reload replaces: its readings of the sources still on (the windows
        stay full), each verdict's state and its last snapshot, served until this one's first evaluation."""
        self._watched = before._watched  # the content this config came from: a newer change is still seen
        self.sidecar = before.sidecar  # the failures counted so far: a counter does not restart with the config
        if not self.config.demo and not before.config.demo:
            self.pipeline.store.take_history(before.pipeline.store, self.config.sources)
            if PROCESS_SOURCE in self.config.sources:
                self.targets.processes = before.targets.processes
            # Verdicts go on where they stood: an active one stays active (its alert neither resolves nor pages again)
            # and is judged with the new settings from the next tick; its stack dump is not taken twice.
            self.pipeline.engine.take_state(before.pipeline.engine)
            self.stack_dumps, self._dumped_for = before.stack_dumps, before._dumped_for
            self._bundled = before._bundled
            self.history.extend(before.history)
            # the envelope goes on too, kept where this config says
            before.pipeline.envelope.path, self.pipeline.envelope = self.pipeline.envelope.path, before.pipeline.envelope
        if before.snapshot is not None:
            self.snapshot = before.snapshot
            self.exposition.update(before.snapshot)

    def shutdown(self) -> None:
        self._pipeline.shutdown(wait=True)
        self.pipeline.envelope.save()


def _wants_stacks(condition: Condition, cause: str | None) -> bool:
    return condition.stack_dump_role is not None and (not condition.stack_dump_causes or cause in condition.stack_dump_causes)


def _incident_page(readings: list[Reading], snapshots: list[Snapshot], title: str) -> bytes:
    return html_report.render(readings, snapshots, title).encode() if snapshots else b"<!DOCTYPE html>\n<p>No readings yet.</p>\n"


class _Current:
    """What the HTTP handlers serve: the running daemon, replaced when a changed config file is loaded,
    so that the listener (and Prometheus' scrapes) never see the reload."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    @property
    def snapshot(self) -> Snapshot | None:
        return self.daemon.snapshot

    @property
    def evaluation_error(self) -> str | None:
        return self.daemon.evaluation_error

    @property
    def target(self) -> str:
        return self.daemon.target

    @property
    def engine_liveness_endpoint(self) -> bool:
        return self.daemon.engine_liveness_endpoint

    async def metrics_body(self, openmetrics: bool) -> bytes:
        return await self.daemon.metrics_body(openmetrics)

    async def report_page(self) -> bytes:
        return await self.daemon.report_page()

    async def bundle_archive(self) -> bytes:
        return await self.daemon.bundle_archive()


def _listener(config: Config) -> tuple[str, int, int, float]:
    return config.listen_host, config.listen_port, config.max_connections, config.http_header_timeout_seconds


async def serve_forever(config: Config, watch: ConfigWatch | None = None, web: WebConfig | None = None) -> None:
    """`serve`: the HTTP listener, and a daemon behind it; a changed config file swaps the daemon (vLLM and
    the pod are untouched, the listener stays up unless its own settings changed)."""
    # A scrape arriving while the pipeline thread computes waits for the GIL: hand it over after
    # 1 ms instead of the default 5 ms.
    sys.setswitchinterval(0.001)
    # What is loaded by now (modules, classes, functions: ~48k objects) lives as long as the process. Kept
    # out of the cyclic collector, its full collections no longer scan it each time: one took 24 ms holding
    # the GIL on the 2-core machine, and a scrape meanwhile waited as long. (The daemons made below stay
    # collectable: a reload drops one.)
    gc.collect()
    gc.freeze()
    current = _Current(Daemon(config, watch=watch))
    app = make_app(current, [web.middleware()] if web is not None else [])  # users may come with a later refresh
    tls = web.ssl_context if web is not None else None
    # Over the connection cap the probes are still answered: those that need no password when a web config is on.
    probe = (partial(probe_answer, current), frozenset(OPEN_PATHS) if web is not None else frozenset(PROBE_PATHS))
    runner, _ = await serve(app, *_listener(config), tls, probe)
    host = "127.0.0.1" if config.listen_host in ("0.0.0.0", "::", "") else config.listen_host
    print(f"vllm-triage serving on {'https' if tls else 'http'}://{host}:{config.listen_port}/", flush=True)
    stopping = asyncio.Event()

    def stop() -> None:
        stopping.set()
        current.daemon.stop()

    hangups: set[asyncio.Task[None]] = set()

    def reload_now() -> None:
        """SIGHUP reloads, as Prometheus' and Alertmanager's do: the config file and the web config are re-read now."""
        daemon = current.daemon
        if daemon.watch is None and web is None:
            log.warning("SIGHUP: nothing to reload (no --config file and no web config); the sidecar keeps running")
            return
        log.warning("SIGHUP: re-reading %s", ", ".join(str(p) for p in (daemon.watch.path if daemon.watch else None, web.file if web else None) if p))
        task = asyncio.create_task(_reload(daemon, web))
        hangups.add(task)
        task.add_done_callback(hangups.discard)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # a clean exit: py-spy killed, capture closed
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGHUP, reload_now)
    refreshing = asyncio.create_task(_refresh_web_config(web, stopping)) if web is not None else None
    draining: set[asyncio.Task[None]] = set()
    try:
        while True:
            running = current.daemon
            await running.run()
            if stopping.is_set() or running.reloaded is None:
                log.info("shutting down")
                break
            replacement = Daemon(running.reloaded, watch=watch)
            replacement.take_over(running)
            logging.getLogger().setLevel(replacement.config.log_level.upper())
            current.daemon = replacement
            running.shutdown()
            if _listener(replacement.config) != _listener(running.config):
                runner = await _move_listener(runner, app, _listener(running.config), _listener(replacement.config), tls, probe, draining)
    finally:
        if refreshing is not None:
            refreshing.cancel()
        await runner.cleanup()  # before the last pipeline goes: a scrape in flight may still render on it
        current.daemon.shutdown()


async def _move_listener(
    old: AppRunner,
    app: Application,
    before: tuple[str, int, int, float],
    after: tuple[str, int, int, float],
    tls: ssl.SSLContext | None,
    probe: tuple[ProbeAnswer, frozenset[str]],
    draining: set[asyncio.Task[None]],
) -> AppRunner:
    """The listener's own settings changed: a new site takes over at once, on the same listening socket where the address
    did not change (connections queued meanwhile are answered, not reset), and the old connections drain behind it
    (waiting for them first once left the probes unanswered for seconds under load). A new address that cannot be bound
    keeps the old one, saying so."""
    same = before[:2] == after[:2]
    kept = next((site.listening_socket() for site in old.sites if isinstance(site, CappedTCPSite)), None) if same else None
    for site in list(old.sites):
        await site.stop()  # closes this site's listening socket only
    try:
        runner, _ = await serve(app, *after, tls, probe, sock=kept)
    except OSError as error:
        log.error("cannot listen on %s:%d (%s): still listening on %s:%d; restart the sidecar to move it", after[0], after[1], error, before[0], before[1])
        runner, _ = await serve(app, *before, tls, probe)
    task = asyncio.create_task(old.cleanup())
    draining.add(task)
    task.add_done_callback(draining.discard)
    return runner


async def _reload(daemon: Daemon, web: WebConfig | None) -> None:
    if daemon.watch is not None:
        await daemon._check_config()
    if web is not None:
        said = await asyncio.to_thread(web.refresh)
        if said is not None:
            (log.warning if "applied" in said else log.error)(said)


async def _refresh_web_config(web: WebConfig, stopping: asyncio.Event) -> None:
    """The web config and its certificate are re-read as the config file is: a rotated certificate or changed users
    apply without a restart; a change that cannot (TLS on or off) or an invalid file is said in the log."""
    while not stopping.is_set():
        await asyncio.sleep(CONFIG_CHECK_SECONDS)
        said = await asyncio.to_thread(web.refresh)
        if said is not None:
            (log.warning if "applied" in said else log.error)(said)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
