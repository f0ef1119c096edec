"""`vllm-triage fleet`: every vLLM server a Prometheus scraped, each judged on its own history by the same
pipeline, listed by severity, with replicas of one model whose queues diverge (imbalance)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from ..config import Config
from ..model import Snapshot
from ..pipeline import replay
from ..scope import AGGREGATE_SCOPE
from .prometheus import HistoryError, HistoryLimits, PrometheusHistory, list_servers, parse_selector

MAX_SERVERS = 50
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
IMBALANCE_WAITING_MIN = 5.0  # as the VllmReplicaImbalance alert: one replica queues this many on average ...
IMBALANCE_SIBLING_MAX = 1.0  # ... while a sibling of the same model queues fewer than this


@dataclass(frozen=True)
class Server:
    namespace: str
    pod: str
    instance: str
    model: str
    snapshot: Snapshot | None
    error: str | None = None

    @property
    def name(self) -> str:
        return "/".join(part for part in (self.namespace, self.pod or self.instance) if part)

    def severity_rank(self) -> int:
        active = [v for v in self.snapshot.verdicts if v.active] if self.snapshot else []
        return min((SEVERITY_ORDER.get(v.severity, 3) for v in active), default=3 if self.snapshot else -1)

    def waiting(self) -> float | None:
        if self.snapshot is None:
            return None
        return self.snapshot.signals.get(AGGREGATE_SCOPE, {}).get("requests_waiting_mean")


def target_matchers(target: dict[str, str]) -> str:
    """The matchers that pick one server, its label values quoted as PromQL strings (a quote or a backslash in a
    value is escaped, not spliced into the query)."""
    return ",".join(f"{k}={json.dumps(target[k])}" for k in ("namespace", "pod", "instance") if target.get(k))


async def judge_fleet(url: str, selector: str, at: float, seconds: float, config: Config, step: float) -> list[Server]:
    """Each server's verdicts at `at`, judged on the `seconds` of its history before it."""
    matchers = parse_selector(selector)
    servers = []
    for target in await list_servers(url, matchers, at, MAX_SERVERS):
        own = target_matchers(target)
        history = PrometheusHistory(url, "{" + own + "}", HistoryLimits(step_seconds=step))
        common = (target.get("namespace", ""), target.get("pod", ""), target.get("instance", ""), target.get("model_name", ""))
        try:
            readings = await history.readings(at - seconds, at)
        except HistoryError as error:
            servers.append(Server(*common, snapshot=None, error=str(error)))
            continue
        snapshot = await asyncio.to_thread(replay, readings, config, lambda _: None, at)
        servers.append(Server(*common, snapshot=snapshot))
    return sorted(servers, key=lambda s: (s.severity_rank(), s.name))


def imbalances(servers: list[Server]) -> list[str]:
    """Replicas of one model where one queues while a sibling idles: routing, not capacity."""
    lines = []
    by_model: dict[tuple[str, str], list[Server]] = {}
    for s in servers:
        by_model.setdefault((s.namespace, s.model), []).append(s)
    for (namespace, model), replicas in sorted(by_model.items()):
        waiting = {s.name: w for s in replicas if (w := s.waiting()) is not None}
        if len(waiting) < 2:
            continue
        busiest, idlest = max(waiting, key=lambda k: waiting[k]), min(waiting, key=lambda k: waiting[k])
        if waiting[busiest] >= IMBALANCE_WAITING_MIN and waiting[idlest] < IMBALANCE_SIBLING_MAX:
            lines.append(
                f"{namespace}/{model}: {busiest} has {waiting[busiest]:.1f} requests waiting on average while {idlest} has "
                f"{waiting[idlest]:.1f}: requests are routed unevenly (adding replicas will not help)"
            )
    return lines


def format_fleet(servers: list[Server], target: str) -> str:
    lines = [f"vllm-triage fleet: {len(servers)} vLLM server(s) in {target}", ""]
    for s in servers:
        if s.snapshot is None:
            lines.append(f"  [?] {s.name} ({s.model}): could not judge: {s.error}")
            continue
        active = [v for v in s.snapshot.verdicts if v.active]
        if not active:
            lines.append(f"  [ok] {s.name} ({s.model}): nothing wrong found")
            continue
        primary = next((v for v in active if v.condition == s.snapshot.primary), active[0])
        cause = f" [cause: {primary.cause}]" if primary.cause else ""
        others = ", ".join(v.condition for v in active if v is not primary)
        lines.append(f"  [{primary.severity}] {s.name} ({s.model}): {primary.condition}{cause}" + (f"; also {others}" if others else ""))
    found = imbalances(servers)
    if found:
        lines += ["", "REPLICA IMBALANCE", *(f"  {line}" for line in found)]
    return "\n".join(lines) + "\n"


def fleet_json(servers: list[Server]) -> str:
    records: list[dict[str, Any]] = []
    for s in servers:
        record: dict[str, Any] = {"namespace": s.namespace, "pod": s.pod, "instance": s.instance, "model_name": s.model}
        if s.snapshot is None:
            record["error"] = s.error
        else:
            record["primary"] = s.snapshot.primary
            record["active"] = [{"condition": v.condition, "severity": v.severity, "cause": v.cause} for v in s.snapshot.verdicts if v.active]
        records.append(record)
    return json.dumps({"servers": records, "imbalances": imbalances(servers)}, indent=1)
