"""How each source of the catalog (catalog.py) is built from the config, at its cadence, and the one scheduler that
runs them: the daemon's and `record`'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from .catalog import CATALOG
from .config import Config
from .cpu_account import CPU
from .model import GIL_SOURCE, GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE, ProcessTargets, Reading
from .signals.vllm import VLLM_SAMPLES_READ
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


Builder = Callable[[Config, Clock, ProcessTargets], SourceLoop]
BUILDERS: dict[str, Builder] = {VLLM_SOURCE: _vllm, PROCESS_SOURCE: _process, GPU_SOURCE: _gpu, GIL_SOURCE: _gil}


def build_sources(config: Config, clock: Clock, targets: ProcessTargets) -> list[SourceLoop]:
    """The configured sources, in the catalog's order (the process source first: the GIL and GPU sources sample the
    processes it lists, handed over in `targets`)."""
    return [BUILDERS[entry.name](config, clock, targets) for entry in CATALOG if entry.name in config.sources]
