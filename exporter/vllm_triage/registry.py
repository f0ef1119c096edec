"""The one scheduler of the sources (the daemon's and `record`'s), and how the configured ones are built: each by the
`build` of its own module in sources/, named as the catalog names the source (catalog.py)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import cast

from . import sources
from .catalog import CATALOG
from .config import Config
from .model import PROCESS_SOURCE, ProcessTargets, Reading
from .sources import Builder, Clock, SourceLoop

log = logging.getLogger(__name__)


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


def builder(name: str) -> Builder:
    """The `build` of the source's module, sources/<name>.py, imported when the source is first built."""
    return cast("Builder", importlib.import_module(f"{sources.__name__}.{name}").build)


def build_sources(config: Config, clock: Clock, targets: ProcessTargets) -> list[SourceLoop]:
    """The configured sources, in the catalog's order (the process source first: the GIL and GPU sources sample the
    processes it lists, handed over in `targets`)."""
    return [builder(entry.name)(config, clock, targets) for entry in CATALOG if entry.name in config.sources]
