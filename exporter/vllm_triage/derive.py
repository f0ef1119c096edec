"""What a tick derives from the store before anything is judged: each source's health and whether its
readings are still evidence, what discovery found, the global signals, and the windowed signals per
source, scope and window (computed on first use, once per tick). The engine judges what this hands it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from .catalog import CATALOG, CATALOG_BY_NAME
from .diagnosis.inputs import Notes, ScopedSignals, TickInputs, Wants
from .discovery import Discovery, discover
from .envelope import CHANGE_SIGNALS
from .model import GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE, ProcessMeta, SeriesKey, SourceHealth
from .scope import AGGREGATE_SCOPE, GPU_AGGREGATE_SCOPE, HOST_SCOPE, Scope, gpu_group_scope
from .signals.window import WindowView, compute_signals
from .signals.window import window as signals_window
from .sources.process import STOPPED_STATES
from .store import Store

DEFAULT_STALE_AFTER_SECONDS = 15.0
CRASH_LOOP_WINDOW_SECONDS = 600.0  # API servers seen exiting within this long make a crash loop (Kubernetes backs off to 5 min)
# Signals of the whole server, not of one scope: vllm_unreachable's (with what the host sees of the API server, for
# its cause), and the parallel layout the rank map found (the largest tensor-parallel group and the data-parallel
# engines; absent while no vLLM process is visible); what the last change of vLLM's configuration cost (envelope.py).
GLOBAL_SIGNALS = (
    "vllm_down_seconds",
    "vllm_stale_after_seconds",
    "host_api_server_stopped",
    "host_api_server_gone_seconds",
    "host_api_server_running_seconds",
    "host_api_server_exits_recent",
    "host_process_view",
    "host_vllm_processes_ignored",
    "vllm_tensor_parallel_size",
    "vllm_parallel_engines",
    *CHANGE_SIGNALS,
)


@dataclass(frozen=True)
class DeriveSettings:
    """What deriving needs of the config: a max_num_seqs set by hand (else vLLM's own, read from its processes or
    metrics) and, per source, how long a failing source's readings stay evidence (15 s where unset) and the least
    window its signals are computed over (its readings come that far apart; catalog.lookbacks)."""

    max_num_seqs: int | None = None
    stale_after: Mapping[str, float] = field(default_factory=dict)
    lookback: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Derived:
    store: Store
    now: float
    sources: tuple[SourceHealth, ...]
    health: dict[str, SourceHealth]
    fresh: dict[str, bool]  # up, or failing for less than its stale_after: its window's readings are still evidence
    discovery: Discovery
    global_signals: dict[str, float | None]
    lookback: Mapping[str, float] = field(default_factory=dict)
    _cache: dict[tuple[str, float], ScopedSignals] = field(default_factory=dict)
    _views: dict[tuple[str, float], WindowView] = field(default_factory=dict)
    _group_cache: dict[tuple[Scope, float], dict[str, float | None]] = field(default_factory=dict)  # (gpus: scope, window)

    def _view(self, source: str, window: float) -> WindowView:
        if (source, window) not in self._views:
            self._views[(source, window)] = signals_window(self.store, source, self.now, window)
        return self._views[(source, window)]

    def signals_for(self, source: str, window: float) -> ScopedSignals:
        """scope -> signals for one source and window (at least its lookback), the aggregate under
        AGGREGATE_SCOPE."""
        spec = CATALOG_BY_NAME[source]
        window = max(window, self.lookback.get(source, 0.0))
        if (source, window) not in self._cache:
            view = self._view(source, window)
            facts = self.discovery.facts()
            # vLLM engines and GPUs are judged one by one; host signals are per role already.
            per_role = spec.scope_kind == "host"
            scopes = view.scopes() if not per_role else []
            per_scope = {scope: compute_signals(view, scope, facts, spec.signals) for scope in scopes}
            if len(scopes) == 1 and view.covers_everything(scopes[0]):
                per_scope[AGGREGATE_SCOPE] = per_scope[scopes[0]]
            elif per_scope or (per_role and view.frames):
                per_scope[AGGREGATE_SCOPE] = compute_signals(view, AGGREGATE_SCOPE, facts, spec.signals)
            self._cache[(source, window)] = per_scope
        return self._cache[(source, window)]

    def engine_scoped(self, window: float) -> ScopedSignals:
        """Each vLLM engine's signals with the GPUs' aggregate (while the GPU source is fresh) and the
        host's beside them: what an engine-scoped condition is judged on. Where the rank map places several
        data-parallel engines on GPUs, each engine's GPU signals are its own GPUs', not every GPU's."""
        beside: dict[str, float | None] = {}
        gpu_fresh = False
        for spec in CATALOG:
            if spec.scope_kind == "host" or (spec.scope_kind == "gpu" and self.fresh.get(spec.name)):
                beside.update(self.signals_for(spec.name, window).get(AGGREGATE_SCOPE, {}))
                gpu_fresh = gpu_fresh or spec.scope_kind == "gpu"
        engines = self.discovery.engine_gpus if gpu_fresh else {}
        scoped = {}
        for scope, values in self.signals_for(VLLM_SOURCE, window).items():
            gpus = engines.get(scope.engine) if scope is not AGGREGATE_SCOPE else None
            scoped[scope] = {**values, **beside, **(self._gpu_group_signals(window, gpus) if gpus else {})}
        return scoped

    def _gpu_group_signals(self, window: float, gpus: tuple[Scope, ...]) -> dict[str, float | None]:
        """The GPU signals over several GPUs (one engine's), as its aggregate would be over them alone."""
        spec = CATALOG_BY_NAME[GPU_SOURCE]
        window = max(window, self.lookback.get(GPU_SOURCE, 0.0))
        scope = gpu_group_scope(gpus)
        if (scope, window) not in self._group_cache:
            self._group_cache[(scope, window)] = compute_signals(self._view(GPU_SOURCE, window), scope, self.discovery.facts(), spec.signals)
        return self._group_cache[(scope, window)]

    def inputs(self, wants: Wants, stuck: tuple[tuple[str, str, str], ...] = (), change: tuple[str, ...] = (), usual: tuple[str, ...] = ()) -> TickInputs:
        """The judge's values: each (scope kind, window) it wants, computed now, the discovery notes it names, where
        the stack dumps taken for active verdicts found processes waiting (role, place, frame), what the last change
        of vLLM's configuration was and what vLLM delivers now against its usual (envelope.py)."""
        scoped = {
            (kind, window): self.signals_for(GPU_SOURCE, window) if kind == "gpu" else self.engine_scoped(window) for kind, window in sorted(wants.scoped)
        }
        found = self.discovery
        notes = Notes(
            found.max_num_seqs,
            found.max_num_seqs_text,
            tuple(found.host_notes()) if "host" in wants.notes else (),
            tuple(found.orphan_notes()) if "orphans" in wants.notes else (),
            tuple(found.lost_rank_notes()) if "lost_ranks" in wants.notes else (),
            stuck if "stuck" in wants.notes else (),
            tuple(found.foreign_gpu_notes()) if "foreign_gpu" in wants.notes else (),
            change if "change" in wants.notes else (),
            usual if "usual" in wants.notes else (),
        )
        return TickInputs(self.now, self.health, self.fresh, self.global_signals, scoped, notes)

    def latest_exported(self) -> dict[str, dict[SeriesKey, float]]:
        """The last ok reading of each source exported as read (SourceEntry.exports_latest)."""
        return {spec.name: r.samples for spec in CATALOG if spec.exports_latest and (r := self.store.latest(spec.name)) is not None and r.ok}

    def shown(self, window: float) -> ScopedSignals:
        """Snapshot.signals: each engine's and each GPU's (their aggregates as `all` and `gpu:all`), and
        the host's."""
        shown: ScopedSignals = {}
        for spec in CATALOG:
            per_scope = self.signals_for(spec.name, window)
            if spec.scope_kind == "host":
                shown.setdefault(HOST_SCOPE, {}).update(per_scope.get(AGGREGATE_SCOPE, {}))
            elif spec.scope_kind == "gpu":
                shown.update({GPU_AGGREGATE_SCOPE if k is AGGREGATE_SCOPE else k: v for k, v in per_scope.items()})
            else:
                shown.update(per_scope)
        return shown


def derive(store: Store, now: float, settings: DeriveSettings) -> Derived:
    stale_after = settings.stale_after
    sources = tuple(store.health(name) for name in sorted({VLLM_SOURCE, *store.sources()}))
    health = {s.source: s for s in sources}
    fresh = {name: _fresh(h, now, stale_after.get(name, DEFAULT_STALE_AFTER_SECONDS)) for name, h in health.items()}
    found = discover(store, settings.max_num_seqs)
    ranks = found.ranks
    stopped, gone = _api_server_seen(store, found, fresh.get(PROCESS_SOURCE, False), now)
    global_signals = {
        "vllm_down_seconds": _down_seconds(store, health[VLLM_SOURCE], now),
        "vllm_stale_after_seconds": stale_after.get(VLLM_SOURCE, DEFAULT_STALE_AFTER_SECONDS),
        "host_api_server_stopped": stopped,
        "host_api_server_gone_seconds": gone,
        **_startup_evidence(store, fresh.get(PROCESS_SOURCE, False), now),
        "vllm_tensor_parallel_size": float(1 + max(r["tp_rank"] for r in ranks)) if ranks else None,
        "vllm_parallel_engines": float(len({r["dp_rank"] for r in ranks})) if ranks else None,
    }
    return Derived(store, now, sources, health, fresh, found, global_signals, settings.lookback)


def _api_server_seen(store: Store, found: Discovery, fresh: bool, now: float) -> tuple[float | None, float | None]:
    """What the process source sees of vLLM's API server now: (1 stopped or 0 running, while one is watched; seconds
    since one was last watched, while none is and the readings kept show one). Both None without a fresh reading."""
    latest = store.latest(PROCESS_SOURCE)
    if not fresh or latest is None or not latest.ok:
        return None, None
    servers = [p for p in found.processes if p.get("role") == "api_server"]
    if servers:
        return (1.0 if servers[0].get("status") in STOPPED_STATES else 0.0), None
    for frame in reversed(store.window(PROCESS_SOURCE, -math.inf, now)):
        if any(p.get("role") == "api_server" for p in cast("ProcessMeta", frame.meta).get("processes", [])):
            return None, now - frame.timestamp
    return None, None


def _startup_evidence(store: Store, fresh: bool, now: float) -> dict[str, float | None]:
    """What the host shows of a vLLM that has not answered: whether the sidecar sees beyond its own processes, how long
    the watched API server has run, how many exited within CRASH_LOOP_WINDOW_SECONDS, and how many vLLM-titled
    processes belong to another port. All None without a fresh process reading."""
    latest = store.latest(PROCESS_SOURCE)
    if not fresh or latest is None or not latest.ok:
        return dict.fromkeys(("host_process_view", "host_api_server_running_seconds", "host_api_server_exits_recent", "host_vllm_processes_ignored"))
    meta = latest.process_meta()
    view = meta.get("process_view")
    started = latest.api_server_started()
    exits = [t for t in meta.get("api_server_exit_times", ()) if latest.timestamp - t <= CRASH_LOOP_WINDOW_SECONDS]
    return {
        "host_process_view": None if view is None else float(view),
        "host_api_server_running_seconds": None if started is None else max(0.0, latest.timestamp - started),
        "host_api_server_exits_recent": None if view is None else float(len(exits)),
        "host_vllm_processes_ignored": float(meta.get("ignored_processes", 0)),
    }


def _fresh(health: SourceHealth, now: float, stale_after: float) -> bool:
    if health.up:
        return True
    last = health.last_success_timestamp
    return last is not None and now - last <= stale_after


def _down_seconds(store: Store, health: SourceHealth, now: float) -> float | None:
    if health.up is None:
        return None
    if health.up:
        return 0.0
    failing_since = store.failing_since(VLLM_SOURCE)
    return max(0.0, now - failing_since) if failing_since is not None else 0.0
