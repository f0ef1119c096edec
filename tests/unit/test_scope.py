"""Scopes are made and read in one place (vllm_triage.scope): what a series belongs to, and the
typed view of the keys /diagnosis shows."""

from __future__ import annotations

import pytest
from vllm_triage.model import make_labels
from vllm_triage.scope import AGGREGATE_SCOPE, GPU_AGGREGATE_SCOPE, HOST_SCOPE, Scope, parse_scope, scope_of, shared_scopes


@pytest.mark.parametrize(
    ("labels", "key", "scope"),
    [
        ({"engine": "1", "model_name": "org/llama-3"}, "org/llama-3/1", Scope("engine", model="org/llama-3", engine="1")),
        ({"model_name": "tiny"}, "tiny/0", Scope("engine", model="tiny", engine="0")),  # V0 pages: no engine label
        ({"engine": "0"}, "/0", Scope("shared", engine="0")),  # cache_config_info: every model of engine 0
        ({"gpu": "3", "uuid": "GPU-x"}, "gpu:3", Scope("gpu", "3")),
        ({"role": "engine_core", "index": "0"}, "role:engine_core", Scope("role", "engine_core")),
    ],
)
def test_a_series_scope_and_its_typed_view(labels, key, scope):
    assert scope_of(make_labels(labels)) == key
    assert parse_scope(key) == scope


def test_aggregates_and_the_host_are_their_own_kinds():
    assert [parse_scope(k).kind for k in (AGGREGATE_SCOPE, GPU_AGGREGATE_SCOPE, HOST_SCOPE)] == ["aggregate", "gpu_aggregate", "host"]


def test_an_engine_shares_the_series_of_its_engine_without_a_model():
    assert "/1" in shared_scopes("org/llama-3/1") and "/1" in shared_scopes("tiny/1")
    assert "/0" not in shared_scopes("tiny/1")
