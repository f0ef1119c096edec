"""Scopes: what a signal is computed for and a verdict is judged in. Made here only, read everywhere as a value.

A `Scope` is made once per label set (or per GPU, role, group) and interned: the store, the window views,
TickInputs and `Snapshot.signals` are keyed by it, and its kind, GPU index, role, model and engine are fields,
never parsed back from text. Its `key` is the string /diagnosis shows and exported labels carry: `model/engine`
for a vLLM engine (`/engine` for an engine's series without a model, such as cache_config_info, which belong to
every model there), `gpu:<index>`, `gpus:<index>,<index>` for the GPUs one data-parallel engine runs on (judged
beside that engine), `role:<role>` for vLLM's processes, `all` for a source's aggregate (`gpu:all` for the GPUs'),
`host` for the processes' and the GIL's signals together.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any, Literal
from weakref import WeakValueDictionary

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name: hashable, so a series key is (name, labels)."""

# The one vocabulary of kinds: a Scope's, a source's (catalog: engine, gpu, host) and a condition's (engine, gpu, or
# global: judged once for the server, on no scope of its own).
ScopeKind = Literal["engine", "shared", "gpu", "gpu_group", "role", "aggregate", "gpu_aggregate", "host", "global"]


class Scope:
    """One scope, interned: equal scopes are the same object (made only by `_interned`, which keeps one object per
    key for as long as any is referenced), so equality and hashing are identity's, done in C on the hot path (a
    window's points are looked up by (name, scope) keys thousands of times a tick)."""

    __slots__ = ("__weakref__", "engine", "key", "kind", "members", "model", "name", "shared")

    def __init__(
        self,
        kind: ScopeKind,
        key: str,
        *,
        name: str = "",
        model: str = "",
        engine: str = "",
        members: tuple[Scope, ...] = (),
        shared: tuple[Scope, ...] = (),
    ) -> None:
        self.kind = kind
        self.key = sys.intern(key)
        self.name = name  # the GPU index or the role
        self.model = model  # engine scopes
        self.engine = engine
        self.members = members  # a GPU group's GPUs
        self.shared = shared  # an engine's `/engine` scopes, whose series also belong to it

    def __lt__(self, other: Scope) -> bool:  # sorted by key: /diagnosis and the exposition list scopes so
        return self.key < other.key

    def __str__(self) -> str:
        return self.key

    def __repr__(self) -> str:
        return f"Scope({self.kind}, {self.key!r})"


# The one table of scopes. Weak: a scope nothing refers to any more (a model name gone for a window) is dropped, and a
# later one of the same key is a new object that no older dict can hold. The constructors' lru_caches below only save
# building the key; they may evict, this table decides identity.
_SCOPES: WeakValueDictionary[str, Scope] = WeakValueDictionary()


def _interned(kind: ScopeKind, key: str, **fields: Any) -> Scope:
    scope = _SCOPES.get(key)
    if scope is None:
        _SCOPES[key] = scope = Scope(kind, key, **fields)
    return scope


AGGREGATE_SCOPE = _interned("aggregate", "all")
HOST_SCOPE = _interned("host", "host")
GPU_AGGREGATE_SCOPE = _interned("gpu_aggregate", "gpu:all")


@lru_cache(maxsize=4096)
def _shared(key: str) -> Scope:
    return _interned("shared", key, engine=key[1:])


@lru_cache(maxsize=8192)
def engine_scope(model: str, engine: str) -> Scope:
    """A vLLM engine's scope; without a model, the scope of its series shared by every model there."""
    key = f"{model}/{engine}"
    if not model:
        return _shared(key)
    # the suffixes that start with "/" (model names may contain '/')
    return _interned("engine", key, model=model, engine=engine, shared=tuple(_shared(key[i:]) for i, char in enumerate(key) if char == "/" and i > 0))


@lru_cache(maxsize=1024)
def gpu_scope(index: str) -> Scope:
    return _interned("gpu", "gpu:" + index, name=index)


@lru_cache(maxsize=1024)
def gpu_group_scope(gpus: tuple[Scope, ...]) -> Scope:
    """Several GPUs judged as one (`gpu:` scopes in, their indexes in the key)."""
    return _interned("gpu_group", "gpus:" + ",".join(g.name for g in gpus), name=",".join(g.name for g in gpus), members=gpus)


@lru_cache(maxsize=64)
def role_scope(role: str) -> Scope:
    return _interned("role", "role:" + role, name=role)


@lru_cache(maxsize=8192)  # labels are shared tuples (make_labels): one scope per label set
def scope_of(labels: Labels) -> Scope:
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
    return engine_scope(model, engine)  # one per engine, not per label set (a model name can be 1 kB)
