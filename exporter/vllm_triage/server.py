"""HTTP outlets: /, /metrics, /healthz, /readyz, /engine-liveness, /diagnosis, /report, /report.html. Handlers read bytes prepared once
per snapshot (the text report, and a /metrics format nobody asked for before, on first request)."""

from __future__ import annotations

import asyncio
import gzip
import html
import json
import logging
import ssl
import weakref
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Generic, Protocol, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .diagnosis.conditions import CONDITIONS_BY_ID
from .model import Snapshot, diagnosis_json
from .report import format_report

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
T = TypeVar("T")
Middleware = Callable[[web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]], Awaitable[web.StreamResponse]]  # what @web.middleware wraps


class Outlets(Protocol):
    """What the daemon prepares once per tick for the handlers (/diagnosis and /report are made on request)."""

    @property
    def snapshot(self) -> Snapshot | None: ...

    @property
    def evaluation_error(self) -> str | None: ...

    @property
    def target(self) -> str: ...

    @property
    def engine_liveness_endpoint(self) -> bool: ...

    async def metrics_body(self, openmetrics: bool) -> bytes: ...

    async def report_page(self) -> bytes: ...


class _LastResult(Generic[T]):
    """`compute(key)` for the latest key, by identity: bodies and snapshots change once per tick,
    requests come as often as scrapers like (gzip for Prometheus, the text report)."""

    def __init__(self, compute: Callable[[T], bytes]) -> None:
        self._compute = compute
        self._key: T | None = None
        self._result = b""

    def __call__(self, key: T) -> bytes:
        if key is not self._key:
            self._key, self._result = key, self._compute(key)
        return self._result


BUSY_RESPONSE = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Busy(asyncio.Protocol):
    """A connection over the cap: answered 503 and closed at once, so descriptors and memory stay bounded."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(BUSY_RESPONSE)
        transport.close()


class _Counted(asyncio.Protocol):
    """aiohttp's handler for one connection, counted from its accept to its close (the server's own
    list misses connections accepted in a burst but not yet set up). Over TLS, a connection whose handshake
    never completes (a TCP probe, a port scan, plain HTTP on the TLS port) reaches neither connection_made nor
    connection_lost: asyncio's TLS layer drops this protocol. Its slot comes back when the protocol is freed, or
    at the latest when the handshake's deadline has passed (asyncio aborts the handshake by then)."""

    def __init__(self, inner: asyncio.Protocol, site: CappedTCPSite, handshake_seconds: float | None) -> None:
        self.inner, self.site = inner, site
        site.open_connections += 1
        release = self._release = weakref.finalize(self, site.release)
        self._deadline = asyncio.get_running_loop().call_later(handshake_seconds + 1.0, release) if handshake_seconds is not None else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()  # once: a finalizer runs at most once
        self.inner.connection_lost(exc)


class CappedTCPSite(web.TCPSite):
    """A TCP site that holds at most `max_connections` connections (the rest get 503): thousands of
    half-open clients otherwise took every file descriptor and /metrics stopped answering. The header
    timeout is aiohttp's keepalive_timeout, which also runs from the connection's start until its first
    request is complete (see serve())."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, max_connections: int, ssl_context: ssl.SSLContext | None = None, handshake_seconds: float = 10.0
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.max_connections = max_connections
        self.handshake_seconds = handshake_seconds
        self.open_connections = 0
        self.refused = 0

    def release(self) -> None:
        self.open_connections -= 1

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if self.open_connections >= self.max_connections:
                self.refused += 1
                return _Busy()
            return _Counted(server(), self, self.handshake_seconds if self._ssl_context is not None else None)

        self._server = await asyncio.get_running_loop().create_server(
            protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self.handshake_seconds if self._ssl_context is not None else None,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs a malformed request with a 9-line traceback; it is the client's fault: one debug line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg, record.args, record.exc_info, record.exc_text = f"bad request from a client: {error.message}", (), None, None
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


async def serve(
    app: web.Application, host: str, port: int, max_connections: int, header_timeout_seconds: float, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, CappedTCPSite]:
    """Start serving `app` (over TLS with `ssl_context`); a client must finish each request's headers within
    `header_timeout_seconds` (also the idle keep-alive time between requests)."""
    logging.getLogger("aiohttp.server").addFilter(_OneLineBadRequests())
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=header_timeout_seconds)
    await runner.setup()
    site = CappedTCPSite(runner, host, port, max_connections, ssl_context, handshake_seconds=header_timeout_seconds)
    await site.start()
    return runner, site


def make_app(outlets: Outlets, middlewares: Sequence[Middleware] = ()) -> web.Application:
    gzipped = {openmetrics: _LastResult[bytes](partial(gzip.compress, compresslevel=1)) for openmetrics in (False, True)}
    report_of = _LastResult[Snapshot](lambda snapshot: format_report(snapshot, outlets.target).encode())
    diagnosis_of = _LastResult[Snapshot](diagnosis_json)  # on request: most ticks are never asked for

    async def metrics(request: web.Request) -> web.StreamResponse:
        openmetrics = "application/openmetrics-text" in request.headers.get("Accept", "")
        body = await outlets.metrics_body(openmetrics)
        headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            headers["Content-Encoding"] = "gzip"
            body = gzipped[openmetrics](body)
        return web.Response(body=body, headers=headers)

    async def healthz(_: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.StreamResponse:
        if outlets.evaluation_error is not None:
            return web.Response(status=503, text=f"evaluation failing: {outlets.evaluation_error}\n")
        if outlets.snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        return web.Response(text="ready\n")

    async def engine_liveness(_: web.Request) -> web.StreamResponse:
        # For a liveness probe on vLLM's container: only a judged hang fails it (Condition.fails_engine_liveness:
        # engine_wedged); a sidecar starting, or a vLLM it cannot reach, never restarts vLLM: vLLM's own /health covers a
        # dead server.
        if not outlets.engine_liveness_endpoint:
            return web.Response(status=404, text="off: set engine_liveness_endpoint: true in the sidecar's config\n")
        snapshot = outlets.snapshot
        hung = next((v for v in snapshot.verdicts if v.active and CONDITIONS_BY_ID[v.condition].fails_engine_liveness), None) if snapshot else None
        if hung is not None:
            said = "; ".join(e.text for e in hung.evidence if e.holds or e.signal == "host_engine_core_stopped")
            return web.Response(status=503, text=f"{hung.condition} (cause {hung.cause}): {said}\n")
        return web.Response(text="ok\n")

    async def diagnosis(_: web.Request) -> web.StreamResponse:
        if outlets.snapshot is None:
            body = json.dumps({"status": "starting", "detail": "no evaluation yet"}).encode()
            return web.Response(status=503, body=body, content_type="application/json")
        return web.Response(body=diagnosis_of(outlets.snapshot), content_type="application/json")

    async def report(_: web.Request) -> web.StreamResponse:
        snapshot = outlets.snapshot
        if snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        return web.Response(body=report_of(snapshot), content_type="text/plain", charset="utf-8")

    async def report_page(_: web.Request) -> web.StreamResponse:
        if outlets.snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        return web.Response(body=await outlets.report_page(), content_type="text/html", charset="utf-8")

    async def index(_: web.Request) -> web.StreamResponse:
        return web.Response(text=landing_page(outlets.snapshot), content_type="text/html")

    app = web.Application(middlewares=list(middlewares))  # type: ignore[arg-type]  # aiohttp's own alias is looser
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/engine-liveness", engine_liveness)
    app.router.add_get("/diagnosis", diagnosis)
    app.router.add_get("/report", report)
    app.router.add_get("/report.html", report_page)
    return app


def landing_page(snapshot: Snapshot | None) -> str:
    rows = ""
    if snapshot is not None:
        for v in snapshot.verdicts:
            rows += f"<tr><td>{html.escape(v.condition)}</td><td>{v.state}</td><td>{v.severity}</td><td>{html.escape(v.summary)}</td></tr>"
    status = "" if snapshot is not None else "<p>Starting: no evaluation yet.</p>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>vllm-triage</title></head>
<body><h1>vllm-triage</h1>
<p>Why is this vLLM slow? Endpoints:</p>
<ul>
<li><a href="metrics">/metrics</a> Prometheus metrics (OpenMetrics when asked)</li>
<li><a href="diagnosis">/diagnosis</a> every condition with state, evidence and next actions (JSON)</li>
<li><a href="report">/report</a> the same as a report to read (what <code>vllm-triage diagnose</code> prints)</li>
<li><a href="report.html">/report.html</a> the incident page of the last minutes: the verdicts over the three layers' plots</li>
<li><a href="healthz">/healthz</a> process alive, <a href="readyz">/readyz</a> first evaluation done</li>
<li><a href="engine-liveness">/engine-liveness</a> 503 while vLLM's engine is hung (engine_wedged; opt-in: engine_liveness_endpoint)</li>
</ul>{status}
<table border="1" cellpadding="4"><tr><th>condition</th><th>state</th><th>severity</th><th>summary</th></tr>{rows}</table>
</body></html>
"""
