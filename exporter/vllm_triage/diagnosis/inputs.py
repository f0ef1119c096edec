"""What one tick hands the judge: plain values, built eagerly by derive.py for what the enabled conditions declare
(their scope kind and window, the discovery notes their evidence names). The engine reads nothing else: no store,
no signal code, no discovery."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..model import SourceHealth
from ..scope import Scope, ScopeKind

ScopedSignals = dict[Scope, dict[str, float | None]]  # scope -> signal -> value (None: cannot be computed)


@dataclass(frozen=True)
class Notes:
    """What discovery found that a verdict's evidence names, for the conditions that ask (Condition.notes)."""

    max_num_seqs: int | None = None
    max_num_seqs_text: str = ""  # where max_num_seqs came from
    host: tuple[str, ...] = ()  # vLLM's processes, their busiest and neediest threads, the functions holding the GIL
    orphans: tuple[str, ...] = ()  # processes that outlived their API server, and the GPU memory they hold
    lost_ranks: tuple[str, ...] = ()  # workers gone while their engine core runs on
    stuck: tuple[tuple[str, str, str], ...] = ()  # (role, place, frame): where a process' stack dump found it waiting
    foreign_gpu: tuple[tuple[Scope, str], ...] = ()  # (GPU scope, text): other programs computing on a watched GPU
    change: tuple[str, ...] = ()  # the last change of vLLM's configuration and what it cost (envelope.py)
    usual: tuple[str, ...] = ()  # what vLLM delivers now against its usual at the same load (envelope.py)


@dataclass(frozen=True)
class Wants:
    """What the enabled conditions are judged on: the (scope kind, window) pairs TickInputs.scoped must hold, and
    the discovery notes their evidence names (Condition.notes)."""

    scoped: frozenset[tuple[ScopeKind, float]]
    notes: frozenset[str]


@dataclass(frozen=True)
class TickInputs:
    now: float
    health: Mapping[str, SourceHealth]
    fresh: Mapping[str, bool]  # up, or failing for less than its stale_after: its window's readings are still evidence
    global_signals: Mapping[str, float | None]  # judged once for the server (vllm_unreachable's)
    scoped: Mapping[tuple[ScopeKind, float], ScopedSignals]  # (scope kind, window) -> each scope's signals
    notes: Notes
