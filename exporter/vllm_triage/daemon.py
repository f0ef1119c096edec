"""The serving process: source loops feed the store, a tick loop evaluates and prepares outlets."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from .capture import CaptureWriter, demo_capture_path, read_readings
from .config import Config
from .cpu_account import CPU
from .exposition import Exposition
from .model import PROCESS_SOURCE, Reading, Snapshot
from .pipeline import Pipeline
from .registry import SourceLoop, build_sources
from .server import make_app, serve

log = logging.getLogger(__name__)
T = TypeVar("T")


def steady_wall_clock(wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> Callable[[], float]:
    """Wall time read once, then advanced by the monotonic clock. Readings are ordered and windowed by
    this clock, so a step of the system clock (NTP, a resumed VM) can neither reorder them nor empty the
    windows (an hour back blinded every vLLM condition for an hour); shown times drift by the step."""
    anchor_wall, anchor = wall(), monotonic()
    return lambda: anchor_wall + (monotonic() - anchor)


class Daemon:
    def __init__(self, config: Config, clock: Callable[[], float] | None = None, recorder: CaptureWriter | None = None) -> None:
        self.config = config
        self.clock = clock or steady_wall_clock()
        self.demo_capture: Path | None = None
        self.demo_readings: list[Reading] = []
        if config.demo:  # judged as a capture: its sources are the ones it holds
            self.demo_capture = Path(config.demo_capture) if config.demo_capture else demo_capture_path()
            self.demo_readings = list(read_readings(self.demo_capture))
        self.pipeline = Pipeline(config, self.demo_readings if config.demo else None)
        self.exposition = Exposition(config.conditions, config.tick_seconds)
        self.recorder = recorder
        self.snapshot: Snapshot | None = None
        self.evaluation_error: str | None = None  # the last tick's error, None when it succeeded
        self._stop = asyncio.Event()
        # The store, the engine and the exposition are touched by this one thread only: ingest and
        # tick take it in turn, so no locks, and the event loop stays free to answer /metrics while a
        # tick over many engines takes a second (the handlers read bytes prepared here).
        self._pipeline = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline")

    # --- outlets (read by server.py) ---
    async def metrics_body(self, openmetrics: bool) -> bytes:
        self.exposition.scraped(openmetrics, time.monotonic())
        body = self.exposition.rendered(openmetrics)
        if body is None:  # not rendered at this tick (the first scrape, or one not expected): rendered now, on the pipeline thread
            body = await self._in_pipeline(partial(CPU.run, "render", self.exposition.render, openmetrics))
        return body

    @property
    def target(self) -> str:
        """What the report says it diagnosed."""
        return "the bundled demo capture" if self.config.demo else self.config.vllm_url_shown

    # --- pipeline ---
    def ingest(self, reading: Reading) -> None:
        self.pipeline.feed(reading)
        if self.recorder is not None:
            self.recorder.write(reading)

    def tick(self) -> Snapshot:
        snapshot = CPU.run("evaluate", self.pipeline.evaluate, self.clock())
        CPU.run("render", self.exposition.update, snapshot, time.monotonic())
        if self.snapshot is None:
            log.info("first evaluation done: ready")
        self._log_transitions(self.snapshot, snapshot)
        self.snapshot = snapshot
        return snapshot

    @staticmethod
    def _log_transitions(before: Snapshot | None, after: Snapshot) -> None:
        previous = {v.condition: v.state for v in before.verdicts} if before else {}
        for verdict in after.verdicts:
            old = previous.get(verdict.condition)
            if old is not None and old != verdict.state and "active" in (old, verdict.state):
                log.warning("condition %s: %s -> %s (%s)", verdict.condition, old, verdict.state, verdict.summary)

    async def _every(self, seconds: float, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run `body` every `seconds`; an exception is logged and the loop goes on."""
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await body()
            except Exception:
                log.exception("%s loop failed; continuing", name)
            delay = max(0.0, seconds - (time.monotonic() - started))
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

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
            if message != self.evaluation_error:
                log.exception("evaluation failed (the last good snapshot is served)")
            self.evaluation_error = message
            self.exposition.collector.evaluation_failures += 1
            self.exposition.update(self.snapshot)
        else:
            if self.evaluation_error is not None:
                log.info("evaluation recovered")
            self.evaluation_error = None

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
                delay = reading.timestamp + offset - self.clock()
                if delay > 0:
                    try:
                        await asyncio.wait_for(self._stop.wait(), timeout=delay)
                        return
                    except asyncio.TimeoutError:
                        pass
                await self._ingest(reading.shifted(offset))
            await asyncio.sleep(gap)

    async def run(self) -> None:
        config = self.config
        # A scrape arriving while the pipeline thread computes waits for the GIL: hand it over after
        # 1 ms instead of the default 5 ms.
        sys.setswitchinterval(0.001)
        runner, _ = await serve(make_app(self), config.listen_host, config.listen_port, config.max_connections, config.http_header_timeout_seconds)
        host = "127.0.0.1" if config.listen_host in ("0.0.0.0", "::", "") else config.listen_host
        print(f"vllm-triage serving on http://{host}:{config.listen_port}/", flush=True)

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: a clean exit (py-spy killed, capture closed)
            loop.add_signal_handler(sig, self._stop.set)

        tasks: list[asyncio.Task[None]] = []
        loops: list[SourceLoop] = []
        if config.demo:
            tasks.append(asyncio.create_task(self._demo_loop()))
        else:
            loops = build_sources(config, self.clock, lambda: self.pipeline.store.latest(PROCESS_SOURCE))
            for loop_ in loops:
                if loop_.name == PROCESS_SOURCE:  # first: the GPU source maps vLLM's processes to GPUs
                    await self._ingest(await loop_.collect())
            for loop_ in loops:

                async def collect(loop_: SourceLoop = loop_) -> None:
                    await self._ingest(await loop_.collect())

                tasks.append(asyncio.create_task(self._every(loop_.interval, loop_.name, collect)))
        tasks.append(asyncio.create_task(self._every(config.tick_seconds, "tick", partial(self._in_pipeline, self._tick_if_fed))))
        try:
            await self._stop.wait()
        finally:
            log.info("shutting down")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for loop_ in loops:
                await loop_.close()
            await runner.cleanup()  # before the pipeline goes: a scrape in flight may still render on it
            self._pipeline.shutdown(wait=True)
            if self.recorder is not None:
                self.recorder.close()
