"""Property-based fuzzing of the inputs added beside vLLM's page: dcgm-exporter's page, the Prometheus history
source's answers, the web config file and the config file a reload reads. Whatever they hold, each ends in a
Reading (ok or failed, with a bounded reason) or in one error of the type its caller reports in a line; nothing
else escapes. A short budget runs in `make test`; `make fuzz` sets FUZZ_EXAMPLES."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path

import yaml
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_triage.config_loader import load
from vllm_triage.history.prometheus import HistoryLimits
from vllm_triage.options import ConfigError
from vllm_triage.sources.dcgm import DcgmSource
from vllm_triage.webconfig import load_web_config

from harness.vllm_server import serving

from .test_fuzz import EXAMPLES, mutate
from .test_history_answers import _said_by

DATA = Path(__file__).resolve().parents[1] / "data"
DCGM_PAGE = (DATA / "dcgm-exporter-h200.metrics.txt").read_text()
DCGM_LINES = [i for i, line in enumerate(DCGM_PAGE.splitlines()) if line.startswith("DCGM_FI_")]
BUDGET = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize="FUZZ_EXAMPLES" not in os.environ)
# JSON-like values, nested: what a broken Prometheus, a YAML typo or a hostile file may hold
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=5),
    max_leaves=30,
)
DCGM_REASONS = {"http_status", "too_large", "connect", "parse", "no_gpu"}


@BUDGET
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 10_000), st.integers(0, 10_000)), max_size=8))
def test_no_dcgm_page_escapes_as_an_exception(choices):
    text = mutate(DCGM_PAGE, DCGM_LINES, choices)

    async def page(_: web.Request) -> web.StreamResponse:
        return web.Response(text=text)

    async def collect(url: str):
        source = DcgmSource(url + "/metrics", timeout_seconds=5.0, pod="vllm-0", namespace="llm")
        try:
            return await source.collect()
        finally:
            await source.close()

    app = web.Application()
    app.router.add_get("/metrics", page)
    reading = asyncio.run(serving(app, collect))
    assert reading.ok or reading.error_reason in DCGM_REASONS, reading
    assert all(math.isfinite(v) for v in reading.samples.values()), reading.samples


@BUDGET
@given(VALUES)
def test_no_prometheus_answer_escapes_as_an_exception(answer):
    body = json.dumps(answer, allow_nan=True).encode()

    async def query(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    said = asyncio.run(_said_by(query, HistoryLimits(timeout_seconds=5.0)))
    assert said, "a history from an answer that is not a vLLM's"  # no fuzzed answer holds vLLM's series
    assert "\n" not in said.strip() and "Traceback" not in said


@BUDGET
@given(st.dictionaries(st.sampled_from(["tls_server_config", "basic_auth_users", "http_server_config", "x"]), VALUES, max_size=3))
def test_no_web_config_escapes_as_an_exception(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_web_config(str(path))
    except ConfigError as error:
        assert "\n" not in str(error)


@BUDGET
@given(st.dictionaries(st.sampled_from(["window_seconds", "sources", "gpus", "conditions", "max_series", "log_level", "tick_seconds"]), VALUES, max_size=4))
def test_no_config_a_reload_reads_escapes_as_an_exception(tmp_path_factory, document):
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        load(str(path), env={})
    except ConfigError as error:
        assert "\n" not in str(error)
