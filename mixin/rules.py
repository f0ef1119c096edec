"""Prometheus alert and recording rules, their promtool tests, an Alertmanager example, a
PrometheusRule and the runbooks, all derived from the condition table (written by generate.py).

Two kinds of alerts: one per warning/critical condition, on the sidecar's debounced verdicts; and
a few straight on vLLM's own metrics (old and new names), which page even without the sidecar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vllm_triage.diagnosis.condition import RUNBOOK_URL, alert_name
from vllm_triage.diagnosis.conditions import CONDITIONS, CONDITIONS_BY_ID, PRECEDENCE, Condition
from vllm_triage.diagnosis.engine import actions_for
from vllm_triage.exposition import exported_signal
from vllm_triage.model import HISTOGRAM_SUFFIXES
from vllm_triage.sources.vllm import spellings

# Scrape jobs, as the Helm chart and the compose stack name them; regenerate to change.
VLLM_JOB = 'job="vllm"'
SIDECAR_JOB = 'job="vllm-triage"'


# The chart's rules judge the pods of their own release (monitoring.prometheusRule.scope: release): its scrape objects
# label every series with RELEASE_LABEL, and every selector of its rules asks for it, first (the template fills the
# placeholder in, or removes `RELEASE_MATCHER, ` and `{RELEASE_MATCHER}`: scope cluster).
RELEASE_LABEL = "vllm_triage_release"
RELEASE_MATCHER = f'{RELEASE_LABEL}="__RELEASE__"'


@dataclass(frozen=True)
class Selectors:
    """Every series selector of the rules and panels, made whole where the expression is written: with the release
    matcher first (the chart's copy of the rules) or without it (the rules file, the dashboards). No expression is
    rewritten after it is written."""

    release: str = ""

    def __call__(self, name: str, *matchers: str) -> str:
        """A series of the sidecar, of Prometheus (`up`) or of a recording rule: `name{release, matchers}`."""
        inner = ", ".join(m for m in (self.release, *matchers) if m)
        return f"{name}{{{inner}}}" if inner else name

    def vllm(self, name: str, *matchers: str) -> str:
        """One of vLLM's metrics (a histogram's `_bucket`, `_sum`, `_count` too) under every name vLLM has exported it
        (sources/vllm.py's RENAMES): `name{...}`, or `{release, __name__=~"name|older", matchers}` where it was renamed,
        so that every rule and panel works whatever vLLM version a server runs, and a rename is that table's entry."""
        base, suffix = name, ""
        for histogram_suffix in HISTOGRAM_SUFFIXES:
            if name.endswith(histogram_suffix) and len(spellings(name[: -len(histogram_suffix)])) > 1:
                base, suffix = name[: -len(histogram_suffix)], histogram_suffix
        names = [f"{spelling}{suffix}" for spelling in spellings(base)]
        if len(names) == 1:
            return self(name, *matchers)
        return "{" + ", ".join(m for m in (self.release, f'__name__=~"{"|".join(names)}"', *matchers) if m) + "}"


SELECT = Selectors()  # the rules file's and the dashboards'
CHART_SELECT = Selectors(RELEASE_MATCHER)


KEEP_FIRING_FOR = "5m"
# Capacity is a warning with a longer `for` (llm-d's tiers): an autoscaler or a ticket handles it; pages are for users' harm.
CAPACITY = ("kv_cache_saturated", "queue_backlog", "preemption_storm")
CAPACITY_FOR = "10m"
# Liveness pages by blast radius: one replica down (an OOM kill, a node drain, its model reloading) is a ticket once it
# outlasts a restart, and a page once it outlasts a start-up (the chart's vllm.startupSeconds); VllmModelUnavailable pages
# when too few of a model's replicas answer, once per model.
REPLICA_LIVENESS = ("vllm_unreachable",)
REPLICA_DOWN_FOR = "10m"
REPLICA_DOWN_LONG_FOR = "30m"  # the chart's default vllm.startupSeconds (1800 s); its template writes the install's
KV_FULL_FOR = "6m"


def _anchor(name: str) -> str:
    return name.lower()


def exported_reads(condition: Condition, count: int) -> list[tuple[str, str, tuple[tuple[str, str], ...], tuple[str, ...]]]:
    """(signal, family, its extra labels, its scope labels) of the first `count` exported signals the condition reads,
    the most telling first: what its dashboard panel plots and its alert text quotes."""
    shown = []
    for signal_id in condition.reads:
        if (exported := exported_signal(signal_id)) is not None:
            shown.append((signal_id, *exported))
        if len(shown) == count:
            break
    return shown


ALERT_VALUES = 3  # the readings an alert's text quotes


def value_format(signal_id: str) -> str:
    """The template function that prints a signal's value in its unit (Prometheus' humanize functions)."""
    words = signal_id.split("_")
    if "ratio" in words:
        return "humanizePercentage"
    if "seconds" in words:
        return "humanizeDuration"
    return "humanize"


def _query(series: str, matchers: str = "") -> str:
    """A template query of a sidecar series of the alert's own instance (`matchers`: more, escaped for the string)."""
    return f'printf "{series}{{instance=\\"%s\\"{matchers}}}" $labels.instance | query'


def _values_text(condition: Condition) -> str:
    """' Now: a=1 b=2.' from the sidecar's own series of that instance (what its dashboard plots); nothing at all where
    every one is absent (collected in a template variable first: no bare 'Now:.')."""
    parts = []
    for signal_id, family, extra, _ in exported_reads(condition, ALERT_VALUES):
        labels = "".join(f',{k}=\\"{v}\\"' for k, v in extra)
        shown = f'{{{{ $now = printf "%s {signal_id}=%s" $now (.Value | {value_format(signal_id)}) }}}}'
        parts.append(f"{{{{ with {_query(family, labels)} }}}}{{{{ range . }}}}{shown}{{{{ end }}}}{{{{ end }}}}")
    return '{{ $now := "" }}' + "".join(parts) + "{{ if $now }} Now:{{ $now }}.{{ end }}" if parts else ""


def first_step(condition: Condition, cause: str | None) -> str:
    """The first action for the observed cause (its own, else the general one), without its `cause=...:` prefix; with no
    cause observed, the first action for every cause (or where to read it, when each action belongs to a cause)."""
    if cause is None:
        return next((a for a in condition.next_actions if not a.startswith("cause=")), "read its cause and evidence on /diagnosis.")
    action = actions_for(condition.next_actions, cause)[0]
    return action.split(": ", 1)[1] if action.startswith("cause=") else action


def _cause_text(condition: Condition) -> str:
    """' Cause: c. First step: <c's first action>' from vllm_triage_condition_cause of the instance; the general first
    step where no cause series reads 1."""
    general = f" First step: {first_step(condition, None)}"
    if not condition.causes:
        return general
    branches = "".join(
        f'{{{{ {"if" if i == 0 else "else if"} eq .Labels.cause "{cause}" }}}}{first_step(condition, cause)}' for i, cause in enumerate(condition.causes)
    )
    query = _query("vllm_triage_condition_cause", f',condition=\\"{condition.id}\\"').replace('}" $labels', '} == 1" $labels')
    return (
        f"{{{{ with {query} }}}}{{{{ range . }}}} Cause: {{{{ .Labels.cause }}}}. First step: {branches}"
        f"{{{{ else }}}}{first_step(condition, None)}{{{{ end }}}}{{{{ end }}}}{{{{ else }}}}{general}{{{{ end }}}}"
    )


def condition_alerts(select: Selectors = SELECT) -> list[dict[str, Any]]:
    rules = []
    for c in CONDITIONS:
        if c.severity not in ("warning", "critical"):
            continue
        name = alert_name(c.id)
        rules.append(
            {
                "alert": name,
                # The sidecar already debounced the verdict with the table's for/clear_for; keep_firing_for rides
                # through a sidecar restart or missed scrapes, so that one incident is one notification.
                "expr": select("vllm_triage_condition_active", f'condition="{c.id}"') + " == 1",
                **({"for": CAPACITY_FOR} if c.id in CAPACITY else {"for": REPLICA_DOWN_FOR} if c.id in REPLICA_LIVENESS else {}),
                "keep_firing_for": KEEP_FIRING_FOR,
                "labels": {"severity": "warning" if c.id in REPLICA_LIVENESS else c.severity},
                "annotations": {
                    "summary": f"{{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}}: {c.summary}",
                    "description": f"{c.meaning}{_values_text(c)}{_cause_text(c)} See /diagnosis on {{{{ $labels.instance }}}} for the evidence.",
                    "runbook_url": f"{RUNBOOK_URL}#{_anchor(name)}",
                },
            }
        )
    return rules


# VllmKvCacheFull judges what kv_cache_saturated judges, with the table's own defaults.
_KV_SATURATED = {t.name: t.default for t in CONDITIONS_BY_ID["kv_cache_saturated"].thresholds}

# Service-level objectives on vLLM's own histograms and counters: (what, histogram or None for errors, its target in
# seconds, the objective). A latency target is one of vLLM's bucket bounds (TTFT: ... 1, 2.5, 5 ...; ITL: ... 0.075, 0.1,
# 0.15 ...): the share of requests under it is read from that bucket.
SLOS: dict[str, tuple[str, str | None, float, float]] = {
    "ttft": ("time to first token", "vllm:time_to_first_token_seconds", 2.5, 0.99),
    "itl": ("inter-token latency", "vllm:inter_token_latency_seconds", 0.1, 0.99),
    "errors": ("requests finished with an error", None, 0.0, 0.999),
}
# (short window, long window, burn rate, for, severity): the SRE workbook's multiwindow, multi-burn-rate alerts. A burn
# of 14.4 spends 2 % of a 30-day budget in an hour, 6 spends 5 % in 6 hours (pages); 3 and 1 spend 10 % in 1 and 3 days.
BURN_WINDOWS = (
    ("5m", "1h", 14.4, "2m", "critical"),
    ("30m", "6h", 6.0, "15m", "critical"),
    ("2h", "1d", 3.0, "1h", "warning"),
    ("6h", "3d", 1.0, "3h", "warning"),
)
SLO_RATE_WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# vLLM's bucket bounds of each latency SLO's histogram (the same from 0.26 to 0.33; 0.32+ changes them with
# --custom-histogram-buckets, which the chart takes as sloBuckets): a target must be one, or no recording rule reads it.
BUCKET_BOUNDS = {
    "ttft": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    "itl": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
}
# A latency objective the project guessed (a chat service's) is no objective of the team's: a batch deployment misses it
# for hours by design. Its fast burn opens a ticket until the install sets the target or the objective (the chart then
# makes it page); an error burn is harm whatever the workload and pages as it is.
GUESSED_SLOS = ("ttft", "itl")


def slo_severity(slo: str, severity: str) -> str:
    """The severity a burn alert carries in the generated rules: a guessed objective's fast burn is a warning."""
    return "warning" if slo in GUESSED_SLOS else severity


def slo_record(slo: str, window: str) -> str:
    return f"model_name:vllm_{slo}_slo_errors:ratio_rate{window}"


def _le(target: float) -> str:
    # vLLM writes bucket bounds as Python floats ("1.0", "2.5"); Prometheus 3 normalises them ("1")
    return f'le=~"{target:g}([.]0)?"'


def _slo_ratio(slo: str, window: str, select: Selectors) -> str:
    _, histogram, target, _ = SLOS[slo]
    by = "sum by (namespace, model_name)"
    if histogram is None:
        errors, requests = select.vllm("vllm:request_success_total", 'finished_reason="error"'), select.vllm("vllm:request_success_total")
        return f"{by} (rate({errors}[{window}])) / {by} (rate({requests}[{window}]))"
    good, total = select.vllm(f"{histogram}_bucket", _le(target)), select.vllm(f"{histogram}_count")
    return f"1 - {by} (rate({good}[{window}])) / {by} (rate({total}[{window}]))"


def slo_recording_rules(select: Selectors = SELECT) -> list[dict[str, str]]:
    return [{"record": slo_record(slo, window), "expr": _slo_ratio(slo, window, select)} for slo in SLOS for window in SLO_RATE_WINDOWS]


def _budget(objective: float) -> str:
    return f"(1 - {objective:g})"


def slo_alert_name(slo: str, severity: str) -> str:
    return f"Vllm{slo.capitalize()}SloBurn{'Fast' if severity == 'critical' else 'Slow'}"


def slo_alerts(select: Selectors = SELECT) -> list[dict[str, Any]]:
    rules = []
    for slo, (what, histogram, target, objective) in SLOS.items():
        for severity in ("critical", "warning"):
            windows = [w for w in BURN_WINDOWS if w[4] == severity]
            expr = " or ".join(
                f"({select(slo_record(slo, long))} > ({burn:g} * {_budget(objective)}) and {select(slo_record(slo, short))} > ({burn:g} * {_budget(objective)}))"
                for short, long, burn, _, _ in windows
            )
            missed = f"took longer than the {target:g} s target for their {what}" if histogram else "finished with an error"
            pace = (
                "fast: at this rate the 30-day error budget is gone in days"
                if severity == "critical"
                else "steadily: the 30-day budget will not last the month"
            )
            name = slo_alert_name(slo, severity)
            rules.append(
                {
                    "alert": name,
                    "expr": expr,
                    "for": windows[0][3],
                    "labels": {"severity": slo_severity(slo, severity), "slo": slo},
                    "annotations": {
                        "summary": f"{{{{ $labels.namespace }}}}/{{{{ $labels.model_name }}}}: the {what} SLO burns its error budget {'fast' if severity == 'critical' else 'steadily'}",
                        "description": f"{{{{ $value | humanizePercentage }}}} of the requests over the last {windows[0][1]} or more {missed}; "
                        f"the objective allows {1 - objective:.1%}. The budget burns {pace}. Users are affected across the model's replicas.",
                        "runbook_url": f"{RUNBOOK_URL}#{name.lower()}",
                    },
                }
            )
    return rules


# The numbers of vLLM-side rules an install tunes (the chart's monitoring.prometheusRule.vllmThresholds): each is
# written as `text` in the rules named (and nowhere else), which the chart's template replaces with `format` % value.
VLLM_THRESHOLDS: dict[str, dict[str, Any]] = {
    "kvCacheUsageMean": {
        "rules": ["VllmKvCacheFull"],
        "default": _KV_SATURATED["usage_min"],
        "what": "5-minute mean of KV usage, at or above",
        "format": ">= %v and",
    },
    "kvCacheUsagePeak": {
        "rules": ["VllmKvCacheFull"],
        "default": _KV_SATURATED["usage_peak_min"],
        "what": "... and its 5-minute peak, at or above",
        "format": ">= %v and",
    },
    "replicasAnsweringMin": {
        "rules": ["VllmModelUnavailable"],
        "default": 0.5,
        "what": "share of a model's replicas that answer, below which the model pages",
        "format": "< %v",
    },
    "requestsWaitingMin": {
        "rules": ["VllmRequestsWaiting", "VllmRequestsWaitingPersistent"],
        "default": 0.0,
        "maximum": 1e6,
        "what": "requests waiting throughout 2 minutes, above",
        "format": "[2m]) > %v",
    },
}
for _slo, (_what, _histogram, _target, _objective) in SLOS.items():
    _alerts = [slo_alert_name(_slo, severity) for severity in ("critical", "warning")]
    # a team that sets its objective or target makes its fast burn page (the chart sets the severity back to critical)
    _pages = {"pages": [slo_alert_name(_slo, "critical")]} if _slo in GUESSED_SLOS else {}
    VLLM_THRESHOLDS[f"{_slo}Objective"] = {
        "rules": _alerts,
        "default": _objective,
        "what": f"{_what} SLO: the share of requests that must meet it",
        "format": "(1 - %v)",
        **_pages,
    }
    if _histogram is not None:
        VLLM_THRESHOLDS[f"{_slo}TargetSeconds"] = {
            "rules": [slo_record(_slo, w) for w in SLO_RATE_WINDOWS],
            "default": _target,
            "maximum": 3600.0,
            "what": f"{_what} SLO target in seconds: one of vLLM's bucket bounds ({', '.join(f'{b:g}' for b in BUCKET_BOUNDS[_slo])})",
            "format": 'le=~"%v([.]0)?"',
            "slo": _slo,
            "bounds": list(BUCKET_BOUNDS[_slo]),
            **_pages,
        }


def threshold_text(key: str, value: float) -> str:
    """What a tunable's rules say at `value`: its text in the rules file at the default, and what the chart's template
    writes in its place for an install's `vllmThresholds.<key>`."""
    return str(VLLM_THRESHOLDS[key]["format"]).replace("%v", f"{value:g}")


for _key, _tunable in VLLM_THRESHOLDS.items():
    _tunable["text"] = threshold_text(_key, _tunable["default"])


def vllm_alerts(select: Selectors = SELECT) -> list[dict[str, Any]]:
    """The alerts on vLLM's own metrics and on the scrapes themselves (they page even without the sidecar)."""
    kv_usage = select.vllm("vllm:kv_cache_usage_perc")  # straight from vLLM, whichever name its version exports
    waiting = select.vllm("vllm:num_requests_waiting")
    waiting_avg = select("pod:vllm_num_requests_waiting:avg5m")
    starting = select("vllm_triage_vllm_starting")
    # The sidecar's word that vLLM has not answered yet and the host shows it loading (else VllmTriageVllmUnreachable).
    is_starting = f"{starting} == 1"
    # vLLM's own target is down and someone can tell it is no start: its sidecar says vLLM is not starting, or, with no
    # sidecar series at all, vLLM's target was up within the hour. A new pod whose sidecar has not started yet (the
    # sidecar is the second container: it starts after vLLM's image is pulled, minutes) is neither: a rollout pages nobody.
    not_a_start = f"({starting} == 0 or max_over_time({select('up', VLLM_JOB)}[1h]) == 1 unless on (namespace, pod) {starting})"
    return [
        {
            "alert": "VllmKvCacheFull",
            # Mostly full on average, full at least once (a saturated cache dips at each preemption: a
            # real vLLM with 39 blocks averaged 0.90-0.95), and requests queueing: the sidecar's
            # kv_cache_saturated, computed by Prometheus alone.
            "expr": (
                f"avg_over_time({kv_usage}[5m]) >= {_KV_SATURATED['usage_min']:g}"
                f" and max_over_time({kv_usage}[5m]) >= {_KV_SATURATED['usage_peak_min']:g}"
                f" and avg_over_time({waiting}[5m]) > 0"
            ),
            # its 5-minute mean crosses 0.8 about 4 minutes after the cache fills: 6 more make the 10 minutes it says
            "for": KV_FULL_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: vLLM KV cache has been full for 10 minutes ({{ $labels.model_name }})",
                "description": "KV cache usage averaged {{ $value | humanizePercentage }} over 5 minutes, reached 100 %, and requests queued: new requests wait, running ones are preempted.",
                "runbook_url": f"{RUNBOOK_URL}#vllmkvcachefull",
            },
        },
        {
            "alert": "VllmRequestsWaiting",
            "expr": f"min_over_time({waiting}{VLLM_THRESHOLDS['requestsWaitingMin']['text']}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: vLLM has had requests waiting for 5 minutes ({{ $labels.model_name }})",
                "description": "At least {{ $value }} request(s) waited throughout the last minutes: demand exceeds what the server admits.",
                "runbook_url": f"{RUNBOOK_URL}#vllmrequestswaiting",
            },
        },
        {
            "alert": "VllmRequestsWaitingPersistent",
            "expr": f"min_over_time({waiting}{VLLM_THRESHOLDS['requestsWaitingMin']['text']}",
            "for": "20m",
            # a queue held for 20 minutes is normal for batch serving: users' harm pages through the SLO burn alerts
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: vLLM has had requests waiting for 20 minutes ({{ $labels.model_name }})",
                "description": "The queue has not emptied for 20 minutes ({{ $value }} waiting at least): users see long time-to-first-token.",
                "runbook_url": f"{RUNBOOK_URL}#vllmrequestswaitingpersistent",
            },
        },
        {
            "alert": "VllmReplicaImbalance",
            # One replica of a model queues while a sibling idles: the load balancer, not capacity, is the
            # problem (client-IP stickiness, a prefix-aware router pinning a hot prefix, a slow pod kept in rotation).
            "expr": (f"{waiting_avg} >= 5 and on (namespace, model_name) (min by (namespace, model_name) ({waiting_avg}) < 1)"),
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: {{ $value }} requests wait while another replica of {{ $labels.model_name }} has none",
                "description": "One replica queues while a sibling idles: requests are routed unevenly. Adding replicas will not help; fix the routing.",
                "runbook_url": f"{RUNBOOK_URL}#vllmreplicaimbalance",
            },
        },
        {
            "alert": "VllmFleetSaturated",
            # Most replicas of one model queue at once: the fleet is at capacity, one incident however many pods page their
            # own capacity verdicts (the example groups those by namespace and alert). More than half, of two or more.
            "expr": (
                f"count by (namespace, model_name) ({waiting_avg} >= 1)"
                f" / count by (namespace, model_name) ({waiting_avg}) > 0.5"
                f" and count by (namespace, model_name) ({waiting_avg}) >= 2"
            ),
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.model_name }}: {{ $value | humanizePercentage }} of its replicas queue requests at once",
                "description": "Most replicas of the model queue at the same time: the fleet is at capacity, not one pod. Add replicas (raise the "
                "autoscaler's maximum); the per-pod capacity alerts of these replicas are this one incident.",
                "runbook_url": f"{RUNBOOK_URL}#vllmfleetsaturated",
            },
        },
        {
            "alert": "VllmTargetDown",
            # Not while the pod's sidecar says vLLM is still loading its model (a pod start, a rollout: minutes), nor while a
            # new pod's sidecar has not started. One replica: a ticket once it outlasts a restart (the model-level alert pages).
            "expr": f"{select('up', VLLM_JOB)} == 0 and on (namespace, pod) {not_a_start}",
            "for": REPLICA_DOWN_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: Prometheus cannot scrape vLLM",
                "description": "vLLM's /metrics on {{ $labels.instance }} has failed for 10 minutes: the server is down, restarting or hung.",
                "runbook_url": f"{RUNBOOK_URL}#vllmtargetdown",
            },
        },
        {
            "alert": "VllmTriageVllmUnreachableLong",
            # one replica down for longer than a start-up may take: no restart brings it back by itself
            "expr": select("vllm_triage_condition_active", 'condition="vllm_unreachable"') + " == 1",
            "for": REPLICA_DOWN_LONG_FOR,
            "keep_firing_for": KEEP_FIRING_FOR,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: vLLM has been unreachable for longer than a start-up",
                "description": "The sidecar has not read vLLM's metrics for longer than the pod's start-up budget: it is not restarting, it "
                "is down (the sidecar's vllm_unreachable cause says how). See /diagnosis on {{ $labels.instance }} for the evidence.",
                "runbook_url": f"{RUNBOOK_URL}#vllmtriagevllmunreachablelong",
            },
        },
        {
            "alert": "VllmModelUnavailable",
            # the share of a model's replicas whose vLLM answers (their sidecars' vllm source up), of those neither starting
            # nor gone: none answers (a model of one replica), or too few
            "expr": f"({select(ANSWERING_RECORD)} or {select(REPLICAS_RECORD)} * 0) / {select(REPLICAS_RECORD)} {VLLM_THRESHOLDS['replicasAnsweringMin']['text']}",
            # one minute: each replica's own verdict is debounced by its sidecar, starting ones left out; a vLLM that never
            # starts then pages within 5 minutes (150 s to not_started, its 15 s, this minute, Alertmanager's 30 s)
            "for": "1m",
            "keep_firing_for": KEEP_FIRING_FOR,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.model_name }}: {{ $value | humanizePercentage }} of the model's replicas answer",
                "description": "Too few of the model's replicas answer (their vLLM does not, past its start-up): users of the model get "
                "errors or wait. An empty model name: pods whose vLLM never answered and whose command line names no model. "
                "The pods' own VllmTriageVllmUnreachable tickets name each replica's cause.",
                "runbook_url": f"{RUNBOOK_URL}#vllmmodelunavailable",
            },
        },
        {
            "alert": "VllmTriageDown",
            "expr": f"{select('up', SIDECAR_JOB)} == 0",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: the vllm-triage sidecar cannot be scraped",
                "description": "The diagnosis for {{ $labels.instance }} is blind: check the sidecar container's restarts and logs.",
                "runbook_url": f"{RUNBOOK_URL}#vllmtriagedown",
            },
        },
        {
            "alert": "VllmTriageSourceDown",
            # Not while vLLM loads its model: the vllm, process and gil sources have nothing to read yet.
            "expr": f"{select('vllm_triage_source_up')} == 0 unless on (namespace, pod) {is_starting}",
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.namespace }}/{{ $labels.pod }}: vllm-triage source {{ $labels.source }} is down",
                "description": "The sidecar's {{ $labels.source }} source has failed for 10 minutes; conditions that need it are unknown. /diagnosis says why.",
                "runbook_url": f"{RUNBOOK_URL}#vllmtriagesourcedown",
            },
        },
    ]


REPLICAS_RECORD = "namespace_model_name:vllm_triage_replicas:count"
ANSWERING_RECORD = "namespace_model_name:vllm_triage_replicas_answering:count"


def replica_records(select: Selectors) -> list[dict[str, str]]:
    """A model's replicas, and those whose vLLM answers: each pod counted under the model its sidecar says it serves (what
    it said last, for 10 minutes, while it cannot be scraped and its target exists), a pod still starting in neither."""
    info = select("vllm_triage_vllm_model_info")
    # what the sidecar says now, else (its restart, a missed scrape) what it said last within 10 minutes
    served = f"({info} or (last_over_time({info}[10m]) unless on (namespace, pod) {info}))"
    replicas = f"({served} and on (namespace, pod) {select('up', SIDECAR_JOB)}) unless on (namespace, pod) {select('vllm_triage_vllm_starting')} == 1"
    vllm_read = select("vllm_triage_source_up", 'source="vllm"')
    answering = f"({replicas}) and on (namespace, pod) {vllm_read} == 1"
    return [
        {"record": REPLICAS_RECORD, "expr": f"count by (namespace, model_name) ({replicas})"},
        {"record": ANSWERING_RECORD, "expr": f"count by (namespace, model_name) ({answering})"},
    ]


def recording_rules(select: Selectors = SELECT) -> list[dict[str, str]]:
    """What the fleet dashboard and the fleet alerts read, per model or per pod across the fleet."""
    by_model = "sum by (namespace, model_name)"
    return [
        *replica_records(select),
        {
            "record": "namespace_condition:vllm_triage_condition_active:sum",
            "expr": f"sum by (namespace, condition, severity) ({select('vllm_triage_condition_active')})",
        },
        {"record": "model_name:vllm_num_requests_running:sum", "expr": f"{by_model} ({select.vllm('vllm:num_requests_running')})"},
        {"record": "model_name:vllm_num_requests_waiting:sum", "expr": f"{by_model} ({select.vllm('vllm:num_requests_waiting')})"},
        {"record": "model_name:vllm_kv_cache_usage_perc:max", "expr": f"max by (namespace, model_name) ({select.vllm('vllm:kv_cache_usage_perc')})"},
        {"record": "model_name:vllm_generation_tokens:rate5m", "expr": f"{by_model} (rate({select.vllm('vllm:generation_tokens_total')}[5m]))"},
        {
            "record": "pod:vllm_num_requests_waiting:avg5m",
            "expr": f"sum by (namespace, model_name, pod) (avg_over_time({select.vllm('vllm:num_requests_waiting')}[5m]))",
        },
        {"record": "model_name:vllm_prompt_tokens:rate5m", "expr": f"{by_model} (rate({select.vllm('vllm:prompt_tokens_total')}[5m]))"},
        {
            "record": "model_name:vllm_time_to_first_token_seconds:p95_5m",
            "expr": f"histogram_quantile(0.95, sum by (namespace, model_name, le) (rate({select.vllm('vllm:time_to_first_token_seconds_bucket')}[5m])))",
        },
        {"record": "namespace:vllm_triage_gpu_sm_active_ratio:avg", "expr": f"avg by (namespace) ({select('vllm_triage_gpu_sm_active_ratio')})"},
    ]


def rule_groups(select: Selectors = SELECT) -> list[dict[str, Any]]:
    return [
        {"name": "vllm-triage.conditions", "rules": condition_alerts(select)},
        {"name": "vllm-triage.vllm", "rules": vllm_alerts(select)},
        {"name": "vllm-triage.recording", "rules": recording_rules(select)},
        {"name": "vllm-triage.slo", "rules": slo_recording_rules(select) + slo_alerts(select)},
    ]


def rules_file() -> dict[str, Any]:
    return {"groups": rule_groups()}


def chart_rules_file() -> dict[str, Any]:
    """The rules as the chart ships them: every selector asks for RELEASE_MATCHER first (the template fills it in)."""
    return {"groups": rule_groups(CHART_SELECT)}


def prometheus_rule() -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule (the chart adds name and labels)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "vllm-triage", "labels": {"app.kubernetes.io/name": "vllm-triage"}},
        "spec": {"groups": rule_groups()},
    }


# --- promtool tests: for every alert, an input where it fires and a healthy one where it does not.
LABELS = 'namespace="llm",pod="vllm-0",instance="10.0.0.1:10290",job="vllm-triage"'
VLLM_LABELS = 'namespace="llm",pod="vllm-0",instance="10.0.0.1:8000",job="vllm",model_name="m",engine="0"'
STARTING_LABELS = 'namespace="llm",pod="vllm-2",instance="10.0.0.3:10290",job="vllm-triage"'
OLD_LABELS = 'namespace="llm",pod="old-0",instance="10.0.0.3:8000",job="vllm",model_name="m"'  # V0: no engine label


# A sample value in each unit and the text Prometheus renders for it.
_SAMPLE = {"humanizePercentage": ("0.5", "50%"), "humanizeDuration": ("3", "3s"), "humanize": ("7", "7")}
SCOPE_VALUES = {"engine": "0", "model_name": "m", "gpu": "0"}


def _condition_tests() -> list[dict[str, Any]]:
    tests = []
    for rule in condition_alerts():
        cid = rule["expr"].split('"')[1]
        c = next(c for c in CONDITIONS if c.id == cid)
        firing = f'vllm_triage_condition_active{{{LABELS},condition="{cid}",layer="{c.layer}",severity="{c.severity}"}}'
        healthy = firing.replace('pod="vllm-0"', 'pod="vllm-1"').replace("10.0.0.1", "10.0.0.2")
        # a capacity alert's own `for` delays each step by as much
        late = int(rule.get("for", "0m").removesuffix("m"))
        held = f"0 0 1x{10 + late} 0x5"
        series = [{"series": firing, "values": held}, {"series": healthy, "values": f"0x{17 + late}"}]
        # the readings the text quotes, each in its unit; the second cause where there are several (not the first action)
        now = []
        for signal_id, family, extra, scope_labels in exported_reads(c, ALERT_VALUES):
            value, text = _SAMPLE[value_format(signal_id)]
            labels = "".join(f',{k}="{SCOPE_VALUES[k]}"' for k in scope_labels) + "".join(f',{k}="{v}"' for k, v in extra)
            series.append({"series": f"{family}{{{LABELS}{labels}}}", "values": f"{value}x{17 + late}"})
            now.append(f" {signal_id}={text}")
        cause = c.causes[min(1, len(c.causes) - 1)] if c.causes else None
        if cause is not None:
            series.append({"series": f'vllm_triage_condition_cause{{{LABELS},condition="{cid}",cause="{cause}"}}', "values": held})
        said = (" Now:" + "".join(now) + "." if now else "") + (f" Cause: {cause}." if cause else "") + f" First step: {first_step(c, cause)}"
        description = f"{c.meaning}{said} See /diagnosis on 10.0.0.1:10290 for the evidence."
        expected_labels = {
            "severity": rule["labels"]["severity"],
            "condition": cid,
            "layer": c.layer,
            "namespace": "llm",
            "pod": "vllm-0",
            "instance": "10.0.0.1:10290",
            "job": "vllm-triage",
        }
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": rule["alert"], "exp_alerts": []},  # healthy: silent
                    {
                        "eval_time": f"{5 + late}m",
                        "alertname": rule["alert"],
                        "exp_alerts": [
                            {
                                "exp_labels": expected_labels,
                                "exp_annotations": {
                                    "summary": f"llm/vllm-0: {c.summary}",
                                    "description": description,
                                    "runbook_url": rule["annotations"]["runbook_url"],
                                },
                            }
                        ],
                    },
                    # the verdict went away at 13m (a sidecar restart, missed scrapes): still firing 2 min later ...
                    {
                        "eval_time": f"{15 + late}m",
                        "alertname": rule["alert"],
                        "exp_alerts": [
                            {
                                "exp_labels": dict(expected_labels),
                                "exp_annotations": {  # as last rendered while the verdict held
                                    "summary": f"llm/vllm-0: {c.summary}",
                                    "description": description,
                                    "runbook_url": rule["annotations"]["runbook_url"],
                                },
                            }
                        ],
                    },
                    # ... resolved once it stayed away for keep_firing_for
                    {"eval_time": f"{19 + late}m", "alertname": rule["alert"], "exp_alerts": []},
                ],
            }
        )
        if now and cid == "vllm_unreachable":  # its readings absent (a sidecar of an older version): no bare "Now:."
            bare = f" Cause: {cause}. First step: {first_step(c, cause)}" if cause else f" First step: {first_step(c, None)}"
            alone = [dict(s) for s in series if s["series"].startswith(("vllm_triage_condition_active", "vllm_triage_condition_cause"))]
            annotations = {
                "summary": f"llm/vllm-0: {c.summary}",
                "description": f"{c.meaning}{bare} See /diagnosis on 10.0.0.1:10290 for the evidence.",
                "runbook_url": rule["annotations"]["runbook_url"],
            }
            alert = {"exp_labels": dict(expected_labels), "exp_annotations": annotations}
            tests.append(
                {"interval": "1m", "input_series": alone, "alert_rule_test": [{"eval_time": f"{5 + late}m", "alertname": rule["alert"], "exp_alerts": [alert]}]}
            )
    return tests


def _render(template: str, labels: dict[str, str], value: str) -> str:
    """The few template forms the vLLM alerts use, rendered as Prometheus would."""
    text = template.replace("{{ $value | humanizePercentage }}", value).replace("{{ $value }}", value)
    for key, label in labels.items():
        text = text.replace(f"{{{{ $labels.{key} }}}}", label)
    return text


def _vllm_alert_tests() -> list[dict[str, Any]]:
    rules = {rule["alert"]: rule for rule in vllm_alerts()}

    def fires(alert: str, eval_time: str, labels: dict[str, str], value: str = "") -> dict[str, Any]:
        annotations = {k: _render(v, labels, value) for k, v in rules[alert]["annotations"].items()}
        return {"eval_time": eval_time, "alertname": alert, "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}]}

    def silent(alert: str, eval_time: str) -> dict[str, Any]:
        return {"eval_time": eval_time, "alertname": alert, "exp_alerts": []}

    base = {"namespace": "llm", "pod": "vllm-0", "instance": "10.0.0.1:8000", "job": "vllm", "model_name": "m", "engine": "0"}
    healthy = VLLM_LABELS.replace('pod="vllm-0"', 'pod="vllm-1"').replace("10.0.0.1", "10.0.0.2")
    full_idle = VLLM_LABELS.replace('pod="vllm-0"', 'pod="vllm-2"').replace("10.0.0.1", "10.0.0.4")
    busy_0, busy_1 = (labels.replace('model_name="m"', 'model_name="busy"') for labels in (VLLM_LABELS, healthy))
    return [
        {  # liveness by blast radius: one of two replicas down pages nobody, both down page once for the model; a replica
            # still starting counts in neither; a model of one replica that never answered pages once its start is over
            "interval": "1m",
            "input_series": [
                *(
                    series
                    for pod, model, answers, starting in (
                        ("chat-0", 'model_name="chat"', "1x3 0x25", "0x28"),
                        ("chat-1", 'model_name="chat"', "1x8 0x20", "0x28"),
                        ("chat-2", 'model_name="chat"', "0x28", "1x28"),  # a rollout's new pod, loading all along
                        ("solo-0", 'model_name="solo"', "0x28", "1x5 0x23"),
                        ("anon-0", "", "0x28", "1x5 0x23"),  # no command line seen, never answered: no model name
                    )
                    for series in (
                        {
                            "series": f'vllm_triage_vllm_model_info{{job="vllm-triage",namespace="llm",pod="{pod}"{"," + model if model else ""}}}',
                            "values": "1x28",
                        },
                        {"series": f'up{{job="vllm-triage",namespace="llm",pod="{pod}"}}', "values": "1x28"},
                        {"series": f'vllm_triage_source_up{{job="vllm-triage",namespace="llm",pod="{pod}",source="vllm"}}', "values": answers},
                        {"series": f'vllm_triage_vllm_starting{{job="vllm-triage",namespace="llm",pod="{pod}"}}', "values": starting},
                    )
                ),
            ],
            "alert_rule_test": [
                {
                    "eval_time": "5m",
                    "alertname": "VllmModelUnavailable",
                    "exp_alerts": [],
                },
                {
                    "eval_time": "12m",
                    "alertname": "VllmModelUnavailable",
                    "exp_alerts": [
                        *fires("VllmModelUnavailable", "12m", {"namespace": "llm", "model_name": "chat", "severity": "critical"}, "0%")["exp_alerts"],
                        *fires("VllmModelUnavailable", "12m", {"namespace": "llm", "model_name": "solo", "severity": "critical"}, "0%")["exp_alerts"],
                        {
                            "exp_labels": {"namespace": "llm", "severity": "critical"},
                            "exp_annotations": {
                                k: _render(v, {"namespace": "llm", "model_name": ""}, "0%") for k, v in rules["VllmModelUnavailable"]["annotations"].items()
                            },
                        },
                    ],
                },
            ],
        },
        {  # one replica down past a start-up's budget: no restart brings it back, it pages
            "interval": "1m",
            "input_series": [
                {"series": f'vllm_triage_condition_active{{{LABELS},condition="vllm_unreachable",layer="1",severity="critical"}}', "values": "0 0 1x40"},
            ],
            "alert_rule_test": [
                silent("VllmTriageVllmUnreachableLong", "25m"),
                fires(
                    "VllmTriageVllmUnreachableLong",
                    "35m",
                    {**_parse(LABELS), "condition": "vllm_unreachable", "layer": "1", "severity": "critical"},
                ),
            ],
        },
        {  # a saturated cache dips at every preemption: still pages; a busy-but-healthy one does not
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:kv_cache_usage_perc{{{VLLM_LABELS}}}", "values": "1 0.85 1 0.85 1 0.85 1 0.85 1 0.85 1 0.85 1 0.85 1"},
                {"series": f"vllm:num_requests_waiting{{{VLLM_LABELS}}}", "values": "20x15"},
                # busy but healthy: high usage, never full, nobody waiting
                {"series": f"vllm:kv_cache_usage_perc{{{healthy}}}", "values": "0.7 0.8 0.9 0.8 0.85 0.9 0.8 0.7 0.85 0.9 0.8 0.9 0.8 0.9 0.8"},
                {"series": f"vllm:num_requests_waiting{{{healthy}}}", "values": "0x15"},
                # full, but nobody waits: a cache sized exactly for its load is no reason to page
                {"series": f"vllm:kv_cache_usage_perc{{{full_idle}}}", "values": "1x15"},
                {"series": f"vllm:num_requests_waiting{{{full_idle}}}", "values": "0x15"},
            ],
            "alert_rule_test": [silent("VllmKvCacheFull", "4m"), fires("VllmKvCacheFull", "14m", {**base, "severity": "warning"}, "92.5%")],
        },
        {  # an idle cache that fills up and stays full, its queue growing: the alert comes 9-11 minutes in, as its text says (10)
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:kv_cache_usage_perc{{{VLLM_LABELS}}}", "values": "0x9 1x15"},
                {"series": f"vllm:num_requests_waiting{{{VLLM_LABELS}}}", "values": "0x9 12x15"},
            ],
            "alert_rule_test": [silent("VllmKvCacheFull", "18m"), fires("VllmKvCacheFull", "21m", {**base, "severity": "warning"}, "100%")],
        },
        {  # vLLM before 0.10 exports the old name
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:gpu_cache_usage_perc{{{OLD_LABELS}}}", "values": "1x15"},
                {"series": f"vllm:num_requests_waiting{{{OLD_LABELS}}}", "values": "4x15"},
            ],
            "alert_rule_test": [
                fires(
                    "VllmKvCacheFull",
                    "12m",
                    {"namespace": "llm", "pod": "old-0", "instance": "10.0.0.3:8000", "job": "vllm", "model_name": "m", "severity": "warning"},
                    "100%",
                )
            ],
        },
        {  # a queue that never empties: warning after 5 minutes, critical after 20; one that drains stays silent
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:num_requests_waiting{{{VLLM_LABELS}}}", "values": "3x30"},
                {"series": f"vllm:num_requests_waiting{{{healthy}}}", "values": "0 4 0 5 0 2 0 6 0 3 0 4 0 5 0 2 0 6 0 3 0 4 0 5 0 2 0 6 0 3 0"},
            ],
            "alert_rule_test": [
                silent("VllmRequestsWaiting", "3m"),
                fires("VllmRequestsWaiting", "10m", {**base, "severity": "warning"}, "3"),
                silent("VllmRequestsWaitingPersistent", "10m"),
                fires("VllmRequestsWaitingPersistent", "25m", {**base, "severity": "warning"}, "3"),
            ],
        },
        {  # one replica queues while its sibling idles: imbalance; two that both queue: capacity, not imbalance
            "interval": "1m",
            "input_series": [
                {"series": f"vllm:num_requests_waiting{{{VLLM_LABELS}}}", "values": "8x25"},
                {"series": f"vllm:num_requests_waiting{{{healthy}}}", "values": "0x25"},
                {"series": f"vllm:num_requests_waiting{{{busy_0}}}", "values": "8x25"},
                {"series": f"vllm:num_requests_waiting{{{busy_1}}}", "values": "9x25"},
            ],
            "alert_rule_test": [
                silent("VllmReplicaImbalance", "8m"),
                fires("VllmReplicaImbalance", "20m", {"namespace": "llm", "pod": "vllm-0", "model_name": "m", "severity": "warning"}, "8"),
                # both replicas of "busy" queue: the fleet is saturated; one of two of "m": no more than half
                silent("VllmFleetSaturated", "8m"),
                fires("VllmFleetSaturated", "20m", {"namespace": "llm", "model_name": "busy", "severity": "warning"}, "100%"),
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": 'up{job="vllm",instance="10.0.0.1:8000",namespace="llm",pod="vllm-0"}', "values": "1 1 0x20"},
                {"series": 'up{job="vllm",instance="10.0.0.2:8000",namespace="llm",pod="vllm-1"}', "values": "1x22"},
                {"series": 'up{job="vllm-triage",instance="10.0.0.1:10290",namespace="llm",pod="vllm-0"}', "values": "1 1 0x20"},
                {"series": 'up{job="vllm-triage",instance="10.0.0.2:10290",namespace="llm",pod="vllm-1"}', "values": "1x22"},
                # a rollout: the new pod's vLLM loads its model for 10 minutes, its sidecar says so; it counts only after
                {"series": 'up{job="vllm",instance="10.0.0.3:8000",namespace="llm",pod="vllm-2"}', "values": "0x30"},
                {"series": 'up{job="vllm-triage",instance="10.0.0.3:10290",namespace="llm",pod="vllm-2"}', "values": "1x30"},
                {"series": 'vllm_triage_vllm_starting{job="vllm-triage",instance="10.0.0.3:10290",namespace="llm",pod="vllm-2"}', "values": "1x10 0x20"},
                # a rollout with a slow image pull: vLLM's port is scraped (down) 3 minutes before its sidecar starts, which
                # then says starting until vLLM answers: nothing fires (the expectations below name every alert that does)
                {"series": 'up{job="vllm",instance="10.0.0.4:8000",namespace="llm",pod="vllm-3"}', "values": "0x7 1x23"},
                {"series": 'up{job="vllm-triage",instance="10.0.0.4:10290",namespace="llm",pod="vllm-3"}', "values": "0x2 1x28"},
                {"series": 'vllm_triage_vllm_starting{job="vllm-triage",instance="10.0.0.4:10290",namespace="llm",pod="vllm-3"}', "values": "_x3 1x5 0x22"},
            ],
            "alert_rule_test": [
                # one replica down: a ticket once it outlasts a restart (10 minutes), not before
                silent("VllmTargetDown", "9m"),
                fires("VllmTargetDown", "13m", {"job": "vllm", "instance": "10.0.0.1:8000", "namespace": "llm", "pod": "vllm-0", "severity": "warning"}),
                {
                    "eval_time": "22m",
                    "alertname": "VllmTargetDown",
                    "exp_alerts": [
                        *fires(
                            "VllmTargetDown", "22m", {"job": "vllm", "instance": "10.0.0.1:8000", "namespace": "llm", "pod": "vllm-0", "severity": "warning"}
                        )["exp_alerts"],
                        *fires(
                            "VllmTargetDown", "22m", {"job": "vllm", "instance": "10.0.0.3:8000", "namespace": "llm", "pod": "vllm-2", "severity": "warning"}
                        )["exp_alerts"],
                    ],
                },
                silent("VllmTriageDown", "4m"),
                fires(
                    "VllmTriageDown", "10m", {"job": "vllm-triage", "instance": "10.0.0.1:10290", "namespace": "llm", "pod": "vllm-0", "severity": "warning"}
                ),
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                {"series": f'vllm_triage_source_up{{{LABELS},source="gpu"}}', "values": "1 1 0x15"},
                {"series": f'vllm_triage_source_up{{{LABELS},source="vllm"}}', "values": "1x17"},
                # a new pod's sidecar while its vLLM loads the model: its vllm source fails, and it says starting
                {"series": f'vllm_triage_source_up{{{STARTING_LABELS},source="vllm"}}', "values": "0x17"},
                {"series": f'vllm_triage_source_up{{{STARTING_LABELS},source="gil"}}', "values": "0x17"},
                {"series": f"vllm_triage_vllm_starting{{{STARTING_LABELS}}}", "values": "1x17"},
            ],
            "alert_rule_test": [
                silent("VllmTriageSourceDown", "5m"),
                fires("VllmTriageSourceDown", "15m", {**{k: v for k, v in _parse(LABELS).items()}, "source": "gpu", "severity": "warning"}),
            ],
        },
    ]


def _parse(labels: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in (pair.split("=", 1) for pair in labels.split(","))}


def _slo_tests() -> list[dict[str, Any]]:
    """For each SLO: half the requests miss it: the fast burn pages within minutes. Twice the budget misses it (a burn of 2):
    no page, the slow burn opens a ticket once its 6-hour and 3-day windows agree for an hour. A model within its SLO, and
    one that serves nothing: silent."""
    rules = {rule["alert"]: rule for rule in slo_alerts()}
    labels = 'namespace="llm",pod="vllm-0",instance="10.0.0.1:8000",job="vllm",model_name="{model}",engine="0"'
    tests = []
    for slo, (_, histogram, target, objective) in SLOS.items():

        def series(model: str, bad: int, steps: int, histogram: str | None = histogram, target: float = target) -> list[dict[str, str]]:
            """1000 requests a step, `bad` of them missing the SLO."""
            where = labels.format(model=model)
            if histogram is None:
                return [
                    {"series": f'vllm:request_success_total{{{where},finished_reason="error"}}', "values": f"0+{bad}x{steps}"},
                    {"series": f'vllm:request_success_total{{{where},finished_reason="stop"}}', "values": f"0+{1000 - bad}x{steps}"},
                ]
            return [
                {"series": f'{histogram}_bucket{{{where},le="{target:g}"}}', "values": f"0+{1000 - bad}x{steps}"},
                {"series": f"{histogram}_count{{{where}}}", "values": f"0+1000x{steps}"},
            ]

        def fires(alert: str, eval_time: str, model: str, value: str, slo: str = slo) -> dict[str, Any]:
            exp = {"namespace": "llm", "model_name": model, "severity": rules[alert]["labels"]["severity"], "slo": slo}
            annotations = {k: _render(v, exp, value) for k, v in rules[alert]["annotations"].items()}
            return {"eval_time": eval_time, "alertname": alert, "exp_alerts": [{"exp_labels": exp, "exp_annotations": annotations}]}

        fast, slow = slo_alert_name(slo, "critical"), slo_alert_name(slo, "warning")
        twice = round(2000 * (1 - objective))
        tests += [
            {
                "interval": "1m",
                "input_series": series("burning", 500, 30) + series("fine", 0, 30) + [{**s, "values": "0x30"} for s in series("idle", 0, 30)],
                "alert_rule_test": [{"eval_time": "2m", "alertname": fast, "exp_alerts": []}, fires(fast, "10m", "burning", "50%")],
            },
            {
                "interval": "10m",
                "input_series": series("steady", twice, 40),
                "alert_rule_test": [
                    {"eval_time": "6h", "alertname": fast, "exp_alerts": []},
                    {"eval_time": "30m", "alertname": slow, "exp_alerts": []},
                    fires(slow, "6h", "steady", f"{twice / 10:g}%"),
                ],
            },
        ]
    return tests


def rule_tests(rules_file_name: str) -> dict[str, Any]:
    return {"rule_files": [rules_file_name], "evaluation_interval": "1m", "tests": _condition_tests() + _vllm_alert_tests() + _slo_tests()}


SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
# The rules on vLLM's own metrics that tell the same story as a condition: its alert stands in for them.
SAME_STORY = {
    "vllm_unreachable": ("VllmTargetDown",),
    "kv_cache_saturated": ("VllmKvCacheFull",),
    "queue_backlog": ("VllmRequestsWaiting", "VllmRequestsWaitingPersistent"),
}


def one_story_inhibitions() -> list[dict[str, Any]]:
    """One page per incident: each condition's alert mutes, for the same pod, the alerts of every condition ranked
    after it in the sidecar's precedence (the one whose fix comes first leads: the primary verdict) and the rules on
    vLLM's own metrics that tell its story or a later one's."""
    alerting = [cid for cid in PRECEDENCE if CONDITIONS_BY_ID[cid].severity in ("warning", "critical")]
    severity = {alert_name(cid): CONDITIONS_BY_ID[cid].severity for cid in alerting} | {a["alert"]: a["labels"]["severity"] for a in vllm_alerts()}
    rules = []
    for index, cid in enumerate(alerting):
        # never a page muted by a ticket: only alerts of the source's severity or lower
        rank = SEVERITY_RANK[CONDITIONS_BY_ID[cid].severity]
        later = [alert_name(other) for other in alerting[index + 1 :]]
        later += [name for other in alerting[index:] for name in SAME_STORY.get(other, ())]
        later = [name for name in later if SEVERITY_RANK[severity[name]] <= rank]
        if later:
            rules.append(
                {
                    "source_matchers": [f'alertname="{alert_name(cid)}"'],
                    "target_matchers": [f'alertname=~"{"|".join(later)}"'],
                    "equal": ["namespace", "pod"],
                }
            )
    return rules


def alertmanager_example() -> dict[str, Any]:
    """critical -> pager, warning -> ticket, info -> nowhere, grouped by alert and namespace; a critical inhibits the
    warnings of the same pod, and the leading verdict's alert the alerts of the verdicts it explains (one_story_inhibitions)."""
    return {
        "route": {
            "receiver": "ticket",
            # one incident across the fleet pages once: the same alert of several pods of a namespace is one notification
            "group_by": ["alertname", "namespace"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {"matchers": ['severity="critical"'], "receiver": "pager", "repeat_interval": "1h"},
                {"matchers": ['severity="warning"'], "receiver": "ticket"},
                {"matchers": ['severity="info"'], "receiver": "null"},
            ],
        },
        "inhibit_rules": [
            {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'], "equal": ["namespace", "pod"]},
            *one_story_inhibitions(),
        ],
        "receivers": [
            {"name": "pager", "webhook_configs": [{"url": "http://pager.example.invalid/alert", "send_resolved": True}]},
            {"name": "ticket", "webhook_configs": [{"url": "http://tickets.example.invalid/alert", "send_resolved": True}]},
            {"name": "null"},
        ],
    }


def runbooks_markdown(header: str) -> str:
    lines = [header, "# Runbooks", ""]
    lines.append("One section per alert. Dashboards: *vLLM triage — overview* (`dashboards/`), and `/diagnosis` on the")
    lines.append("sidecar (port 10290) for the evidence in words and numbers.")
    for c in CONDITIONS:
        if c.severity not in ("warning", "critical"):
            continue
        lines += _runbook(alert_name(c.id), c)
    for rule in vllm_alerts():
        lines += ["", f"## {rule['alert']}", "", f"Severity: {rule['labels']['severity']}. Expression: `{rule['expr']}` for {rule['for']}.", ""]
        lines.append(
            rule["annotations"]["description"]
            .replace("{{ $value | humanizePercentage }}", "X %")
            .replace("{{ $value }}", "N")
            .replace("{{ $labels.instance }}", "the target")
            .replace("{{ $labels.source }}", "named")
        )
        lines.append("")
        lines.append(_VLLM_ALERT_STEPS[rule["alert"]])
    for rule in slo_alerts():
        slo = rule["labels"]["slo"]
        what, histogram, target, objective = SLOS[slo]
        judged = f"the share of requests over {target:g} s (`{histogram}`'s `le` bucket)" if histogram else "the share of requests finished with an error"
        lines += [
            "",
            f"## {rule['alert']}",
            "",
            f"Severity: {rule['labels']['severity']}"
            + (
                f" (the objective is the project's guess: critical once the chart's `vllmThresholds` sets `{slo}TargetSeconds` or `{slo}Objective`)"
                if slo in GUESSED_SLOS and rule["alert"] == slo_alert_name(slo, "critical")
                else ""
            )
            + f", per model across its replicas. Expression: `{rule['expr']}` for {rule['for']}.",
            "",
        ]
        lines.append(
            f"The {what} SLO ({objective:.1%} of requests, `vllmThresholds.{slo}Objective`"
            + (f", target `vllmThresholds.{slo}TargetSeconds`" if histogram else "")
            + f") judged on {judged}, recorded as `{slo_record(slo, '<window>')}`."
        )
        lines.append("")
        lines.append(_SLO_STEPS[slo])
    lines += ["", "## Batch and offline serving", "", BATCH_SERVING]
    return "\n".join(lines) + "\n"


BATCH_SERVING = (
    "A deployment that serves batch or offline jobs queues by design: requests wait for hours and their time to first token "
    "is the queue's. Turn off what reads a queue as harm: `VllmRequestsWaiting`, `VllmRequestsWaitingPersistent`, "
    "`VllmTriageQueueBacklog`, `VllmTriageTtftHigh`, `VllmTtftSloBurnFast` and `VllmTtftSloBurnSlow` (the chart's "
    "`monitoring.prometheusRule.disabledAlerts`), and `client_underload` between jobs (`conditions.client_underload.enabled: false` "
    "in `triage.config`). Keep what says the server cannot do the work: `VllmTriageVllmUnreachable`, `VllmTargetDown`, "
    "`VllmTriageEngineWedged`, `VllmErrorsSloBurnFast`, `VllmTriageKvCacheSaturated` and `VllmTriagePreemptionStorm` (preemptions "
    "recompute work a batch pays for), `VllmTriageGpuStarved` and the GPU health alerts. A throughput objective is the batch "
    "service's: the overview's output tokens per second against what the envelope says this configuration delivers at that load."
)


_SLO_STEPS = {
    "ttft": "Open the pods' sidecars: `ttft_high`'s cause splits the time into queueing, prefill and the API server; `queue_backlog`'s "
    "cause says what requests wait for. Scale out when every replica queues (the fleet dashboard).",
    "itl": "Open the pods' sidecars: `itl_high`'s cause says whether prefill chunks, the GPU or the API server sets the pace.",
    "errors": "Read vLLM's logs for the failing requests; the sidecars' `request_errors`, `kv_cache_saturated` and `engine_wedged` say what else holds.",
}


_VLLM_ALERT_STEPS = {
    "VllmKvCacheFull": "Confirm with the sidecar's `kv_cache_saturated` and `queue_backlog` (cause). Then see [VllmTriageKvCacheSaturated](#vllmtriagekvcachesaturated).",
    "VllmRequestsWaiting": "Read the sidecar's `queue_backlog` cause (`kv_capacity`, `concurrency_cap`, `unknown`) and follow [VllmTriageQueueBacklog](#vllmtriagequeuebacklog).",
    "VllmRequestsWaitingPersistent": "As VllmRequestsWaiting; if nothing changes, add replicas: the backlog will not drain by itself.",
    "VllmFleetSaturated": "Add replicas, or raise the autoscaler's maximum: every replica's queue says the same. Read one replica's "
    "`queue_backlog` cause first: a fleet-wide `concurrency_cap` or `token_budget` is a flag to raise on every replica, not more GPUs.",
    "VllmReplicaImbalance": "Compare the replicas on the fleet dashboard's waiting-per-pod panel. Check the Service's or router's "
    "balancing (client-IP stickiness, prefix- or KV-aware routing pinning a hot prefix to one pod) and whether the queueing pod is slower "
    "(its sidecar's verdicts: gpu_throttled, gpu_starved).",
    "VllmTargetDown": "Check the pod's restarts and the vLLM container's logs (OOM kills, CUDA errors); the sidecar's `vllm_unreachable` says the same from inside the pod.",
    "VllmTriageVllmUnreachableLong": "The replica is not coming back by itself: follow [VllmTriageVllmUnreachable](#vllmtriagevllmunreachable)'s "
    "cause; delete the pod if it is wedged in a state no restart leaves (an orphaned engine core holding the GPU), or cordon its node.",
    "VllmModelUnavailable": "Users of the model are failing now. Read each down replica's ticket (VllmTriageVllmUnreachable, its cause) for "
    "what they share: a rollout of a bad image or argument (crash_loop on every new pod: roll back), a node pool lost (process_gone "
    "together: reschedule, add capacity), a model store or registry that is down (not_started). Scale up only if the pods that "
    "answer are saturated too.",
    "VllmTriageDown": "Check the sidecar container (restarts, logs). The vLLM alerts above still work without it.",
    "VllmTriageSourceDown": (
        "Open `/diagnosis` on the sidecar: `sources.<name>.last_error` names the cause. By the alert's `source`: "
        "`vllm`, its URL is wrong or vLLM does not answer (`vllm_unreachable` says which); "
        "`gpu`, no NVML in the container (the NVIDIA runtime refused NVIDIA_VISIBLE_DEVICES, or no GPU on the node: a "
        "sidecar watching a remote vLLM has none of its GPUs) — set `triage.gpu.enabled: false`, or `gpu_source: dcgm`; "
        "`process`, the pod does not share its process namespace (the chart's `triage.processView`, on by default); `gil`, the "
        "sidecar lacks SYS_PTRACE — set `profiler.enabled: true` in the chart, or remove the source from `sources`."
    ),
}


def _runbook(name: str, c: Condition) -> list[str]:
    lines = ["", f"## {name}", "", f"Condition `{c.id}` (layer {c.layer}, {c.severity}): {c.summary}.", "", c.meaning, ""]
    lines.append(
        f"**Confirm**: on the overview dashboard the *{c.id}* row of the verdict timeline is on; "
        f"`kubectl exec <pod> -c vllm-triage -- vllm-triage report --json --condition {c.id}` shows the evidence" + (" and the cause" if c.causes else "") + "."
    )
    if c.thresholds:
        lines.append("")
        lines.append(
            "Thresholds (override under `conditions." + c.id + "` in the config): " + ", ".join(f"`{t.name}` = {t.default:g}" for t in c.thresholds) + "."
        )
    lines += ["", "**Next actions**:"]
    lines += [f"- {action}" for action in c.next_actions]
    if c.dont:
        lines += ["", "**What not to do**:"]
        lines += [f"- {item}" for item in c.dont]
    return lines


def _operator_matchers(matchers: list[str]) -> list[dict[str, str]]:
    """Alertmanager's matcher strings ('alertname=~"A|B"') in prometheus-operator's AlertmanagerConfig form."""
    out = []
    for matcher in matchers:
        name, op, value = re.match(r'^(\w+)(=~|!~|!=|=)"(.*)"$', matcher).groups()  # type: ignore[union-attr]
        out.append({"name": name, "value": value, "matchType": op})
    return out


def alertmanager_config_inhibit_rules() -> list[dict[str, Any]]:
    """The example's inhibit rules for the chart's optional AlertmanagerConfig (the operator adds the namespace
    matcher itself)."""
    return [
        {"sourceMatch": _operator_matchers(r["source_matchers"]), "targetMatch": _operator_matchers(r["target_matchers"]), "equal": r["equal"]}
        for r in alertmanager_example()["inhibit_rules"]
    ]
