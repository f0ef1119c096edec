"""The generated rules and dashboards against a real Prometheus scraping the real vLLM (CPU build),
the live sidecar, and a sidecar replaying a capture recorded on the H200 (CI has no GPU): every
dashboard panel's query returns data, and KV saturation makes the KV alerts true."""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest

from harness.components import BIN, FAST_CADENCE, FAST_CONDITIONS, REPO, start_load, start_prometheus, start_sidecar
from mixin.dashboards import DASHBOARDS, panel_queries

pytestmark = pytest.mark.integration

SIDECAR_CONFIG = FAST_CADENCE + FAST_CONDITIONS
# a real vLLM on the H200 with all four sources and --enable-mfu-metrics: the efficiency panels have data too
# speculative decoding (a draft model), tensor parallelism (its peers and interconnect): no data on these servers
# Drill-downs whose signals exist only with a vLLM feature this one does not run, or a view its captures lack (gpu_shared:
# NVML's pids matched to vLLM's, which the recorded GPU capture predates).
NEEDS_A_FEATURE = ("spec_decode_ineffective", "tp_straggler", "communication_bound", "gpu_shared")
GPU_CAPTURE = REPO / "tests" / "data" / "real-vllm-h200-efficiency_wedge.jsonl.gz"
# Grafana's "All" (the variables' allValue), then one model, engine and namespace picked as a person would:
# each panel must show data either way (a filter on a label its series lack blanks it only in the second).
ALL = {"$cluster": ".*", "$namespace": ".*", "$pod": ".*", "$model": ".*", "$engine": ".*", "$__rate_interval": "20s"}
PICKED = {**ALL, "$namespace": "llm", "$model": "tiny", "$engine": "0"}


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        expr = expr.replace(name, value)
    return expr


def has_values(result: list[dict]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


def test_dashboards_and_alerts_against_a_real_prometheus(vllm, tmp_path):
    for folder in ("live", "replay"):
        (tmp_path / folder).mkdir()
    # The H200 capture at real speed, started first so that by the time Prometheus scrapes, the
    # replay has left its idle phase and every GPU signal exists.
    replay = start_sidecar(tmp_path / "replay", "http://127.0.0.1:9", "window_seconds: 20\n", "--demo", "--demo-capture", str(GPU_CAPTURE))
    live = start_sidecar(tmp_path / "live", vllm.url, SIDECAR_CONFIG)
    load = start_load(vllm.url, clients=64, prompt_words=200, max_tokens=500)
    prometheus = None
    try:
        live.wait_for(lambda: live.active()["kv_cache_saturated"] == 1.0, 120, "saturation before Prometheus starts")
        labels = {"namespace": "llm", "pod": "vllm-0"}
        prometheus = start_prometheus(
            tmp_path,
            {
                "vllm": [(vllm.url.removeprefix("http://"), labels)],
                "vllm-triage": [(live.url.removeprefix("http://"), labels), (replay.url.removeprefix("http://"), {"namespace": "llm", "pod": "gpu-replay"})],
            },
            REPO / "alerts" / "vllm-triage.rules.yml",
        )
        started = time.time()
        # vLLM's own KV alert expression (5 m windows): true once Prometheus has seen the saturated cache.
        kv_rule = next(r for r in _rules() if r.get("alert") == "VllmKvCacheFull")
        _wait(lambda: prometheus.query(kv_rule["expr"]), 120, "VllmKvCacheFull's expression true")
        # a capacity alert waits 10 minutes in Prometheus (a warning, not a page): its rule is true, the alert pending
        _wait(lambda: _alert_state(prometheus, "VllmTriageKvCacheSaturated") in ("pending", "firing"), 30, "VllmTriageKvCacheSaturated pending")
        time.sleep(max(0.0, 25 - (time.time() - started)))  # a few rate windows of data
        queries = [
            (f"{name} / {title} ({'all' if variables is ALL else 'one model picked'})", substitute(expr, variables))
            for variables in (ALL, PICKED)
            for name, build in DASHBOARDS.items()
            for title, expr in panel_queries(build())
        ]
        queries = [(panel, expr) for panel, expr in queries if not any(f"/ {cid} (" in panel for cid in NEEDS_A_FEATURE)]
        # "no sidecar answers" (absent()) shows nothing while the sidecars answer, at the instant a person looks
        answering = [(panel, expr) for panel, expr in queries if expr.startswith("absent(")]
        assert answering and all(prometheus.query(expr) == [] for _, expr in answering), answering
        queries = [(panel, expr) for panel, expr in queries if not expr.startswith("absent(")]
        deadline = time.monotonic() + 60  # the GPU replay moves through its phases: give late series a minute
        while True:
            missing = [f"{panel}: {expr}" for panel, expr in queries if not has_values(prometheus.query_range(expr, started, time.time()))]
            if not missing or time.monotonic() > deadline:
                break
            queries = [(panel, expr) for panel, expr in queries if f"{panel}: {expr}" in missing]
            time.sleep(5)
        assert not missing, "panels without data:\n" + "\n".join(missing)
        # the history of the H200 capture's replay, from the sidecar's exported readings alone (its vLLM was not scraped)
        history = [str(BIN / "vllm-triage"), "diagnose", "--prometheus", prometheus.url, "--selector", '{pod="gpu-replay"}', "--seconds", "60", "--json"]
        judged = subprocess.run(history, capture_output=True, text=True, timeout=120)
        assert judged.returncode == 0 and "no vLLM series" in judged.stderr, judged.stderr
        found = json.loads(judged.stdout)
        assert found["signals"]["gpu:0"]["gpu_sm_active_ratio_mean"] is not None and found["sources"]["gpu"]["up"], found["signals"].get("gpu:0")
        assert {c["condition"]: c["state"] for c in found["conditions"]}["kv_cache_saturated"] == "unknown"
        # the dashboards' variables have values to offer
        assert {s["metric"]["namespace"] for s in prometheus.query("vllm_triage_build_info")} == {"llm"}
        assert {(s["metric"]["model_name"], s["metric"]["engine"]) for s in prometheus.query("vllm:num_requests_running")} == {("tiny", "0")}
    finally:
        load.stop()
        if prometheus is not None:
            prometheus.stop()
        for sidecar in (live, replay):
            sidecar.process.terminate()
            sidecar.process.wait(timeout=10)


def _rules() -> list[dict]:
    import yaml

    document = yaml.safe_load((REPO / "alerts" / "vllm-triage.rules.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _alert_state(prometheus, alertname: str) -> str | None:
    return next((a["state"] for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] == alertname), None)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    pytest.fail(f"{what}: not within {timeout:.0f} s")
