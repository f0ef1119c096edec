"""Terminal renderings of snapshots: the on-call report (diagnose, /report) and the verdict timeline (replay).

The report opens with one screen (at most HEADLINE_LINES lines): the primary verdict, its cause, since when, the numbers
that decided it, the one thing to do for that cause and its runbook, then the other verdicts one line each. The full
evidence follows below a rule; the actions for causes not observed only with `verbose` (the JSON keeps everything)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from .diagnosis.condition import runbook_url
from .model import Snapshot, Verdict

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
HEADLINE_LINES = 10
DECIDING_NUMBERS = 3  # of the comparisons that hold, in the predicate's order
RULE = "-" * 100


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _holding(verdict: Verdict) -> bool:
    return verdict.active or verdict.raw is True


def _for(seconds: float) -> str:
    minutes, secs = divmod(max(0, round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _since(verdict: Verdict, now: float) -> str:
    if verdict.since is None or verdict.since >= now:  # a one-shot diagnosis knows no onset
        return ""
    return f" since {dt.datetime.fromtimestamp(verdict.since, dt.timezone.utc).strftime('%H:%M:%S UTC')} ({_for(now - verdict.since)})"


def _one_action(verdict: Verdict) -> str:
    """What to do first: the advice computed from what was observed, else the observed cause's action, else the first."""
    if verdict.advice:
        return verdict.advice[0]
    mine = [a.split(":", 1)[1].strip() for a in verdict.next_actions if verdict.cause and a.startswith(f"cause={verdict.cause}")]
    return (mine or [a for a in verdict.next_actions if not a.startswith("(other cause)")] or [""])[0]


def headline(snapshot: Snapshot, target: str) -> list[str]:
    """The first screen: what holds, since when, why, what to do; at most HEADLINE_LINES lines."""
    now = snapshot.timestamp
    lines = [f"vllm-triage: {target} at {_when(now)}"]
    holding = sorted((v for v in snapshot.verdicts if v.active), key=lambda v: (v.role != "primary", SEVERITY_ORDER.get(v.severity, 9), -v.score))
    primary = next((v for v in holding if v.condition == snapshot.primary), holding[0] if holding else None)
    if primary is None:
        if snapshot.vllm_starting_seconds is not None:
            lines.append(f"STARTING  vLLM has not answered for {_for(snapshot.vllm_starting_seconds)}: loading, not down (yet)")
        else:
            lines.append("OK        nothing wrong found among the conditions that could be judged")
        blind = [v for v in snapshot.verdicts if v.state == "unknown" and not v.held]
        if blind:
            lines.append(f"BLIND     {len(blind)} condition(s) could not be judged: see COULD NOT JUDGE below")
        return lines
    cause = f" (cause {primary.cause})" if primary.cause else ""
    scopes = f" on {', '.join(primary.scopes)}" if primary.scopes else ""
    lines.append(f"PRIMARY   [{primary.severity}] {primary.condition}{cause}{scopes}{_since(primary, now)}")
    lines.append(f"          {primary.summary}")
    # the comparisons that held against a real bar first ("is > 0" only says there was work)
    deciding = sorted((e for e in primary.evidence if e.holds and e.comparison), key=lambda e: not e.threshold)[:DECIDING_NUMBERS]
    if deciding:
        lines.append(f"BECAUSE   {'; '.join(e.text for e in deciding)}")
    if action := _one_action(primary):
        lines.append(f"DO        {action}")
    lines.append(f"RUNBOOK   {runbook_url(primary.condition)}")
    others = [v for v in holding if v is not primary]
    room = HEADLINE_LINES - len(lines)
    shown = others if len(others) <= room else others[: room - 1]
    for v in shown:
        lines.append(f"ALSO      [{v.severity}] {v.condition}" + (f" (cause {v.cause})" if v.cause else "") + f"{_since(v, now)}: {v.summary}")
    if len(shown) < len(others):
        lines.append(f"ALSO      {len(others) - len(shown)} more: below")
    return lines


def _unknown_lines(unknown: list[Verdict]) -> list[str]:
    """Conditions that could not be judged, grouped by what they miss: one reason once, with how many it blinds."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for v in unknown:
        for reason in v.missing or ("inputs",):
            by_reason[reason].append(v.condition)
    return [f"  {len(names)} condition(s) missing {reason}: {', '.join(names)}" for reason, names in by_reason.items()]


def format_report(snapshot: Snapshot, target: str, verbose: bool = False) -> str:
    lines = [*headline(snapshot, target), RULE, ""]
    lines += [
        f"vllm-triage diagnosis of {target}",
        f"  at {_when(snapshot.timestamp)}, over the last {snapshot.window_seconds:.0f} s",
    ]
    found = snapshot.discovery
    lines.append(f"  vLLM version: {found.vllm_version or 'unknown'}; {found.max_num_seqs_text}")
    lines.extend(f"  {line}" for line in found.parallelism)
    for health in snapshot.sources:
        state = "up" if health.up else ("down" if health.up is False else "no reading")
        detail = f" (last error: {health.last_error})" if health.last_error and not health.up else ""
        lines.append(f"  source {health.source}: {state}{detail}")
    holding = sorted((v for v in snapshot.verdicts if _holding(v)), key=lambda v: (SEVERITY_ORDER.get(v.severity, 9), -v.score))
    unknown = [v for v in snapshot.verdicts if v.state == "unknown" and not v.held]
    clear = [v for v in snapshot.verdicts if not _holding(v) and v.state != "unknown"]
    lines.append("")
    if snapshot.vllm_starting_seconds is not None:
        unreachable = next((v for v in snapshot.verdicts if v.condition == "vllm_unreachable"), None)
        why = next((e.text for e in unreachable.evidence if e.text.startswith("starting")), "") if unreachable else ""
        lines.append(f"STARTING: vLLM has not answered for {snapshot.vllm_starting_seconds:.0f} s (starting?)" + (f"; {why}" if why else ""))
        lines.append("")
    if snapshot.primary:
        lines.append(f"PRIMARY: {snapshot.primary} (the verdict whose fix comes first; the others below are secondary to it)")
        lines.append("")
    if holding:
        lines.append("WHAT IS WRONG (most severe first)")
        for v in holding:
            cause = f" [cause: {v.cause}]" if v.cause else ""
            engines = f" on {', '.join(v.scopes)}" if v.scopes else ""
            # The daemon debounces: a predicate that holds now is reported active only once it held for `for`.
            pending = "" if v.active else " (holds now; not active until it has held for its `for` duration)"
            if v.held:
                pending = f" (inputs missing: {', '.join(v.missing) or 'unknown'}; held active until its clear_for passes)"
            lines.append(f"  [{v.severity}] {v.condition}{cause}{engines}: {v.summary}{pending}")
            lines.append("    evidence:")
            lines.extend(f"      - {e.text}" + (f" [{e.scope}]" if e.scope and len(v.scopes) > 1 else "") for e in v.evidence)
            lines.extend(f"      - stale: {note}" for note in v.stale)
            if v.advice:
                lines.append("    advice (computed from what was observed):")
                lines.extend(f"      - {text}" for text in v.advice)
            lines.append("    next actions:")
            others = [a for a in v.next_actions if a.startswith("(other cause)")]
            lines.extend(f"      - {action}" for action in v.next_actions if verbose or action not in others)
            if others and not verbose:
                lines.append(f"      ({len(others)} more for causes not observed: --verbose, or /report?verbose=1)")
    else:
        lines.append("NOTHING WRONG FOUND among the conditions that could be judged.")
    if unknown:
        lines.append("")
        lines.append("COULD NOT JUDGE")
        lines.extend(_unknown_lines(unknown))
    suppressed = [v for v in clear if v.suppressed_by]
    if suppressed:
        lines.append("")
        lines.append("EXPLAINED BY ANOTHER VERDICT: " + ", ".join(f"{v.condition} (by {v.suppressed_by})" for v in suppressed))
    if clear:
        lines.append("")
        lines.append("NOT HOLDING: " + ", ".join(v.condition for v in clear if not v.suppressed_by))
    return "\n".join(lines) + "\n"


def format_transition(start: float, now: float, before: str | None, verdict: Verdict) -> str:
    cause = f" cause={verdict.cause}" if verdict.cause and verdict.active else ""
    first = next((e.text for e in verdict.evidence if e.holds), "")
    detail = f"  ({first})" if verdict.active and first else ""
    return f"+{now - start:7.1f}s  {verdict.condition:<28} {before or '-':>8} -> {verdict.state:<8} score={verdict.score:.2f}{cause}{detail}"
