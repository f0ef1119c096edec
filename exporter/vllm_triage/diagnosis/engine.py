"""Judges the condition table on the values a tick hands it (inputs.TickInputs, built by derive.py): predicates ->
suppression -> debounced, ranked verdicts.

Pure and deterministic given its inputs; every driver (serve, replay, diagnose, record) reaches it through
Pipeline.evaluate, which assembles the Snapshot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..model import VLLM_SOURCE, Evidence, SourceHealth, Verdict
from ..scope import AGGREGATE_SCOPE, Scope
from .conditions import CONDITIONS, CONDITIONS_BY_ID, Condition, ConditionSettings
from .inputs import Notes, ScopedSignals, TickInputs, Wants
from .judge import Judge, Term


@dataclass
class _Debounce:
    """Hysteresis: a predicate must hold for `for_seconds` to activate and fail for `clear_seconds`
    to clear. A source gap shorter than its stale_after never reaches here (the window's readings are
    judged). Inputs missing for longer make the state `unknown`: a pending activation starts over, but
    an active condition stays held (its alert does not flap) until it has been unknown for its
    `clear_seconds`, like Prometheus' keep_firing_for; then it is unknown for good. A verdict is not raised while a
    source it reads is failing (its readings are stale): the activation waits for a scrape that succeeds, so a vLLM
    killed mid-`for` is not reported by what held before it died."""

    judged: str = "unknown"  # the last state the inputs decided
    state: str = "unknown"  # what is shown: `judged`, or unknown while the inputs are missing
    since: float | None = None
    pending_since: float | None = None
    clearing_since: float | None = None
    unknown_since: float | None = None
    cause: str | None = None  # kept while active, so the cause outlives the window's last evidence

    @property
    def held(self) -> bool:
        """Unknown now, last judged active, and not unknown for longer than clear_for yet."""
        return self.state == "unknown" and self.judged == "active"

    @property
    def active(self) -> bool:
        """Shown active, or held so (Verdict.active)."""
        return self.state == "active" or self.held

    def step(self, raw: bool | None, now: float, settings: ConditionSettings, stale: bool = False) -> None:
        if raw is None:
            self.unknown_since = self.unknown_since if self.unknown_since is not None else now
            self.pending_since = None
            if self.judged == "active" and now - self.unknown_since >= settings.clear_seconds:
                self.judged = "unknown"
                self.clearing_since = None
            elif self.judged == "inactive":
                self.judged = "unknown"
            self._show("unknown", now)
            return
        self.unknown_since = None
        if self.judged == "active":
            if raw:
                self.clearing_since = None
            else:
                self.clearing_since = self.clearing_since if self.clearing_since is not None else now
                if now - self.clearing_since >= settings.clear_seconds:
                    self.judged = "inactive"
                    self.clearing_since = None
        elif raw:
            self.pending_since = self.pending_since if self.pending_since is not None else now
            if now - self.pending_since >= settings.for_seconds and not stale:
                self.judged = "active"
                self.pending_since = None
            else:
                self.judged = "inactive"
        else:
            self.pending_since = None
            self.judged = "inactive"
        self._show(self.judged, now)

    def clear_now(self, now: float) -> None:
        """The opposite of the condition clearly holds: inactive at once, not after clear_for."""
        self.judged = "inactive"
        self.pending_since = self.clearing_since = None
        self._show("inactive", now)

    def _show(self, state: str, now: float) -> None:
        if state != self.state:
            self.state = state
            self.since = now


@dataclass
class _Outcome:
    raw: bool | None
    score: float
    evidence: list[Evidence] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    cause: str | None = None
    scopes: list[str] = field(default_factory=list)
    contradicted: str | None = None  # why the condition's opposite clearly holds (clears at once)
    suppressed_by: str | None = None  # the condition whose story explains this one's evidence
    advice: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Judgement:
    """What one tick's judging gives the Snapshot."""

    verdicts: tuple[Verdict, ...]  # in table order, ranked (role primary / secondary)
    primary: str | None
    vllm_starting_seconds: float | None  # how long vLLM has been starting (None: it is not)
    evaluations: int


class Engine:
    def __init__(
        self,
        settings: dict[str, ConditionSettings],
        window_seconds: float,
        conditions: tuple[Condition, ...] = CONDITIONS,
        sources: tuple[str, ...] | None = None,
        absent_reason: str = "turned off (the sources setting)",
    ) -> None:
        self.conditions = tuple(c for c in conditions if settings[c.id].enabled)
        self.sources = sources  # the sources the sidecar runs (or a capture holds); None: all
        self.absent_reason = absent_reason
        self.settings = settings
        self.window_seconds = window_seconds
        self._debounce = {c.id: _Debounce() for c in self.conditions}
        self.evaluations = 0

    def take_state(self, before: Engine) -> None:
        """Each condition's debounce state (active since when, pending, clearing) and the evaluation count from the
        engine a config reload replaces; a condition the new config turned off is dropped, one it turned on starts
        fresh."""
        for condition_id, state in before._debounce.items():
            if condition_id in self._debounce:
                self._debounce[condition_id] = dataclasses.replace(state)
        self.evaluations = before.evaluations

    @property
    def horizon_seconds(self) -> float:
        """How much history the store must keep for the longest window."""
        return max([self.window_seconds] + [self.settings[c.id].window_seconds for c in self.conditions])

    def wants(self) -> Wants:
        """What the enabled conditions are judged on: what TickInputs must hold."""
        scoped = frozenset((c.scope_kind, self.settings[c.id].window_seconds) for c in self.conditions if c.scope_kind != "global")
        return Wants(scoped, frozenset(note for c in self.conditions for note in c.notes))

    def judge(self, inputs: TickInputs) -> Judgement:
        """Judge the condition table on one tick's values: predicates, suppression, debouncing, ranking."""
        now, health, fresh = inputs.now, inputs.health, inputs.fresh
        outcomes = {}
        for condition in self.conditions:
            settings = self.settings[condition.id]
            per_scope = {} if condition.scope_kind == "global" else inputs.scoped[(condition.scope_kind, settings.window_seconds)]
            outcomes[condition.id] = self._judge(condition, settings, per_scope, inputs.global_signals, health, fresh, inputs.notes)
        _suppress(outcomes)

        stale: dict[str, tuple[str, ...]] = {}
        for condition in self.conditions:
            outcome, debounce = outcomes[condition.id], self._debounce[condition.id]
            stale[condition.id] = tuple(
                self._stale_note(health[name], now) for name in condition.sources if name in health and health[name].up is False and fresh[name]
            )
            debounce.step(outcome.raw, now, self.settings[condition.id], stale=bool(stale[condition.id]))
            if outcome.contradicted and debounce.judged == "active":
                debounce.clear_now(now)
            if outcome.cause is not None:
                debounce.cause = outcome.cause
            elif debounce.judged != "active":
                debounce.cause = None
        primary = _primary([(c, self._debounce[c.id]) for c in self.conditions])
        verdicts = []
        for condition in self.conditions:
            outcome, debounce = outcomes[condition.id], self._debounce[condition.id]
            verdicts.append(
                Verdict(
                    condition=condition.id,
                    layer=condition.layer,
                    severity=condition.severity,
                    summary=condition.summary,
                    state=debounce.state,
                    raw=outcome.raw,
                    score=outcome.score,
                    since=debounce.since,
                    evidence=tuple(outcome.evidence),
                    next_actions=actions_for(condition.next_actions, debounce.cause if debounce.judged == "active" else None),
                    missing=tuple(outcome.missing),
                    cause=debounce.cause,
                    causes=condition.causes,
                    scopes=tuple(outcome.scopes),
                    held=debounce.held,
                    stale=stale[condition.id],
                    suppressed_by=outcome.suppressed_by,
                    advice=tuple(outcome.advice),
                    role=("primary" if condition.id == primary else "secondary") if debounce.active else "",
                )
            )
        self.evaluations += 1
        return Judgement(tuple(verdicts), primary, self._vllm_starting_seconds(inputs, outcomes.get("vllm_unreachable")), self.evaluations)

    def _vllm_starting_seconds(self, inputs: TickInputs, unreachable: _Outcome | None) -> float | None:
        """How long vLLM has been starting: it has not answered once since the sidecar started and vllm_unreachable's
        predicate, which weighs what the host shows of the start, does not hold: a pod start or a rollout loading its
        model, not an outage (alert rules on vLLM's own target stay silent). None when not starting."""
        if inputs.health[VLLM_SOURCE].last_success_timestamp is not None:
            return None
        down = inputs.global_signals.get("vllm_down_seconds") or 0.0
        if unreachable is None:  # the condition turned off: its startup grace alone
            grace = next(t.default for t in CONDITIONS_BY_ID["vllm_unreachable"].thresholds if t.name == "startup_grace_seconds")
            return down if down < grace else None
        return None if unreachable.raw is True else down

    @staticmethod
    def _stale_note(health: SourceHealth, now: float) -> str:
        last = health.last_success_timestamp or now
        return (
            f"source {health.source}: judged on readings up to {now - last:.0f} s old; failing since "
            f"{now - (health.failing_since or now):.0f} s ago ({health.last_error_reason}: {health.last_error})"
        )

    def _why_missing(self, name: str, health: Mapping[str, SourceHealth]) -> str:
        if self.sources is not None and name not in self.sources:
            return f"source {name} is {self.absent_reason}"
        if name in health and health[name].up is False:
            return f"source {name} is down for longer than its stale_after: {health[name].last_error}"
        return f"source {name} has no reading yet"

    def _judge(
        self,
        condition: Condition,
        settings: ConditionSettings,
        per_scope: ScopedSignals,
        global_signals: Mapping[str, float | None],
        health: Mapping[str, SourceHealth],
        fresh: Mapping[str, bool],
        notes: Notes,
    ) -> _Outcome:
        down = [name for name in condition.sources if not fresh.get(name)]
        if down:
            reasons = [self._why_missing(name, health) for name in down]
            return _Outcome(None, 0.0, missing=reasons)
        if condition.scope_kind == "global":
            judge = Judge(global_signals, settings.thresholds, "", health, active=self._debounce[condition.id].judged == "active")
            term = condition.predicate(judge)
            if "orphans" in condition.notes and term.holds:
                for text in notes.orphans:
                    judge.note(text)
            for text in notes.change if "change" in condition.notes else ():
                judge.note(text)
            return _Outcome(term.holds, term.score, judge.evidence, judge.missing, judge.cause)
        scopes = [s for s in per_scope if s is not AGGREGATE_SCOPE]
        if not scopes:
            what = "GPU readings" if condition.scope_kind == "gpu" else "vLLM scrapes"
            failing = [h for name in condition.sources if (h := health.get(name)) is not None and h.up is False]
            if failing:  # a window shorter than stale_after empties before the source goes stale
                window = f"{settings.window_seconds:.0f} s window"
                return _Outcome(None, 0.0, missing=[f"source {h.source} is down: no {what} left in the {window}" for h in failing])
            return _Outcome(None, 0.0, missing=[f"no {what} in the {settings.window_seconds:.0f} s window"])
        results: list[tuple[Scope, Term, Judge]] = []
        for scope in scopes:
            judge = Judge(
                {**per_scope[scope], **global_signals},
                settings.thresholds,
                scope.key,
                active=self._debounce[condition.id].judged == "active",
                stuck={role: (place, frame) for role, place, frame in notes.stuck} if "stuck" in condition.notes else None,
            )
            if "max_num_seqs" in condition.notes:
                judge.note(notes.max_num_seqs_text, "max_num_seqs", notes.max_num_seqs)
            for text in (notes.host if "host" in condition.notes else ()) + (notes.lost_ranks if "lost_ranks" in condition.notes else ()):
                judge.note(text)
            for on, text in notes.foreign_gpu if "foreign_gpu" in condition.notes else ():
                if on == scope:
                    judge.note(text)
            for text in notes.usual if "usual" in condition.notes else ():
                judge.note(text)
            results.append((scope, condition.predicate(judge), judge))
        holding = [r for r in results if r[1].holds]
        if holding:
            raw: bool | None = True
            shown = holding
        elif any(r[1].holds is None for r in results):
            raw = None
            shown = [r for r in results if r[1].holds is None]
        else:
            raw = False
            shown = results
        best = max(shown, key=lambda r: r[1].score)
        evidence = [e for _, _, judge in shown for e in judge.evidence]
        missing = sorted({f"{m} ({scope})" if len(scopes) > 1 else m for scope, _, judge in shown for m in judge.missing})
        contradicted = None
        if condition.contradicted is not None and not holding:
            contradicted = next((why for scope in scopes if (why := condition.contradicted(per_scope[scope])) is not None), None)
            if contradicted:
                evidence.append(Evidence("", None, None, "", False, f"cleared at once: {contradicted}", ""))
        advice = [f"{text} [{scope}]" if len(scopes) > 1 else text for scope, _, judge in holding for text in judge.advice]
        return _Outcome(raw, max(r[1].score for r in results), evidence, missing, best[2].cause, [r[0].key for r in holding], contradicted, advice=advice)


def actions_for(actions: tuple[str, ...], cause: str | None) -> tuple[str, ...]:
    """The observed cause's actions first, then those for every cause, then the other causes' marked as such."""
    if cause is None:
        return actions
    mine = tuple(a for a in actions if a.startswith((f"cause={cause}:", f"cause={cause},")))
    general = tuple(a for a in actions if not a.startswith("cause="))
    return mine + general + tuple(f"(other cause) {a}" for a in actions if a.startswith("cause=") and a not in mine)


def _suppress(outcomes: dict[str, _Outcome]) -> None:
    """One story per server: a condition whose evidence another holding condition explains does not
    hold (its Condition.suppressed_by); its evidence stays, with the reason."""
    for condition_id, outcome in outcomes.items():
        if not outcome.raw:
            continue
        for other, why in CONDITIONS_BY_ID[condition_id].suppressed_by:
            if other in outcomes and outcomes[other].raw:
                outcome.raw, outcome.suppressed_by, outcome.scopes, outcome.advice = False, other, [], []
                outcome.evidence.append(Evidence("", None, None, "", False, f"suppressed by {other}: {why}", ""))
                break


def _primary(states: list[tuple[Condition, _Debounce]]) -> str | None:
    """The primary verdict: the first active one by precedence, for its observed cause (its fix comes first); the other
    active ones are secondary to it."""
    active = [(dict(c.precedence_by_cause).get(d.cause or "", c.precedence), c.id) for c, d in states if d.active]
    return min(active, key=lambda placed: placed[0])[1] if active else None
