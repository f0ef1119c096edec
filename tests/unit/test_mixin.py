"""The alerting mixin is derived from the table: every paging condition has an alert, a promtool
test on each side and a runbook section; the PrometheusRule carries the same groups."""

from __future__ import annotations

from pathlib import Path

import yaml
from vllm_triage.diagnosis.conditions import CONDITIONS

from mixin import rules as mixin

ROOT = Path(__file__).resolve().parents[2]


def test_every_warning_or_critical_condition_has_an_alert_with_annotations():
    alerts = {rule["alert"]: rule for rule in mixin.condition_alerts()}
    for c in CONDITIONS:
        name = mixin.alert_name(c.id)
        if c.severity == "info":
            assert name not in alerts
            continue
        rule = alerts[name]
        # one replica's liveness is a ticket; the model's (VllmModelUnavailable) and a replica down past a start-up page
        assert rule["labels"]["severity"] == ("warning" if c.id in mixin.REPLICA_LIVENESS else c.severity)
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        assert name.startswith("VllmTriage")


def test_every_alert_is_tested_firing_and_silent():
    tests = mixin.rule_tests("x.yml")["tests"]
    fired, silent = set(), set()
    for test in tests:
        for case in test["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    every = {r["alert"] for group in mixin.rule_groups() for r in group["rules"] if "alert" in r}
    assert fired == every
    # silence is checked either by an empty expectation or by the exact list leaving a healthy series out
    assert all(any(s["series"] for s in t["input_series"]) for t in tests)
    assert every <= fired | silent


def test_every_alert_has_a_runbook_section():
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    for group in mixin.rule_groups():
        for rule in group["rules"]:
            if "alert" in rule:
                assert f"## {rule['alert']}" in runbooks
                assert rule["annotations"]["runbook_url"].endswith("#" + rule["alert"].lower())
    assert "What not to do" in runbooks and "swap" in runbooks


def test_prometheus_rule_matches_the_rule_file():
    rule = yaml.safe_load((ROOT / "alerts" / "prometheusrule.yaml").read_text())
    rules = yaml.safe_load((ROOT / "alerts" / "vllm-triage.rules.yml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == rules["groups"]


def test_recording_rules_follow_level_metric_operations():
    for rule in mixin.recording_rules():
        level, metric, operations = rule["record"].split(":")
        assert level and metric and operations


def test_every_drill_down_panel_queries_a_family_the_sidecar_exports():
    """The conditions dashboard shows the first exported signals each condition declares it reads: each
    family must be in the golden exposition (the demo's real readings of all four sources), or its
    panel is blank, and host series must not be filtered by labels only engine series have."""
    import re

    from mixin.dashboards import drill_down

    golden = (ROOT / "tests" / "data" / "exposition.golden.txt").read_text()
    exported = set(re.findall(r"^# TYPE (\S+)", golden, re.MULTILINE))
    shown = {c.id: drill_down(c) for c in CONDITIONS if c.id != "vllm_unreachable"}  # its panel is the source health row
    assert all(shown.values()), [cid for cid, items in shown.items() if not items]
    missing = [(cid, family) for cid, items in shown.items() for family, _, _ in items if family not in exported]
    assert not missing, missing
    host = [(family, selector) for items in shown.values() for family, selector, _ in items if family.startswith("vllm_triage_process_window_")]
    assert host and not [h for h in host if "model_name=" in h[1] or "engine=" in h[1]]


def test_every_panel_has_the_unit_of_what_it_shows_and_links_keep_the_selection():
    """Seconds read as seconds and ratios as percentages (not 'short'); following a link keeps the cluster,
    namespace, pod, model and time range; every query can be narrowed to a cluster."""
    from mixin.dashboards import DASHBOARDS

    units = {}
    for name, build in DASHBOARDS.items():
        dashboard = build()
        assert all(link["includeVars"] and link["keepTime"] for link in dashboard["links"])
        assert [v["name"] for v in dashboard["templating"]["list"]][:3] == ["datasource", "cluster", "namespace"]
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            units[(name, panel["title"])] = panel["fieldConfig"]["defaults"].get("unit")
            assert all('cluster=~"$cluster"' in t["expr"] for t in panel["targets"]), panel["title"]
    conditions = "vllm-triage-conditions.json"
    assert units[(conditions, "ttft_high (warning)")] == "s" and units[(conditions, "itl_high (warning)")] == "s"
    assert units[(conditions, "kv_cache_saturated (warning)")] == "percentunit"
    assert units[(conditions, "gpu_starved (warning)")] == "percentunit"
    fleet = "vllm-triage-fleet.json"
    assert units[(fleet, "TTFT p95 by model")] == "s" and units[(fleet, "Fullest KV cache by model")] == "percentunit"
    assert units[(fleet, "Generated tokens/s by model")] == "ops"


def test_every_dashboard_survives_grafanas_typed_models_unchanged():
    """No Grafana server can run here: grafana-foundation-sdk's models of Grafana 11.6's dashboard schema
    stand in. Every key the generator writes must come back from a round trip through them (a renamed or
    dropped field is schema drift); `__inputs` is the import wrapper, not part of the schema."""
    import json

    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    from mixin.dashboards import DASHBOARDS

    def lost(ours: object, back: object, path: str = "") -> list[str]:
        if isinstance(ours, dict):
            if not isinstance(back, dict):
                return [path]
            return [p for key, value in ours.items() for p in ([f"{path}/{key}"] if key not in back else lost(value, back[key], f"{path}/{key}"))]
        if isinstance(ours, list):
            if not isinstance(back, list) or len(ours) != len(back):
                return [path]
            return [p for i, (a, b) in enumerate(zip(ours, back, strict=True)) for p in lost(a, b, f"{path}[{i}]")]
        same = ours == back or (isinstance(ours, (int, float)) and isinstance(back, (int, float)) and float(ours) == float(back))
        return [] if same else [f"{path}: {ours!r} -> {back!r}"]

    for name, build in DASHBOARDS.items():
        ours = build()
        assert ours.pop("__inputs") == []
        back = json.loads(json.dumps(Dashboard.from_json(ours), cls=JSONEncoder))
        assert not lost(ours, back), (name, lost(ours, back)[:10])


def test_every_condition_has_its_panel_on_the_conditions_dashboard():
    from vllm_triage.diagnosis.conditions import CONDITIONS

    from mixin.dashboards import FAMILIES

    placed = [cid for _, ids in FAMILIES for cid in ids]
    # vllm_unreachable reads no windowed signal: its evidence is the overview's source health row
    assert sorted(placed) == sorted(c.id for c in CONDITIONS if c.id != "vllm_unreachable")


def test_one_incident_pages_once_and_no_page_is_muted_by_a_ticket():
    """The Alertmanager example's inhibitions follow the sidecar's precedence: a full KV cache's alert mutes the
    backlog it explains and vLLM's own rules for the same story; vLLM down mutes the target-down rule; a warning
    never mutes a critical."""
    from vllm_triage.diagnosis.conditions import CONDITIONS_BY_ID

    from mixin.rules import alert_name, alertmanager_example, vllm_alerts

    severity = {alert_name(cid): c.severity for cid, c in CONDITIONS_BY_ID.items()} | {a["alert"]: a["labels"]["severity"] for a in vllm_alerts()}

    def muted_by(source: str) -> set[str]:
        rules = [r for r in alertmanager_example()["inhibit_rules"] if r["source_matchers"] == [f'alertname="{source}"']]
        return {name for r in rules for name in r["target_matchers"][0].split('"')[1].split("|")} if rules else set()

    assert {"VllmKvCacheFull", "VllmTriageQueueBacklog", "VllmTriagePreemptionStorm", "VllmRequestsWaitingPersistent"} <= muted_by("VllmTriageKvCacheSaturated")
    assert "VllmTargetDown" in muted_by("VllmTriageVllmUnreachable")
    assert "VllmTriageKvCacheSaturated" in muted_by("VllmTriageEngineWedged")
    for rule in alertmanager_example()["inhibit_rules"][1:]:
        source = rule["source_matchers"][0].split('"')[1]
        order = {"warning": 1, "critical": 2}
        assert all(order[severity[t]] <= order[severity[source]] for t in muted_by(source)), source
    # users' harm pages across the model's replicas: no pod's verdict mutes an SLO burn
    assert not [r for r in alertmanager_example()["inhibit_rules"] if "SloBurn" in r["target_matchers"][0]]


def test_the_overview_leads_with_the_verdict_now_and_no_panel_is_blank_without_saying_why():
    """The on-call engineer's first look: the primary verdict, since when, a link to what it means; the efficiency
    panels say what they need when vLLM runs without --enable-mfu-metrics; every fleet panel says what it shows."""
    from mixin.dashboards import CONDITIONS_URL, fleet, overview

    panels = overview()["panels"]
    assert panels[0]["type"] == "row" and panels[0]["title"].startswith("Now")
    now = {p["title"]: p for p in panels[1:5]}
    assert set(now) == {"Primary verdict", "Since", "Active verdicts", "vLLM starting for"} and all(p["type"] == "stat" for p in now.values())
    assert "vllm_triage_vllm_starting_seconds" in now["vLLM starting for"]["targets"][0]["expr"]
    primary = now["Primary verdict"]
    assert "vllm_triage_condition_primary" in primary["targets"][0]["expr"] and primary["options"]["textMode"] == "name"
    assert primary["fieldConfig"]["defaults"]["noValue"] == "nothing is wrong"
    assert primary["fieldConfig"]["defaults"]["links"][0]["url"] == CONDITIONS_URL + "#${__field.labels.condition}"
    assert (ROOT / "docs" / "conditions.md").read_text().count("\n## kv_cache_saturated\n") == 1  # the anchor the link lands on
    efficiency = [p for p in panels if p["type"] == "timeseries" and "--enable-mfu-metrics" in p.get("description", "")]
    assert efficiency and all("--enable-mfu-metrics" in p["fieldConfig"]["defaults"]["noValue"] for p in efficiency)
    assert all(p["description"] for p in fleet()["panels"] if p["type"] != "row")
    # every panel of every dashboard says what it shows; the "Now" row asks for the value now (instant queries), and the
    # primary verdict says when no sidecar answers rather than "nothing is wrong"
    from mixin.dashboards import DASHBOARDS

    undescribed = [(name, p["title"]) for name, build in DASHBOARDS.items() for p in build()["panels"] if p["type"] != "row" and not p.get("description")]
    assert not undescribed, undescribed
    assert all(t.get("instant") is True and t.get("range") is False for p in now.values() for t in p["targets"])
    assert [t["legendFormat"] for t in primary["targets"]] == ["{{condition}}", "no sidecar answers"] and primary["targets"][1]["expr"].startswith("absent(")


def test_each_tunable_vllm_threshold_is_written_in_its_rules_and_nowhere_else():
    """The chart replaces each tunable's text in the expressions of the rules it names: it must be in each of them, and
    no other tunable of those rules may share it (a replacement would change both)."""
    from mixin.rules import VLLM_THRESHOLDS, rule_groups

    exprs = {rule.get("alert") or rule["record"]: rule["expr"] for group in rule_groups() for rule in group["rules"]}
    for key, tunable in VLLM_THRESHOLDS.items():
        assert all(tunable["text"] in exprs[name] for name in tunable["rules"]), key
        others = [other for name in tunable["rules"] for o, other in VLLM_THRESHOLDS.items() if o != key and name in other["rules"]]
        assert not [other for other in others if tunable["text"] in other["text"] or other["text"] in tunable["text"]], key
        assert tunable["format"].replace("%v", str(tunable["default"])).replace(".0", "") in tunable["text"].replace(".0", ""), key
