"""The Prometheus history source against answers no real Prometheus should give (an aiohttp fake): too big to
read, or of the wrong shape. Each ends in one sentence naming what is wrong, never a traceback or an unbounded read."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from vllm_triage.sources.prometheus import HistoryError, HistoryLimits, PrometheusHistory

from harness.vllm_server import serving

GOOD = {"__name__": "vllm:num_requests_running", "engine": "0", "model_name": "m"}


async def _said_by(handler, limits: HistoryLimits) -> str:
    """What the history source says of a Prometheus whose query API answers with `handler`."""

    async def said(url: str) -> str:
        try:
            await PrometheusHistory(url, "", limits).readings(1796000000.0, 1796000060.0)
        except HistoryError as error:
            return str(error)
        return ""

    app = web.Application()
    app.router.add_post("/api/v1/query_range", handler)
    app.router.add_post("/api/v1/query", handler)
    return await serving(app, said)


async def _ask(answer: bytes, limits: HistoryLimits) -> str:
    async def query_range(_: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(_)
        for offset in range(0, len(answer), 65536):  # in pieces, as a real server streams a large answer
            await response.write(answer[offset : offset + 65536])
        await response.write_eof()
        return response

    return await _said_by(query_range, limits)


def ask(answer: object, limits: HistoryLimits | None = None) -> str:
    body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    return asyncio.run(_ask(body, limits or HistoryLimits()))


def matrix(*series: dict) -> dict:
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}


def test_an_answer_over_the_byte_limit_is_refused_before_it_is_parsed():
    huge = matrix(*({"metric": {**GOOD, "engine": str(i)}, "values": [[1796000000, "1"]]} for i in range(20_000)))
    assert len(json.dumps(huge)) > 2 * 1024 * 1024
    said = ask(huge, HistoryLimits(max_answer_bytes=1024 * 1024))
    assert said.startswith("Prometheus' answer is over 1 MiB: narrow --selector"), said


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "success"},  # no data
        {"status": "success", "data": {"result": {"not": "a list"}}},  # a dict result
        matrix({"metric": GOOD}),  # no values
        matrix({"values": [[1796000000, "1"]]}),  # no metric
        b"<html>not JSON</html>",
    ],
)
def test_an_answer_of_the_wrong_shape_is_named_in_one_sentence(answer):
    said = ask(answer)
    assert said.startswith("Prometheus at http://127.0.0.1:") and ("shape" in said or "not its JSON API" in said), said


def test_odd_points_and_series_are_skipped_not_raised():
    """All-NaN series, string values, nulls, short points, a series without __name__: what can be read is read."""
    odd = matrix(
        {"metric": GOOD, "values": [[1796000000, "NaN"], [1796000002, "x"], [1796000004, None], [1796000006], "nope"]},
        {"metric": {"engine": "0"}, "values": [[1796000000, "1"]]},
    )
    said = ask(odd)
    assert "Traceback" not in said  # either readings or a sentence naming what is missing


def test_fleet_quotes_label_values_into_promql():
    """A pod or namespace label holding a quote or a backslash stays one PromQL string, not a spliced query."""
    from vllm_triage.fleet import target_matchers

    assert target_matchers({"namespace": "llm", "pod": "vllm-0", "instance": "10.0.0.1:8000"}) == 'namespace="llm",pod="vllm-0",instance="10.0.0.1:8000"'
    assert target_matchers({"pod": 'a",job=~".+'}) == 'pod="a\\",job=~\\".+"'
    assert target_matchers({"pod": "back\\slash"}) == 'pod="back\\\\slash"'


def test_a_redirect_loop_and_a_slow_drip_are_named_not_left_blank():
    """aiohttp says "0, message=''" for a redirect loop and nothing for a timeout: the message names what happened."""

    async def loop(request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(str(request.url))  # 307 keeps the POST: it comes back here, again and again

    said = asyncio.run(_said_by(loop, HistoryLimits(timeout_seconds=1.0)))
    assert "a redirect loop: 10 redirects, the last to http://127.0.0.1:" in said and "message=''" not in said, said

    async def drip(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"status": ')
        await asyncio.sleep(5)  # past the timeout, one byte at a time would do the same
        return response

    said = asyncio.run(_said_by(drip, HistoryLimits(timeout_seconds=1.0)))
    assert said.endswith("did not answer: no answer before the timeout (it accepted the connection, then sent nothing, or too slowly)"), said
