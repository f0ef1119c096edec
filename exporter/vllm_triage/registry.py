"""The sources the sidecar can run, one entry each: its name, how it is built (and at what cadence), its
signal table, the scopes they are computed in, how they are exported, and whether its last reading is
exported as read. The daemon, the config's `sources` setting, the engine, the snapshot and /metrics read
this table: adding a source is an entry here plus its module in sources/ and its table in signals/."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from .config import Config
from .cpu_account import CPU
from .model import GIL_SOURCE, GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE, ProcessTargets, Reading
from .signals.gpu import GPU_SIGNALS
from .signals.host import GIL_SIGNALS, HOST_SIGNALS
from .signals.vllm import VLLM_SAMPLES_READ, VLLM_SIGNALS
from .signals.window import SignalDef
from .sources.dcgm import DcgmSource
from .sources.gil import GilSource
from .sources.gpu import GpuSource
from .sources.process import ProcessSource
from .sources.vllm import VllmSource

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True)
class SourceLoop:
    """One source as the daemon runs it: collect every `interval` seconds, close at the end."""

    name: str
    interval: float
    collect: Callable[[], Awaitable[Reading]]
    close: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class SourceSpec:
    name: str
    build: Callable[[Config, Clock, ProcessTargets], SourceLoop]
    signals: tuple[SignalDef, ...]
    # "engine" and "gpu": computed per engine / GPU and for their aggregate; "host": once, over vLLM's
    # processes by role (the host scope holds every such table's signals)
    scope_kind: Literal["engine", "gpu", "host"]
    exported_as: str  # its windowed signals are vllm_triage_<exported_as><family>{<scope_labels>, ...}
    scope_labels: tuple[str, ...] = ()
    lookback_seconds: float = 0.0  # its window (and history) is at least this long
    exports_latest: bool = False  # its last reading is exported as read (vllm_triage_<name>_*), like dcgm-exporter


async def every(seconds: float, name: str, body: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    """Run `body` every `seconds` until `stop` is set; an exception is logged and the loop goes on."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            await body()
        except Exception:
            log.exception("%s loop failed; continuing", name)
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds - (time.monotonic() - started)))
        except asyncio.TimeoutError:
            pass


async def start_sources(loops: list[SourceLoop], ingest: Callable[[Reading], Awaitable[None]], stop: asyncio.Event) -> asyncio.Task[None]:
    """The one scheduler of the sources (the daemon's and `record`'s): the process source is read once first, before
    this returns (the GPU source maps vLLM's processes to their GPUs); the task returned runs each source on its own
    interval until `stop`."""
    for loop_ in loops:
        if loop_.name == PROCESS_SOURCE:
            await ingest(await loop_.collect())

    async def collect(loop_: SourceLoop) -> None:
        await ingest(await loop_.collect())

    async def run() -> None:
        await asyncio.gather(*(every(loop_.interval, loop_.name, partial(collect, loop_), stop) for loop_ in loops))

    return asyncio.create_task(run())


async def _nothing() -> None:
    return None


def _vllm(config: Config, clock: Clock, _: ProcessTargets) -> SourceLoop:
    source = VllmSource(
        config.vllm_url,
        config.metrics_path,
        config.scrape_timeout_seconds,
        config.connect_timeout_seconds,
        config.max_page_bytes,
        clock,
        config.max_series,
        config.max_engines,
        config.max_label_value_length,
        VLLM_SAMPLES_READ,
    )
    return SourceLoop(VLLM_SOURCE, config.scrape_interval_seconds, source.collect, source.close)


def _process(config: Config, clock: Clock, _: ProcessTargets) -> SourceLoop:
    source = ProcessSource(config.vllm_port, config.process_title_prefix, clock)  # psutil blocks: a worker thread
    return SourceLoop(PROCESS_SOURCE, config.process_interval_seconds, partial(asyncio.to_thread, CPU.run, "process_collect", source.collect), _nothing)


def _gil(config: Config, clock: Clock, targets: ProcessTargets) -> SourceLoop:
    source = GilSource(targets, config.gil_window_seconds, config.gil_rate, config.gil_nonblocking, clock=clock)
    return SourceLoop(GIL_SOURCE, config.gil_interval_seconds, source.collect, source.close)


def _gpu(config: Config, clock: Clock, targets: ProcessTargets) -> SourceLoop:
    if config.gpu_source == "dcgm":
        assert config.dcgm_url is not None  # config.load requires it
        dcgm = DcgmSource(config.dcgm_url, config.scrape_timeout_seconds, clock, max_page_bytes=config.max_page_bytes)
        return SourceLoop(GPU_SOURCE, config.gpu_interval_seconds, dcgm.collect, dcgm.close)
    source = GpuSource(config.gpus, targets, config.gpm, clock, gpus_file=config.gpus_file)

    async def close() -> None:
        source.close()

    return SourceLoop(GPU_SOURCE, config.gpu_interval_seconds, partial(asyncio.to_thread, CPU.run, "gpu_collect", source.collect), close)  # NVML blocks


SOURCES: tuple[SourceSpec, ...] = (
    SourceSpec(VLLM_SOURCE, _vllm, VLLM_SIGNALS, "engine", "vllm_", ("engine", "model_name")),
    SourceSpec(PROCESS_SOURCE, _process, HOST_SIGNALS, "host", "process_window_", exports_latest=True),
    SourceSpec(GPU_SOURCE, _gpu, GPU_SIGNALS, "gpu", "gpu_window_", ("gpu",), exports_latest=True),
    # py-spy windows come minutes apart: the latest one stays evidence for 3 minutes
    SourceSpec(GIL_SOURCE, _gil, GIL_SIGNALS, "host", "process_window_", lookback_seconds=180.0, exports_latest=True),
)
SOURCES_BY_NAME = {s.name: s for s in SOURCES}


def build_sources(config: Config, clock: Clock, targets: ProcessTargets) -> list[SourceLoop]:
    """The configured sources, in the table's order (the process source first: the GIL and GPU sources sample the
    processes it lists, handed over in `targets`)."""
    return [spec.build(config, clock, targets) for spec in SOURCES if spec.name in config.sources]
