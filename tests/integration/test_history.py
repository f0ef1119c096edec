"""The same verdicts from Prometheus' history as from the live sidecar: a real Prometheus scrapes the real
vLLM and the sidecar beside it through idle, saturation and recovery; then `vllm-triage replay --prometheus`
and `diagnose --prometheus` judge that history with the same settings, and their verdict timeline is
compared with what the live sidecar said. The sidecar runs without GPU (a CPU machine): the GPU layer of the
history comes from a dcgm-exporter page (tests/data, its GPU 0 mapped to this pod) that Prometheus scrapes as
it would the node's dcgm-exporter, without honor_labels."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from harness.components import BIN, FAST_CADENCE, FAST_CONDITIONS, REPO, start_load, start_prometheus, start_sidecar
from harness.vllm_server import free_port

pytestmark = pytest.mark.integration

SETTINGS = FAST_CADENCE + FAST_CONDITIONS + "  prefix_cache_ineffective: {enabled: false}\n"
JUDGED = ("kv_cache_saturated", "queue_backlog", "preemption_storm")
DCGM_PAGE = REPO / "tests" / "data" / "dcgm-exporter-h200.metrics.txt"
# dcgm-exporter's page, served as it serves it (text/plain), for Prometheus to scrape
SERVE_PAGE = """
import http.server, sys
page = open(sys.argv[2], "rb").read()
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Type", "text/plain; version=0.0.4"); self.end_headers(); self.wfile.write(page)
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Page).serve_forever()
"""


def live_timeline(sidecar, seconds: float, held: list[set[str]]) -> list[tuple[float, set[str]]]:
    """(time, active conditions) once a second from the live sidecar; `held` gets, at each poll, the conditions whose
    predicate held at its last tick (/diagnosis' raw)."""
    timeline = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        timeline.append((time.time(), {c for c, v in sidecar.active().items() if v == 1.0}))
        held.append({c["condition"] for c in sidecar.diagnosis()["conditions"] if c["raw"]})
        time.sleep(1)
    return timeline


def flickering(held: list[set[str]]) -> set[str]:
    """Conditions whose predicate came and went: held at a poll, not at a later one, and held again after. Such a
    predicate sits at its threshold: whether its `for` is met depends on the second each observer sampled at."""
    found = set()
    for condition in set().union(*held):
        states = [condition in h for h in held]
        if not all(states[states.index(True) : len(states) - states[::-1].index(True)]):
            found.add(condition)
    return found


def first_active(timeline: list[tuple[float, set[str]]], condition: str) -> float | None:
    return next((t for t, active in timeline if condition in active), None)


def scrape_health(prometheus, start: float, end: float) -> dict[str, tuple[int, float]]:
    """Per job, the scrapes Prometheus failed and its slowest one (s) over the run: a failed scrape leaves a gap in
    the history that the live sidecar, with its own 5 s timeout, did not have."""
    health = {}
    for series in prometheus.query_range("scrape_duration_seconds", start, end):
        job = series["metric"]["job"]
        failed = prometheus.query_range(f'count_over_time((up{{job="{job}"}} == 0)[{int(end - start) + 1}s:1s])', end, end)
        health[job] = (int(float(failed[0]["values"][0][1])) if failed else 0, max(float(v) for _, v in series["values"]))
    return health


def test_history_in_prometheus_gives_the_live_verdicts(vllm, tmp_path):
    config = tmp_path / "settings.yaml"
    config.write_text(SETTINGS)
    sidecar = start_sidecar(tmp_path, vllm.url, SETTINGS, "--sources", "vllm,process")
    labels = {"namespace": "llm", "pod": "vllm-0"}
    dcgm_port = free_port()
    dcgm = subprocess.Popen([sys.executable, "-c", SERVE_PAGE, str(dcgm_port), str(DCGM_PAGE)])
    jobs = {
        "vllm": [(vllm.url.removeprefix("http://"), labels)],
        "vllm-triage": [(sidecar.url.removeprefix("http://"), labels)],
        # the exporter's own pod: the page's pod and namespace labels become exported_pod and exported_namespace
        "dcgm-exporter": [(f"127.0.0.1:{dcgm_port}", {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7x2kq"})],
    }
    prometheus = start_prometheus(tmp_path, jobs, REPO / "alerts" / "vllm-triage.rules.yml")
    load = None
    try:
        start = time.time()
        held: list[set[str]] = []
        timeline = live_timeline(sidecar, 15, held)  # idle
        load = start_load(vllm.url, clients=64, prompt_words=200, max_tokens=500)
        timeline += live_timeline(sidecar, 60, held)
        load.stop()
        load = None
        timeline += live_timeline(sidecar, 25, held)  # recovery
        end = time.time()
        assert all(first_active(timeline, c) is not None for c in JUDGED), timeline[-40:]

        history = [str(BIN / "vllm-triage"), "--prometheus", prometheus.url, "--selector", '{pod="vllm-0"}', "--step", "1", "--config", str(config)]
        page = tmp_path / "incident.html"
        replayed = subprocess.run(
            [history[0], "replay", *history[1:], "--from", f"{start:.3f}", "--to", f"{end:.3f}", "--json", "--html", str(page)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replayed.returncode == 0, replayed.stderr
        changes = [json.loads(line) for line in replayed.stdout.splitlines()]
        # the incident page of the same history: a band per verdict the replay judged, over vLLM's and the GPUs' plots
        text = page.read_text()
        assert "kv_cache_saturated" in text and "Requests running and waiting" in text and "GPU activity" in text, text[:500]
        health = scrape_health(prometheus, start, end)
        assert set(health) == set(jobs), health
        for condition in JUDGED:
            live = first_active(timeline, condition)
            rose = next((c["since"] for c in changes if c["condition"] == condition and c["state"] == "active"), None)
            assert rose is not None, (condition, [c for c in changes if c["condition"] == condition])
            # the same data a second apart (each scraped vLLM on its own clock) and the live view polled every second
            assert abs(rose - live) <= 5, (
                condition,
                rose - start,
                live - start,
                health,
                [(c["state"], c["since"] and c["since"] - start) for c in changes if c["condition"] == condition],
            )
        ever_live = set().union(*(active for _, active in timeline))
        ever_history = {c["condition"] for c in changes if c["state"] == "active"}
        # the same story, and the GPU's from dcgm-exporter beside it: util.gpu 0.98 with SMs at 0.11 and a thermal slowdown all
        # along. Only a condition whose predicate the live sidecar saw flicker at its threshold may be told by one of them
        # alone (itl_high under CI's contention: the history met its 30 s `for`, the live sidecar did not).
        from_dcgm = {"gpu_busy_not_computing", "gpu_throttled"}
        told_by_one = (ever_history - from_dcgm) ^ ever_live
        assert from_dcgm <= ever_history and told_by_one <= flickering(held), (ever_history, ever_live, flickering(held), health)

        # diagnose at a moment of the saturation: the report the sidecar gave then
        at = first_active(timeline, "preemption_storm") + 10  # type: ignore[operator]
        live_then = next(active for t, active in timeline if t >= at)
        report = subprocess.run(
            [history[0], "diagnose", *history[1:], "--at", f"{at:.3f}", "--seconds", "120", "--json"], capture_output=True, text=True, timeout=120
        )
        assert report.returncode == 0, report.stderr
        judged = {c["condition"] for c in json.loads(report.stdout)["conditions"] if c["state"] == "active"}
        assert set(JUDGED) <= judged and set(JUDGED) <= live_then, (judged, live_then)

        late_args = ["diagnose", *history[1:], "--at", f"{end:.3f}", "--seconds", "90", "--json"]
        late = json.loads(subprocess.run([history[0], *late_args], capture_output=True, text=True, timeout=120, check=True).stdout)
        assert abs(late["signals"]["gpu:0"]["gpu_sm_active_ratio_mean"] - 0.112) < 1e-9, late["signals"].get("gpu:0")
        assert late["discovery"]["gpu_peak"]["model"] == "H200"  # modelName: the peaks of the efficiency gauges
        assert [g["uuid"] for g in late["discovery"]["gpus"]] == ["GPU-76276492-0af5-efea-92e7-e81a7e3875e9"]  # not the other pod's GPU 1

        # the fleet view of the same Prometheus: this one server, in the same verdict
        fleet_args = ["fleet", "--prometheus", prometheus.url, "--selector", '{namespace="llm"}', "--at", f"{at:.3f}", "--seconds", "120", "--step", "1"]
        fleet = subprocess.run([history[0], *fleet_args, "--config", str(config), "--json"], capture_output=True, text=True, timeout=120)
        assert fleet.returncode == 0, fleet.stderr
        (server,) = json.loads(fleet.stdout)["servers"]
        assert server["pod"] == "vllm-0" and set(JUDGED) <= {a["condition"] for a in server["active"]}, server

        # a selector that picks nothing says so, naming what is missing
        missing = subprocess.run([history[0], "diagnose", *history[1:3], "--selector", '{pod="nope"}'], capture_output=True, text=True, timeout=60)
        assert missing.returncode == 2 and "no vLLM series" in missing.stderr and 'pod="nope"' in missing.stderr, missing.stderr
    finally:
        dcgm.kill()
        if load is not None:
            load.stop()
        prometheus.stop()
        sidecar.process.terminate()
        sidecar.process.wait(timeout=10)
