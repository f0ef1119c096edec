"""Terminal renderings of snapshots: the on-call report (diagnose) and the verdict timeline (replay)."""

from __future__ import annotations

import datetime as dt

from .model import Snapshot, Verdict

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _holding(verdict: Verdict) -> bool:
    return verdict.active or verdict.raw is True


def format_report(snapshot: Snapshot, target: str) -> str:
    lines = [
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
            lines.extend(f"      - {action}" for action in v.next_actions)
    else:
        lines.append("NOTHING WRONG FOUND among the conditions that could be judged.")
    if unknown:
        lines.append("")
        lines.append("COULD NOT JUDGE")
        for v in unknown:
            lines.append(f"  {v.condition}: missing {', '.join(v.missing) or 'inputs'}")
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
