"""HTTP outlets: /, /metrics, /healthz, /readyz, /diagnosis, /report. Handlers read bytes prepared once
per snapshot (the text report, and a /metrics format nobody asked for before, on first request)."""

from __future__ import annotations

import gzip
import html
import json
from collections.abc import Callable
from functools import partial
from typing import Generic, Protocol, TypeVar

from aiohttp import web

from .model import Snapshot
from .report import format_report

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
T = TypeVar("T")


class Outlets(Protocol):
    """What the daemon prepares once per tick for the handlers."""

    snapshot: Snapshot | None
    diagnosis_json: bytes

    @property
    def target(self) -> str: ...

    async def metrics_body(self, openmetrics: bool) -> bytes: ...


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


def make_app(outlets: Outlets) -> web.Application:
    gzipped = {openmetrics: _LastResult[bytes](partial(gzip.compress, compresslevel=1)) for openmetrics in (False, True)}
    report_of = _LastResult[Snapshot](lambda snapshot: format_report(snapshot, outlets.target).encode())

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
        if outlets.snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        return web.Response(text="ready\n")

    async def diagnosis(_: web.Request) -> web.StreamResponse:
        if outlets.snapshot is None:
            body = json.dumps({"status": "starting", "detail": "no evaluation yet"}).encode()
            return web.Response(status=503, body=body, content_type="application/json")
        return web.Response(body=outlets.diagnosis_json, content_type="application/json")

    async def report(_: web.Request) -> web.StreamResponse:
        snapshot = outlets.snapshot
        if snapshot is None:
            return web.Response(status=503, text="starting: no evaluation yet\n")
        return web.Response(body=report_of(snapshot), content_type="text/plain", charset="utf-8")

    async def index(_: web.Request) -> web.StreamResponse:
        return web.Response(text=landing_page(outlets.snapshot), content_type="text/html")

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/diagnosis", diagnosis)
    app.router.add_get("/report", report)
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
<li><a href="healthz">/healthz</a> process alive, <a href="readyz">/readyz</a> first evaluation done</li>
</ul>{status}
<table border="1" cellpadding="4"><tr><th>condition</th><th>state</th><th>severity</th><th>summary</th></tr>{rows}</table>
</body></html>
"""
