"""The only code that touches the monitored system: one module per source, and what the HTTP ones share."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the GIL and process sources run where aiohttp may not be installed (py-spy as another user)
    import aiohttp


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
