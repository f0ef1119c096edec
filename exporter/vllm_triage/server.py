"""HTTP outlets: /, /metrics, /healthz, /readyz, /engine-liveness, /diagnosis, /report, /report.html, /bundle.tar.gz. Handlers read bytes prepared once
per snapshot (the text report, and a /metrics format nobody asked for before, on first request)."""

from __future__ import annotations

import asyncio
import gzip
import html
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Generic, Protocol, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .diagnosis.conditions import CONDITIONS_BY_ID
from .model import Snapshot, diagnosis_json
from .report import format_report, headline

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

    async def bundle_archive(self) -> bytes: ...


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
PROBE_PATHS = ("/healthz", "/readyz", "/engine-liveness")
# Over the cap, a connection still gets PROBE_LANE_SECONDS to send a probe's request line: the kubelet's probes are
# answered from the state the handlers read, without aiohttp, so idle half-requests holding every slot cannot fail
# vLLM's liveness probe. The lane is bounded too (descriptors), but each of its connections lives 2 s at most.
PROBE_LANE_MAX = 512
PROBE_LANE_SECONDS = 2.0
REQUEST_LINE_MAX = 2048
FIRST_BYTE_SECONDS = 5.0  # a connection that sends nothing for this long is closed (a slow client sends its first line at once)
ProbeAnswer = Callable[[str], tuple[int, str]]  # path -> (status, text)


def _http_response(status: int, text: str) -> bytes:
    body = text.encode()
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}.get(status, "Error")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


class _ProbeLane(asyncio.Protocol):
    """A connection over the cap: a probe is answered, anything else gets 503; either way it is closed at once."""

    def __init__(self, answer: ProbeAnswer, paths: frozenset[str]) -> None:
        self.answer, self.paths = answer, paths
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.deadline = asyncio.get_running_loop().call_later(PROBE_LANE_SECONDS, self._reply, BUSY_RESPONSE)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        line, found, _ = self.buffer.partition(b"\r\n")
        if not found:
            if len(self.buffer) > REQUEST_LINE_MAX:
                self._reply(BUSY_RESPONSE)
            return
        method, _, rest = line.decode("latin-1").partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method in ("GET", "HEAD") and path in self.paths:
            self._reply(_http_response(*self.answer(path)))
        else:
            self._reply(BUSY_RESPONSE)

    def _reply(self, response: bytes) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()


class _Slot(asyncio.Protocol):
    """One accepted connection, counted from its accept to its close, in front of `inner` (aiohttp's handler, or the
    probe lane). Over TLS the handshake runs here (loop.start_tls), so an aborted or failed handshake gives the slot back
    the moment it fails: with create_server(ssl=...) asyncio dropped the protocol without a call, and the slot waited for
    the handshake deadline. A connection that sends nothing within FIRST_BYTE_SECONDS is closed."""

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None], tls: ssl.SSLContext | None, handshake_seconds: float) -> None:
        self.inner, self._release, self.tls, self.handshake_seconds = inner, release, tls, handshake_seconds
        self.released = False
        self.started = False  # inner.connection_made called
        self.early: list[bytes | None] = []  # what TLS delivered before inner was started (None: end of file)
        self.transport: asyncio.BaseTransport | None = None
        self.silence: asyncio.TimerHandle | None = None
        self.handshake: asyncio.Task[None] | None = None

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._release()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.silence = asyncio.get_running_loop().call_later(FIRST_BYTE_SECONDS, self._silent)
        if self.tls is None:
            self._start(transport)
        else:
            self.handshake = asyncio.ensure_future(self._secure(transport))

    async def _secure(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) and self.tls is not None
        try:
            secure = await asyncio.get_running_loop().start_tls(transport, self, self.tls, server_side=True, ssl_handshake_timeout=self.handshake_seconds)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError, RuntimeError):
            transport.abort()
            self._stop_silence()
            self.release()
            return
        if secure is None:  # the connection closed as the handshake ended
            self.release()
            return
        self.transport = secure
        self._start(secure)

    def _start(self, transport: asyncio.BaseTransport) -> None:
        self.started = True
        self.inner.connection_made(transport)
        for data in self.early:
            if data is None:
                self.inner.eof_received()
            else:
                self.inner.data_received(data)
        self.early = []

    def _silent(self) -> None:
        if isinstance(self.transport, asyncio.Transport) and not self.transport.is_closing():
            self.transport.abort()

    def _stop_silence(self) -> None:
        if self.silence is not None:
            self.silence.cancel()
            self.silence = None

    def data_received(self, data: bytes) -> None:
        self._stop_silence()
        if self.started:
            self.inner.data_received(data)
        else:
            self.early.append(data)

    def eof_received(self) -> bool | None:
        if self.started:
            return self.inner.eof_received()
        self.early.append(None)
        return None

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_silence()
        self.release()
        if self.started:
            self.inner.connection_lost(exc)


class CappedTCPSite(web.TCPSite):
    """A TCP site that holds at most `max_connections` connections: thousands of half-open clients otherwise took every
    file descriptor and /metrics stopped answering. Over the cap, probes are still answered (the probe lane) and the rest
    get 503. The header timeout is aiohttp's keepalive_timeout, which also runs from the connection's start until its
    first request is complete (see serve())."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        max_connections: int,
        ssl_context: ssl.SSLContext | None = None,
        handshake_seconds: float = 10.0,
        probe: tuple[ProbeAnswer, frozenset[str]] | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        super().__init__(runner, host, port)
        self.sock = sock  # a listening socket to serve on instead of binding host:port (a reload hands it over)
        self.tls = ssl_context
        self.max_connections = max_connections
        self.handshake_seconds = handshake_seconds
        self.probe = probe
        self.open_connections = 0
        self.lane_connections = 0
        self.refused = 0

    def release(self) -> None:
        self.open_connections -= 1

    def _lane_release(self) -> None:
        self.lane_connections -= 1

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if self.open_connections < self.max_connections:
                self.open_connections += 1
                return _Slot(server(), self.release, self.tls, self.handshake_seconds)
            self.refused += 1
            if self.probe is None or self.lane_connections >= PROBE_LANE_MAX:
                return _Busy(self.tls is not None)
            self.lane_connections += 1
            return _Slot(_ProbeLane(*self.probe), self._lane_release, self.tls, min(self.handshake_seconds, PROBE_LANE_SECONDS))

        loop = asyncio.get_running_loop()
        if self.sock is not None:
            self._server = await loop.create_server(protocol, sock=self.sock, backlog=self._backlog)
        else:
            self._server = await loop.create_server(
                protocol, self._host, self._port, backlog=self._backlog, reuse_address=self._reuse_address, reuse_port=self._reuse_port
            )

    def listening_socket(self) -> socket.socket | None:
        """A duplicate of the one socket the site listens on (None for several): its queue of connections outlives this
        site, so a new site can take over without refusing or resetting any."""
        sockets = self._server.sockets if isinstance(self._server, asyncio.Server) else ()
        return sockets[0].dup() if len(sockets) == 1 else None


class _Busy(asyncio.Protocol):
    """A connection over the cap and the probe lane's: answered 503 (closed unanswered over TLS: no handshake is spent
    on it) and closed at once, so descriptors and memory stay bounded."""

    def __init__(self, tls: bool) -> None:
        self.tls = tls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if not self.tls:
            transport.write(BUSY_RESPONSE)
        transport.close()


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
    app: web.Application,
    host: str,
    port: int,
    max_connections: int,
    header_timeout_seconds: float,
    ssl_context: ssl.SSLContext | None = None,
    probe: tuple[ProbeAnswer, frozenset[str]] | None = None,
    sock: socket.socket | None = None,
) -> tuple[web.AppRunner, CappedTCPSite]:
    """Start serving `app` (over TLS with `ssl_context`); a client must finish each request's headers within
    `header_timeout_seconds` (also the idle keep-alive time between requests). Over the connection cap, `probe`
    answers its paths (the probe lane)."""
    logging.getLogger("aiohttp.server").addFilter(_OneLineBadRequests())
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=header_timeout_seconds)
    await runner.setup()
    site = CappedTCPSite(runner, host, port, max_connections, ssl_context, handshake_seconds=header_timeout_seconds, probe=probe, sock=sock)
    await site.start()
    return runner, site


def probe_answer(outlets: Outlets, path: str) -> tuple[int, str]:
    """/healthz, /readyz and /engine-liveness: (status, text), for the handlers and the probe lane alike."""
    if path == "/readyz":
        if outlets.evaluation_error is not None:
            return 503, f"evaluation failing: {outlets.evaluation_error}\n"
        if outlets.snapshot is None:
            return 503, "starting: no evaluation yet\n"
        return 200, "ready\n"
    if path == "/engine-liveness":
        # For a liveness probe on vLLM's container: only a judged hang fails it (Condition.fails_engine_liveness:
        # engine_wedged); a sidecar starting, or a vLLM it cannot reach, never restarts vLLM: vLLM's own /health covers a
        # dead server.
        if not outlets.engine_liveness_endpoint:
            return 404, "off: set engine_liveness_endpoint: true in the sidecar's config\n"
        snapshot = outlets.snapshot
        hung = next((v for v in snapshot.verdicts if v.active and CONDITIONS_BY_ID[v.condition].fails_engine_liveness), None) if snapshot else None
        if hung is not None:
            said = "; ".join(e.text for e in hung.evidence if e.holds or e.signal == "host_engine_core_stopped")
            return 503, f"{hung.condition} (cause {hung.cause}): {said}\n"
    return 200, "ok\n"


def make_app(outlets: Outlets, middlewares: Sequence[Middleware] = ()) -> web.Application:
    gzipped = {openmetrics: _LastResult[bytes](partial(gzip.compress, compresslevel=1)) for openmetrics in (False, True)}

    def report_text(verbose: bool, snapshot: Snapshot) -> bytes:
        return format_report(snapshot, outlets.target, verbose).encode()

    report_of = {verbose: _LastResult[Snapshot](partial(report_text, verbose)) for verbose in (False, True)}
    diagnosis_of = _LastResult[Snapshot](diagnosis_json)  # on request: most ticks are never asked for

    async def metrics(request: web.Request) -> web.StreamResponse:
        openmetrics = "application/openmetrics-text" in request.headers.get("Accept", "")
        body = await outlets.metrics_body(openmetrics)
        headers = {"Content-Type": OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            headers["Content-Encoding"] = "gzip"
            body = gzipped[openmetrics](body)
        return web.Response(body=body, headers=headers)

    async def probe(request: web.Request) -> web.StreamResponse:
        status, text = probe_answer(outlets, request.path)
        return web.Response(status=status, text=text)

    async def diagnosis(_: web.Request) -> web.StreamResponse:
        if outlets.snapshot is None:
            body = json.dumps({"status": "starting", "detail": "no evaluation yet"}).encode()
            return web.Response(status=503, body=body, content_type="application/json")
        return web.Response(body=diagnosis_of(outlets.snapshot), content_type="application/json")

    async def report(request: web.Request) -> web.StreamResponse:
        snapshot = outlets.snapshot
        if snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        verbose = request.query.get("verbose", "") not in ("", "0", "false")
        return web.Response(body=report_of[verbose](snapshot), content_type="text/plain", charset="utf-8")

    async def report_page(_: web.Request) -> web.StreamResponse:
        if outlets.snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        return web.Response(body=await outlets.report_page(), content_type="text/html", charset="utf-8")

    async def bundle(_: web.Request) -> web.StreamResponse:
        if outlets.snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        try:
            body = await outlets.bundle_archive()
        except RuntimeError:  # the pipeline thread is shut down: a reload is replacing the daemon
            return web.Response(status=503, text="reloading the configuration: ask again\n", headers={"Retry-After": "5"})
        headers = {"Content-Disposition": 'attachment; filename="vllm-triage-bundle.tar.gz"'}
        return web.Response(body=body, content_type="application/gzip", headers=headers)

    async def index(_: web.Request) -> web.StreamResponse:
        return web.Response(text=landing_page(outlets.snapshot, outlets.target), content_type="text/html")

    app = web.Application(middlewares=list(middlewares))  # type: ignore[arg-type]  # aiohttp's own alias is looser
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    for path in PROBE_PATHS:
        app.router.add_get(path, probe)
    app.router.add_get("/diagnosis", diagnosis)
    app.router.add_get("/report", report)
    app.router.add_get("/report.html", report_page)
    app.router.add_get("/bundle.tar.gz", bundle)
    return app


LANDING_REFRESH_SECONDS = 15


def landing_page(snapshot: Snapshot | None, target: str = "") -> str:
    """The primary verdict first (the report's first screen), then the links, then every condition; reloads itself."""
    rows = ""
    if snapshot is not None:
        order = {"active": 0, "unknown": 1, "inactive": 2}
        for v in sorted(snapshot.verdicts, key=lambda v: (order.get(v.state, 3), v.condition)):
            rows += f"<tr><td>{html.escape(v.condition)}</td><td>{v.state}</td><td>{v.severity}</td><td>{html.escape(v.summary)}</td></tr>"
    status = f"<pre>{html.escape(chr(10).join(headline(snapshot, target)))}</pre>" if snapshot is not None else "<p>Starting: no evaluation yet.</p>"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{LANDING_REFRESH_SECONDS}"><title>vllm-triage</title></head>
<body><h1>vllm-triage</h1>
{status}
<p>Why is this vLLM slow? Endpoints:</p>
<ul>
<li><a href="metrics">/metrics</a> Prometheus metrics (OpenMetrics when asked)</li>
<li><a href="diagnosis">/diagnosis</a> every condition with state, evidence and next actions (JSON)</li>
<li><a href="report">/report</a> the same as a report to read (what <code>vllm-triage diagnose</code> prints)</li>
<li><a href="report.html">/report.html</a> the incident page of the last minutes: the verdicts over the three layers' plots</li>
<li><a href="bundle.tar.gz">/bundle.tar.gz</a> the incident bundle of this moment: the window's capture, the verdicts, the stacks</li>
<li><a href="healthz">/healthz</a> process alive, <a href="readyz">/readyz</a> first evaluation done</li>
<li><a href="engine-liveness">/engine-liveness</a> 503 while vLLM's engine is hung (engine_wedged; opt-in: engine_liveness_endpoint)</li>
</ul>
<table border="1" cellpadding="4"><tr><th>condition</th><th>state</th><th>severity</th><th>summary</th></tr>{rows}</table>
</body></html>
"""
