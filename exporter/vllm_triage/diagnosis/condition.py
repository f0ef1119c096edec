"""A condition's type and its settings: what the table (conditions/) is made of and what the config file overrides."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..model import VLLM_SOURCE
from ..scope import ScopeKind
from .judge import Judge, Term

# Where each alert's runbook section is (the generated docs/runbooks.md): the alerts, the report and the pages link it.
RUNBOOK_URL = "https://github.com/vllm-triage/vllm-triage/blob/main/docs/runbooks.md"


def alert_name(condition_id: str) -> str:
    return "VllmTriage" + "".join(part.capitalize() for part in condition_id.split("_"))


def runbook_url(condition_id: str) -> str:
    return f"{RUNBOOK_URL}#{alert_name(condition_id).lower()}"


@dataclass(frozen=True)
class Threshold:
    name: str
    default: float
    description: str
    minimum: float = 0.0
    maximum: float | None = None
    # A config option whose value, where set, is this threshold's default (the condition's own overrides still win): one
    # setting that several thresholds follow, such as the chart's start-up budget.
    option: str | None = None


@dataclass(frozen=True)
class Condition:
    id: str
    layer: str  # "1" vLLM metrics, "3" GPU/host, "1+3" both (README, The three layers)
    severity: str  # critical | warning | info
    summary: str
    meaning: str  # what it says about the server, for the report and the runbook
    next_actions: tuple[str, ...]
    predicate: Callable[[Judge], Term]
    # Its place in the one story a server tells: the primary verdict is the active one of lowest precedence, the one
    # whose fix comes first (an unreachable or failing server before capacity, capacity before the host, the host
    # before GPU efficiency, symptoms such as latency after their causes, informational last). Unique; in tens, so
    # a new condition fits between two.
    precedence: int
    thresholds: tuple[Threshold, ...] = ()
    # (cause, precedence) where a cause moves the verdict in the story: a queue behind the concurrency cap leads a GPU
    # that idles between its small steps, since admitting more per step is the fix of both. Unique, as precedence is.
    precedence_by_cause: tuple[tuple[str, int], ...] = ()
    for_seconds: float = 60.0
    clear_seconds: float = 60.0
    sources: tuple[str, ...] = (VLLM_SOURCE,)  # a source that is down makes the condition `unknown`
    # The signals the predicate (and `contradicted`) reads, the most telling first: the conditions
    # dashboard shows the first exported ones. Checked against the signal tables and against what the
    # predicates read replaying the real captures (tests/unit/test_condition_reads.py).
    reads: tuple[str, ...] = ()
    causes: tuple[str, ...] = ()
    dont: tuple[str, ...] = ()  # what not to do: common misreadings of the signals (printed in the runbooks)
    # Its own default window, where the global window_seconds could be too short for its thresholds.
    window_seconds: float | None = None
    scope_kind: ScopeKind = "engine"  # judged per vLLM engine | per "gpu" | once ("global"); active when any scope holds
    # When the predicate fails and this returns a reason (the opposite clearly holds), the condition
    # clears at once instead of after clear_for: a stale verdict must not lead the next incident.
    contradicted: Callable[[Mapping[str, float | None]], str | None] | None = None
    # (condition, why): while that one holds it explains this one's evidence, and this one does not hold (its evidence
    # stays, with the reason). Each must rank before this one.
    suppressed_by: tuple[tuple[str, str], ...] = ()
    # What discovery found that its evidence names: "max_num_seqs" (its value and where it came from), "host" (vLLM's
    # processes, their busiest threads, the functions holding the GIL), "orphans" (processes that outlived their API
    # server and the GPU memory they hold, while it holds), "lost_ranks" (workers gone while their engine core runs on),
    # "stuck" (where the stack dump of its current activation found a process waiting: Judge.stuck), "foreign_gpu" (other
    # programs computing on the scope's GPU: their pids and memory), "change" (the last change of vLLM's configuration
    # and what it cost: envelope.py), "usual" (vLLM's ITL and throughput now against its usual at the same load).
    notes: tuple[str, ...] = ()
    # The role whose Python stacks the daemon takes once when the verdict becomes active (py-spy dump): where it is stuck.
    stack_dump_role: str | None = None
    # Only while its cause is one of these (empty: whatever the cause): a process that is gone has no stacks to take.
    stack_dump_causes: tuple[str, ...] = ()
    # While active it fails /engine-liveness (opt-in, a liveness probe on vLLM's container): restarting vLLM is its fix.
    fails_engine_liveness: bool = False


# A hung engine's gauges hold their last values and its GPU waits for nothing: what they would say is not so.
FROZEN = ("engine_wedged", "the engine is hung: its gauges hold their last values and its GPU waits for nothing")


@dataclass(frozen=True)
class ConditionSettings:
    """A condition's defaults merged with the user's overrides (config.py validates them)."""

    enabled: bool
    for_seconds: float
    clear_seconds: float
    window_seconds: float
    thresholds: dict[str, float]


def default_settings(condition: Condition, window_seconds: float) -> ConditionSettings:
    return ConditionSettings(
        enabled=True,
        for_seconds=condition.for_seconds,
        clear_seconds=condition.clear_seconds,
        window_seconds=condition.window_seconds or window_seconds,
        thresholds={t.name: t.default for t in condition.thresholds},
    )
