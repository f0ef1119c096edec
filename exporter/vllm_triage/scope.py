"""Scopes: what a signal is computed for and a verdict is judged in. Made and read here only.

A scope's key is the string /diagnosis shows (`Snapshot.signals`' keys, the store's index):
`model/engine` for a vLLM engine (`/engine` for an engine's series without a model, such as
cache_config_info, which belong to every model there), `gpu:<index>`, `gpus:<index>,<index>` for the GPUs
one data-parallel engine runs on (judged beside that engine), `role:<role>` for vLLM's
processes, `all` for a source's aggregate (`gpu:all` for the GPUs'), `host` for the processes' and
the GIL's signals together. `parse_scope` gives the typed view of a key.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Literal, NamedTuple

from .model import Labels

AGGREGATE_SCOPE = "all"
HOST_SCOPE = "host"
_GPU, _GPUS, _ROLE = "gpu:", "gpus:", "role:"

ScopeKind = Literal["engine", "shared", "gpu", "gpu_group", "role", "aggregate", "gpu_aggregate", "host"]


class Scope(NamedTuple):
    kind: ScopeKind
    name: str = ""  # the GPU index or the role
    model: str = ""  # engine scopes
    engine: str = ""


def engine_scope(model: str, engine: str) -> str:
    return f"{model}/{engine}"


def gpu_scope(index: str) -> str:
    return _GPU + index


def gpu_group_scope(gpus: tuple[str, ...]) -> str:
    """Several GPUs judged as one (`gpu:` scopes in, their indexes in the key)."""
    return _GPUS + ",".join(g.removeprefix(_GPU) for g in gpus)


@lru_cache(maxsize=256)
def group_members(key: str) -> tuple[str, ...]:
    """The GPU scopes of a `gpus:` scope."""
    return tuple(gpu_scope(index) for index in key.removeprefix(_GPUS).split(","))


def role_scope(role: str) -> str:
    return _ROLE + role


GPU_AGGREGATE_SCOPE = gpu_scope(AGGREGATE_SCOPE)


@lru_cache(maxsize=8192)  # labels are shared tuples (make_labels): one scope string per label set
def scope_of(labels: Labels) -> str:
    """The scope a series belongs to: its engine (V0 pages have no engine label: "0"), its GPU or its
    process role."""
    model = ""
    engine = "0"
    for key, value in labels:
        if key == "model_name":
            model = value
        elif key == "engine":
            engine = value
        elif key == "gpu":
            return gpu_scope(value)  # GPU series: one scope per GPU
        elif key == "role":
            return role_scope(value)  # vLLM's processes: one scope per role
    return sys.intern(engine_scope(model, engine))  # one string per engine, not per label set (a model name can be 1 kB)


@lru_cache(maxsize=4096)
def shared_scopes(scope: str) -> tuple[str, ...]:
    """The `/engine` scopes whose series also belong to `scope` (its suffixes that start with "/")."""
    return tuple(scope[i:] for i, char in enumerate(scope) if char == "/" and i > 0)


@lru_cache(maxsize=4096)
def parse_scope(key: str) -> Scope:
    if key == AGGREGATE_SCOPE:
        return Scope("aggregate")
    if key == GPU_AGGREGATE_SCOPE:
        return Scope("gpu_aggregate")
    if key == HOST_SCOPE:
        return Scope("host")
    if key.startswith(_GPUS):
        return Scope("gpu_group", key.removeprefix(_GPUS))
    if key.startswith(_GPU):
        return Scope("gpu", key.removeprefix(_GPU))
    if key.startswith(_ROLE):
        return Scope("role", key.removeprefix(_ROLE))
    model, _, engine = key.rpartition("/")  # model names may contain '/'
    return Scope("shared" if not model else "engine", model=model, engine=engine)
