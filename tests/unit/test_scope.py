"""Scopes are made in one place (vllm_triage.scope) and read everywhere as values: what a series belongs to, its kind
and its parts as fields, and the key /diagnosis shows; no key is ever parsed back."""

from __future__ import annotations

import pytest
from vllm_triage.model import make_labels
from vllm_triage.scope import AGGREGATE_SCOPE, GPU_AGGREGATE_SCOPE, HOST_SCOPE, engine_scope, gpu_group_scope, gpu_scope, role_scope, scope_of


@pytest.mark.parametrize(
    ("labels", "key", "fields"),
    [
        ({"engine": "1", "model_name": "org/llama-3"}, "org/llama-3/1", ("engine", "", "org/llama-3", "1")),
        ({"model_name": "tiny"}, "tiny/0", ("engine", "", "tiny", "0")),  # V0 pages: no engine label
        ({"engine": "0"}, "/0", ("shared", "", "", "0")),  # cache_config_info: every model of engine 0
        ({"gpu": "3", "uuid": "GPU-x"}, "gpu:3", ("gpu", "3", "", "")),
        ({"role": "engine_core", "index": "0"}, "role:engine_core", ("role", "engine_core", "", "")),
    ],
)
def test_a_series_scope_carries_its_kind_and_parts(labels, key, fields):
    scope = scope_of(make_labels(labels))
    assert scope.key == str(scope) == key
    assert (scope.kind, scope.name, scope.model, scope.engine) == fields


def test_a_scope_is_made_once_per_label_set_and_compares_as_a_value():
    labels = make_labels({"engine": "1", "model_name": "tiny"})
    assert scope_of(labels) is scope_of(labels) is engine_scope("tiny", "1")
    assert gpu_scope("0") == gpu_scope("0") and gpu_scope("0") != gpu_scope("1") and gpu_scope("0") != "gpu:0"
    assert sorted([gpu_scope("1"), gpu_scope("0")]) == [gpu_scope("0"), gpu_scope("1")]


def test_aggregates_and_the_host_are_their_own_kinds():
    assert [s.kind for s in (AGGREGATE_SCOPE, GPU_AGGREGATE_SCOPE, HOST_SCOPE)] == ["aggregate", "gpu_aggregate", "host"]
    assert [s.key for s in (AGGREGATE_SCOPE, GPU_AGGREGATE_SCOPE, HOST_SCOPE)] == ["all", "gpu:all", "host"]


def test_an_engine_shares_the_series_of_its_engine_without_a_model():
    assert engine_scope("", "1") in engine_scope("org/llama-3", "1").shared and engine_scope("", "1") in engine_scope("tiny", "1").shared
    assert engine_scope("", "0") not in engine_scope("tiny", "1").shared


def test_a_gpu_group_holds_its_gpus():
    group = gpu_group_scope((gpu_scope("2"), gpu_scope("3")))
    assert (group.kind, group.key, group.members) == ("gpu_group", "gpus:2,3", (gpu_scope("2"), gpu_scope("3")))
    assert role_scope("worker").key == "role:worker"


def test_a_scope_held_anywhere_is_the_one_made_again_after_thousands_of_others():
    """Under model-name churn the constructors' caches evict; a scope still held (a store's frame, a verdict's
    bookkeeping) must still be the one its labels make, or a dict keyed by it would miss."""
    held = engine_scope("kept", "0")
    for i in range(10_000):
        engine_scope(f"churn-{i}", "0")
    assert scope_of(make_labels({"engine": "0", "model_name": "kept"})) is held
    assert {held: 1}.get(engine_scope("kept", "0")) == 1
