"""The Prometheus history source against answers no real Prometheus should give (an aiohttp fake): too big to
read, or of the wrong shape. Each ends in one sentence naming what is wrong, never a traceback or an unbounded read."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from vllm_triage.history.prometheus import HistoryError, HistoryLimits, PrometheusHistory

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
    from vllm_triage.history.fleet import target_matchers

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
    assert said.endswith("did not answer every query within 1 s: ask for a shorter range or a larger --step"), said


def test_points_and_series_are_counted_before_the_answer_is_decoded():
    """An answer of far more points than steps asked for (once 2.4M points for 61 steps: 1.26 GB), more series than the
    limit (1.3M empty series: 1.35 GB), or a history over the command's point budget is refused from its bytes."""
    flood = matrix({"metric": GOOD, "values": [[1796000000 + i, "1"] for i in range(5000)]})  # 31 steps asked
    assert ask(flood).startswith("Prometheus answered 5000 points for 1 series of 31 steps: not an answer"), ask(flood)
    empty = matrix(*({"metric": {**GOOD, "engine": str(i)}, "values": []} for i in range(3000)))
    assert ask(empty, HistoryLimits(max_series=2000)).startswith("3000 series match, over max 2000"), ask(empty, HistoryLimits(max_series=2000))
    full = matrix(*({"metric": {**GOOD, "engine": str(i)}, "values": [[1796000000 + 2 * k, "1"] for k in range(31)]} for i in range(40)))
    said = ask(full, HistoryLimits(max_points=1000))  # 1,240 points in the first answer alone
    assert said.startswith("the history holds over 1000 points: use a larger --step or a shorter range"), said


def test_one_deadline_holds_for_every_query_of_the_command():
    """Four queries of a slow Prometheus each once had their own 60 s (250 s in all): one deadline now holds for them."""

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.4)
        return web.json_response(matrix())

    said = asyncio.run(_said_by(slow, HistoryLimits(timeout_seconds=1.0)))  # the four queries need 1.6 s
    assert said.endswith("did not answer every query within 1 s: ask for a shorter range or a larger --step"), said


def list_said(body: bytes, max_bytes: int = 1024, limit: int = 50) -> str:
    """What fleet's server list says of a Prometheus whose instant query answers `body`."""
    from vllm_triage.history.prometheus import list_servers

    async def query(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    async def said(url: str) -> str:
        try:
            await list_servers(url, "", 1796000000.0, limit, max_bytes=max_bytes)
        except HistoryError as error:
            return str(error)
        return ""

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    return asyncio.run(serving(app, said))


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"status": "success", "data": {"result": [{"no metric": 1}]}}, "not a query's vector"),  # once KeyError 'metric'
        ({"status": "success"}, "not a query's vector"),  # once KeyError 'data'
        (b"[" * 10, "not its JSON API"),
        ({"status": "success", "data": {"result": [{"metric": GOOD}] * 60}}, "over 50 vLLM servers match"),
        ({"status": "success", "data": {"result": [{"metric": {**GOOD, "pod": "x" * 2**21}}]}}, "list of servers is over 1 MiB"),
    ],
)
def test_fleets_server_list_is_bounded_and_checked_for_shape(answer, says):
    """fleet read its list whole (a 300 MB list: 2.95 GB) and raised KeyError on a list of the wrong shape."""
    body = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    said = list_said(body, max_bytes=2**20)
    assert says in said, said


def test_max_num_seqs_from_history_is_named_so_and_series_answered_to_another_query_are_not_used():
    """diagnose --prometheus once labelled the max_num_seqs a sidecar had exported "from the sidecar config", and used
    any series the answer held, whatever its name: here an `up` series of 4 answered beside the real 48 (and a stray
    series beside vLLM's)."""
    from vllm_triage.config_loader import load
    from vllm_triage.pipeline import replay

    start, steps = 1796000000.0, range(0, 62, 2)
    running = {"metric": GOOD, "values": [[start + t, "3"] for t in steps]}
    waiting = {"metric": {**GOOD, "__name__": "vllm:num_requests_waiting"}, "values": [[start + t, "0"] for t in steps]}

    async def query_range(request: web.Request) -> web.Response:
        query = (await request.post())["query"]
        if "vllm_max_num_seqs" in query:
            seqs = {"metric": {"__name__": "vllm_triage_vllm_max_num_seqs"}, "values": [[start + t, "48"] for t in steps]}
            return web.json_response(matrix(seqs, {"metric": {"__name__": "up"}, "values": [[start + t, "4"] for t in steps]}))
        if "num_requests" in query:
            return web.json_response(matrix(running, waiting, {"metric": {"__name__": "node_load1"}, "values": [[start, "9"]]}))
        return web.json_response(matrix())

    async def judged(url: str):
        history = PrometheusHistory(url, "", HistoryLimits())
        readings = await history.readings(start, start + 60)
        return history.notes, replay(readings, load(env={}), lambda _: None)

    app = web.Application()
    app.router.add_post("/api/v1/query_range", query_range)
    notes, snapshot = asyncio.run(serving(app, judged))
    assert (snapshot.discovery.max_num_seqs, snapshot.discovery.max_num_seqs_origin) == (48, "history")
    assert "from Prometheus' history" in snapshot.discovery.max_num_seqs_text
    assert any("1 series its query did not ask for (e.g. 'node_load1')" in n for n in notes), notes
    assert any("(e.g. 'up')" in n for n in notes), notes
