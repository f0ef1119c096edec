"""The vLLM source against misbehaving HTTP servers on loopback: every failure becomes a Reading
with a bounded reason, never an exception, and recovery is seen on the next scrape."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from vllm_triage.sources.vllm import VllmSource

from harness.vllm_server import serving

from .pages import Counters, page

GOOD = page(2, 0, 0.3, Counters())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _with_server(handler: Callable[[web.Request], Awaitable[web.StreamResponse]], body):
    app = web.Application()
    app.router.add_get("/metrics", handler)

    async def version(_: web.Request) -> web.StreamResponse:
        return web.json_response({"version": "0.32.0"})

    app.router.add_get("/version", version)
    return await serving(app, body)


def scrape(handler, timeout: float = 5.0, max_bytes: int = 10 * 1024 * 1024, times: int = 1):
    async def body(url: str):
        source = VllmSource(url, "/metrics", timeout, 1.0, max_bytes)
        try:
            return [await source.collect() for _ in range(times)]
        finally:
            await source.close()

    return asyncio.run(_with_server(handler, body))


def test_good_page_gives_samples_and_the_version():
    async def handler(_):
        return web.Response(text=GOOD)

    (reading,) = scrape(handler)
    assert reading.ok and reading.error_reason is None
    assert reading.meta["version"] == "0.32.0"
    assert any(name == "vllm:num_requests_running" for name, _ in reading.samples)


def test_http_500_is_reported():
    async def handler(_):
        return web.Response(status=500, text="boom")

    (reading,) = scrape(handler)
    assert not reading.ok and reading.error_reason == "http_status"
    assert "HTTP 500" in (reading.error or "")


def test_garbage_is_reported_as_a_parse_error():
    async def handler(_):
        return web.Response(text="<html>this is a login page</html>\n{{{\n")

    (reading,) = scrape(handler)
    assert not reading.ok and reading.error_reason in ("parse", "no_vllm_metrics")


def test_a_page_over_the_cap_is_refused():
    huge = GOOD + "".join(f'vllm:junk{{i="{i}"}} 1\n' for i in range(20000))

    async def handler(_):
        return web.Response(text=huge)

    (reading,) = scrape(handler, max_bytes=64 * 1024)
    assert not reading.ok and reading.error_reason == "too_large"
    assert "max_page_bytes" in (reading.error or "")


def test_a_page_with_an_exploding_label_is_refused_naming_the_limit():
    exploding = GOOD + "".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n' for i in range(20000))

    async def handler(_):
        return web.Response(text=exploding)

    (reading,) = scrape(handler)
    assert not reading.ok and reading.error_reason == "too_many_series"
    counted = re.search(r"the page has (\d+) vllm: series, over the 15000 limit \(max_series\)", reading.error or "")
    assert counted and 20000 < int(counted[1]) < 20100, reading.error


def test_more_engines_than_the_limit_are_refused_and_up_to_it_judged():
    def engines(n: int) -> str:
        return "".join(page(2, 0, 0.3, Counters(), engine=str(e)).replace("# TYPE", "# IGNORED") for e in range(n))

    async def handler(request):
        return web.Response(text=engines(int(request.query["n"])))

    async def body(url: str):
        out = []
        for n in (32, 33):
            source = VllmSource(url, f"/metrics?n={n}", 5.0, 1.0, 10 << 20)
            out.append(await source.collect())
            await source.close()
        return out

    judged, refused = asyncio.run(_with_server(handler, body))
    assert judged.ok and len({labels for name, labels in judged.samples if name == "vllm:num_requests_running"}) == 32
    assert not refused.ok and refused.error_reason == "too_many_engines"
    assert "33 engine/model label combinations" in (refused.error or "") and "max_engines" in (refused.error or "")


def test_a_streamed_page_over_the_cap_is_refused_without_reading_it_all():
    async def handler(request):
        response = web.StreamResponse()  # chunked: no Content-Length to judge by
        await response.prepare(request)
        for _ in range(100):
            await response.write(b"# " + b"x" * 10000 + b"\n")
        return response

    (reading,) = scrape(handler, max_bytes=64 * 1024)
    assert not reading.ok and reading.error_reason == "too_large"


def test_a_hanging_vllm_times_out():
    async def handler(_):
        await asyncio.sleep(5)
        return web.Response(text=GOOD)

    (reading,) = scrape(handler, timeout=0.5)
    assert not reading.ok and reading.error_reason == "timeout"
    assert reading.duration_seconds < 2


def test_a_truncated_page_is_reported():
    async def handler(request):
        response = web.StreamResponse(headers={"Content-Length": str(len(GOOD) + 500)})
        await response.prepare(request)
        await response.write(GOOD[:200].encode())
        request.transport.close()  # the server dies mid-page
        return response

    (reading,) = scrape(handler)
    assert not reading.ok and reading.error_reason in ("truncated", "connect")


def test_connection_refused_is_reported():
    async def body():
        source = VllmSource(f"http://127.0.0.1:{free_port()}", "/metrics", 1.0, 1.0, 1 << 20)
        try:
            return await source.collect()
        finally:
            await source.close()

    reading = asyncio.run(body())
    assert not reading.ok and reading.error_reason == "connect"
    assert "cannot reach" in (reading.error or "")


def test_recovery_after_failures():
    calls = {"n": 0}

    async def handler(_):
        calls["n"] += 1
        if calls["n"] == 1:
            return web.Response(status=503)
        return web.Response(text=GOOD)

    first, second = scrape(handler, times=2)
    assert not first.ok and second.ok


def test_a_redirect_loop_is_named():
    async def handler(request):
        raise web.HTTPFound("/metrics")

    (reading,) = scrape(handler)
    assert not reading.ok and reading.error_reason == "http"
    assert "a redirect loop: 10 redirects, the last to http://127.0.0.1:" in (reading.error or "") and "message=''" not in (reading.error or ""), reading.error
