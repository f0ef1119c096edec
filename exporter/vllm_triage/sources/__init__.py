"""The only code that touches the monitored system: one module per source, named as the source is in the catalog
(catalog.py), each with its `build(config, clock, targets) -> SourceLoop` (how the daemon runs it); and what the HTTP
ones share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the GIL and process sources run where aiohttp may not be installed (py-spy as another user)
    import aiohttp

    from ..config import Config
    from ..model import ProcessTargets, Reading

Clock = Callable[[], float]


@dataclass(frozen=True)
class SourceLoop:
    """One source as the daemon runs it: collect every `interval` seconds, close at the end."""

    name: str
    interval: float
    collect: Callable[[], Awaitable[Reading]]
    close: Callable[[], Awaitable[None]]


# What each source's module defines as `build`: its SourceLoop from the config, the clock its readings are stamped
# with, and the processes the process source lists (which the GIL and GPU sources sample).
Builder = Callable[["Config", Clock, "ProcessTargets"], SourceLoop]


async def nothing_to_close() -> None:
    return None


async def read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes | None:
    """The whole body, as many pieces as it comes in (a server that flushes every 4 KiB, as Go's net/http does);
    None once it grows past `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def http_failure(error: BaseException) -> str:
    """What went wrong with an HTTP request, in words: aiohttp's own texts say nothing for a timeout ('') or a
    redirect loop ("0, message=''")."""
    import aiohttp  # here, not at the top: see above

    if isinstance(error, aiohttp.TooManyRedirects):
        hops = len(error.history)
        return f"a redirect loop: {hops} redirects, the last to {error.request_info.real_url.with_query(None)} (point the URL at the page itself)"
    if isinstance(error, TimeoutError):
        return "no answer before the timeout (it accepted the connection, then sent nothing, or too slowly)"
    if isinstance(error, aiohttp.ClientResponseError):
        return f"HTTP {error.status} {error.message}".strip()
    return str(error) or type(error).__name__


def shortened(text: object, limit: int = 300) -> str:
    """A parser's message as logs and /diagnosis show it: it quotes the offending line, which may be megabytes."""
    said = str(text)
    return said if len(said) <= limit else f"{said[:limit]}... ({len(said)} characters)"
