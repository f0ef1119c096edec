"""One incident, one page: the shipped rules in a real Prometheus, the shipped Alertmanager example in a real
Alertmanager, its receivers pointed at a webhook that counts what reaches people.

Live: one life of a real vLLM (CPU build) and its sidecar on the chart's default start-up budget: a rollout whose model
load takes over 15 minutes, load after it, a hung engine core, vLLM killed, and the sidecar restarted in that outage.
Replayed: four pods whose sidecars replay real H200 captures at the default settings, each incident stretched to the
length people live through (a 5-minute model load, 30 minutes of KV saturation, a 10-minute hang), and vLLM killed.

Time runs 10 times faster on the rules' and Alertmanager's side (every `for`, `keep_firing_for`, range and group timing
divided by 10: 5 minutes are 30 s here). The live sidecar runs on short settings (it rides through 2 s of failed
scrapes, not 15, and says vllm_unreachable 2 s after); the replaying sidecars run on the default settings, their clock
10 times faster (`--demo-speed 10`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from harness import vllm_server
from harness.components import FAST_CADENCE, FAST_CONDITIONS, REPO, get, start_alertmanager, start_load, start_prometheus, start_sidecar
from harness.scenarios import engine_core
from mixin.rules import SLOS, VLLM_THRESHOLDS, threshold_text
from tests.support import timeline

pytestmark = pytest.mark.integration

SPEEDUP = 10
LABELS = {"namespace": "llm", "pod": "vllm-0"}
# The live pod's latency objectives: those of a tiny model on a shared CPU, set the way an install sets its own
# (`vllmThresholds` in the chart, `conditions.ttft_high` in the sidecar's config). The defaults are a GPU's: its tokens
# come every 20-100 ms on CI's 2 cores beside two other lanes, its first token in up to a few seconds, at or over 0.1 s
# and 2 s; the rollout is judged on what pages, not on whether this CPU meets a GPU's latency.
CPU_SLO = {"itlTargetSeconds": 0.5, "ttftTargetSeconds": 10.0}
# The chart's start-up budget (vllm.startupSeconds, 1800 s) at this speed.
STARTUP_BUDGET = f"vllm_startup_seconds: {1800 // SPEEDUP}\n"
# A CPU vLLM has no GPU to read: its sidecar runs without the gpu source, as docker-compose.cpu.yml's does.
SIDECAR_CONFIG = (
    "sources: vllm,process,gil\nstale_after_seconds: 2\n"
    + STARTUP_BUDGET
    + FAST_CADENCE
    + FAST_CONDITIONS.replace("vllm_unreachable: {for_seconds: 3,", "vllm_unreachable: {for_seconds: 2,").replace(
        "ttft_high: {for_seconds: 3,", f"ttft_high: {{ttft_p95_max_seconds: {CPU_SLO['ttftTargetSeconds']:g}, for_seconds: 3,"
    )
    + "  engine_wedged: {for_seconds: 3, clear_for_seconds: 5}\n"
)


def faster(duration: str) -> str:
    """A Prometheus duration divided by SPEEDUP, in whole seconds (at least 1)."""
    seconds = sum(int(n) * {"s": 1, "m": 60, "h": 3600}[unit] for n, unit in re.findall(r"(\d+)([smh])", duration))
    return f"{max(1, round(seconds / SPEEDUP))}s"


def faster_rules(thresholds: dict[str, float] | None = None) -> dict:
    """The shipped rules at SPEEDUP, with `thresholds` (chart's `vllmThresholds` keys) set as the chart's template sets them."""
    groups = yaml.safe_load((REPO / "alerts" / "vllm-triage.rules.yml").read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            for key, value in (thresholds or {}).items():
                tunable = VLLM_THRESHOLDS[key]
                if rule.get("alert", rule.get("record")) in tunable["rules"]:
                    assert tunable["text"] in rule["expr"], (key, rule["expr"])
                    rule["expr"] = rule["expr"].replace(tunable["text"], threshold_text(key, value))
                if rule.get("alert") in tunable.get("pages", ()):
                    rule["labels"]["severity"] = "critical"  # an objective the team set pages, as the chart makes it
            rule["expr"] = re.sub(r"\[(\w+)\]", lambda m: f"[{faster(m.group(1))}]", rule["expr"])
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = faster(rule[key])
    return {"groups": groups}


def faster_alertmanager(webhook: str) -> dict:
    config = yaml.safe_load((REPO / "alerts" / "alertmanager.example.yml").read_text())
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route:
                route[key] = faster(route[key])
    for receiver in config["receivers"]:
        for webhook_config in receiver.get("webhook_configs", []):
            webhook_config["url"] = f"{webhook}/{receiver['name']}"
    return config


def name(labels: dict[str, str]) -> str:
    """An alert as a person reads it in the page: its name, and the source for the sidecar's source alerts."""
    return labels["alertname"] + (f"{{source={labels['source']}}}" if "source" in labels else "")


class Webhook:
    """What Alertmanager sent to each receiver, in order: (receiver, group key, status, alert names firing, pod)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, str, tuple[tuple[str, str], ...]]] = []
        self.times: list[float] = []  # time.monotonic() of each post
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                # each firing alert with what it is about: its pod, or for a model's SLO alert (no pod) its namespace
                firing = tuple(
                    sorted((name(a["labels"]), a["labels"].get("pod") or a["labels"].get("namespace", "")) for a in body["alerts"] if a["status"] == "firing")
                )
                outer.posts.append((self.path.strip("/"), body["groupKey"], body["status"], firing))
                outer.times.append(time.monotonic())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def pages(self, since: int = 0, about: str | None = None) -> list[tuple[str, ...]]:
        """What paged people from post `since` on: each group's notification that starts it firing (its first, or the first
        after it resolved), as the names of its alerts (about `about` only, when given: pages carrying none are left out);
        a group's later notifications while it fires are updates, not pages."""
        firing: dict[str, bool] = {}
        pages = []
        for index, (receiver, group, status, alerts) in enumerate(self.posts):
            if receiver != "pager":
                continue
            names = tuple(sorted({n for n, on in alerts if about in (None, on)}))
            if status == "firing" and not firing.get(group) and index >= since and names:
                pages.append(names)
            firing[group] = status == "firing"
        return pages

    def first_paged(self, about: str) -> float | None:
        """When the pager first carried an alert about `about` (a page, or an update of a group already paging)."""
        return next(
            (at for at, (receiver, _, _, alerts) in zip(self.times, self.posts, strict=True) if receiver == "pager" and any(on == about for _, on in alerts)),
            None,
        )

    def tickets(self, since: int = 0, about: str | None = None) -> list[tuple[str, ...]]:
        found = [
            tuple(sorted({n for n, on in alerts if about in (None, on)}))
            for receiver, _, status, alerts in self.posts[since:]
            if receiver == "ticket" and status == "firing"
        ]
        return [names for names in found if names]


def firing_alerts(alertmanager: str) -> list[str]:
    status, body = get(f"http://{alertmanager}/api/v2/alerts?active=true&silenced=false&inhibited=true")
    assert status == 200, body
    return sorted(a["labels"]["alertname"] for a in json.loads(body))


def settle(alertmanager: str, timeout: float) -> None:
    """Until no alert is active in Alertmanager (the incident is over on both sides), or the timeout."""
    deadline = time.monotonic() + timeout
    while firing_alerts(alertmanager) and time.monotonic() < deadline:
        time.sleep(2)


# A model that loads for 15 minutes and more (a 70B model downloading into the pod's cache): its API server process waits
# this long before vLLM loads the tiny model (30-60 s more here).
LOAD_DELAY_SECONDS = 60


def test_each_incident_pages_once_and_a_rollout_pages_nobody(tmp_path):
    webhook = Webhook()
    alertmanager_process, alertmanager = start_alertmanager(tmp_path, faster_alertmanager(webhook.url))
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(faster_rules(CPU_SLO)))
    port = vllm_server.free_port()
    url = f"http://127.0.0.1:{port}"
    # The state file the chart keeps beside the bundles: what the sidecar knew of vLLM outlives its own restart.
    config = SIDECAR_CONFIG + f"envelope_file: {tmp_path / 'envelope.json'}\n"
    # A rollout: the new pod's sidecar starts while its vLLM has not started to load the model yet.
    sidecar = start_sidecar(tmp_path, url, config)
    prometheus = start_prometheus(
        tmp_path, {"vllm": [(f"127.0.0.1:{port}", LABELS)], "vllm-triage": [(sidecar.url.removeprefix("http://"), LABELS)]}, rules, alertmanager
    )
    server, load = None, None
    try:
        started = time.monotonic()
        time.sleep(5)  # vLLM's target down and its sidecar's vllm source failing, before vLLM's container starts
        server = vllm_server.start(tmp_path / "vllm.log", port=port, load_delay_seconds=LOAD_DELAY_SECONDS)
        loaded = time.monotonic() - started
        print(f"vLLM answered {loaded:.0f} s after its sidecar started: {loaded * SPEEDUP / 60:.0f} minutes at this speed")
        assert loaded * SPEEDUP >= 15 * 60
        if loaded * SPEEDUP > 1800 - 60:
            pytest.skip(f"vLLM took {loaded:.0f} s to load here, past the start-up budget at this speed: a page would be right, this run cannot judge")
        load = start_load(url, clients=6, prompt_words=50, max_tokens=100)
        time.sleep(20)  # 3 minutes of ordinary load after the rollout
        load.stop()
        settle(alertmanager, 30)
        assert webhook.pages() == [], f"a rollout paged: {webhook.posts}"
        assert webhook.tickets() == [], f"a rollout opened tickets: {webhook.posts}"

        def incident(name: str, expected: str, cause, seconds: float, cured=None) -> None:
            mark = len(webhook.posts)
            cause()
            time.sleep(seconds)
            if cured:
                cured()
            settle(alertmanager, 90)
            assert not firing_alerts(alertmanager), f"{name}: still firing after 90 s: {firing_alerts(alertmanager)}"
            assert webhook.pages(mark) == [(expected,)], f"{name}: pages {webhook.pages(mark)}; everything sent: {webhook.posts[mark:]}"

        loads = []
        # The engine core stopped for 6 minutes at this speed, 8 requests in flight.
        core = engine_core(server)
        incident(
            "engine hung",
            "VllmTriageEngineWedged",
            lambda: (loads.append(start_load(url, clients=8, prompt_words=50, max_tokens=300)), time.sleep(10), os.kill(core, signal.SIGSTOP)),
            35,
            lambda: (os.kill(core, signal.SIGCONT), loads.pop().stop()),
        )
        # vLLM killed: the model's only replica is down, so the model pages (the pod's own alerts are tickets).
        mark = len(webhook.posts)
        server.kill()
        deadline = time.monotonic() + 60
        while not webhook.pages(mark) and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(20)  # VllmTargetDown's ticket and more
        assert webhook.pages(mark) == [("VllmModelUnavailable",)], f"vLLM down: {webhook.posts[mark:]}"
        # The sidecar restarts in the outage (an OOM kill, a node's restart of the container): it recalls that vLLM answered
        # before and which model it served, so the outage is no start: the page neither resolves nor comes again (7 minutes
        # at this speed).
        sidecar.process.kill()
        sidecar.process.wait()
        sidecar = start_sidecar(tmp_path, url, config, port=int(sidecar.url.rsplit(":", 1)[1]))
        time.sleep(45)
        assert webhook.pages(mark) == [("VllmModelUnavailable",)], f"vLLM down, its sidecar restarted: {webhook.posts[mark:]}"
        resolved = [post for post in webhook.posts[mark:] if post[0] == "pager" and post[2] == "resolved" and "VllmModelUnavailable" in post[1]]
        assert not resolved, f"the page resolved while vLLM was down: {webhook.posts[mark:]}"
        assert sidecar.condition("vllm_unreachable")["state"] == "active"
    finally:
        for process in (load, *locals().get("loads", [])):
            if process is not None:
                process.stop()
        if server is not None:
            with suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGCONT)
            server.stop()
        prometheus.stop()
        alertmanager_process.terminate()
        sidecar.process.kill()
        webhook.server.shutdown()


CAPTURES = REPO / "tests" / "data"
NAMESPACES = {"slo-0": "chat"}  # the pod whose model's SLO burns, alone in its namespace
REPLAY_SPEED = 10  # the sidecars replay 10 times faster than the captures were recorded: the same speed as the rules'


def replayed_incidents(tmp_path) -> dict[str, Path]:
    """pod -> its capture: real H200 captures (vLLM 0.26.0, all four sources), each incident stretched in place to the
    length people live through (tests/support/timeline.py), then each held at its last quiet seconds to one length."""
    incidents = {}
    capture = CAPTURES / "real-vllm-h200-rollout.jsonl.gz"
    at = timeline.marks(capture)
    incidents["rollout-0"] = (capture, timeline.stretched(timeline.load(capture), at["vllm_launched"], at["vllm_ready"] - 2, 300), "a 5-minute model load")
    capture = CAPTURES / "real-vllm-h200-kv_thrash.jsonl.gz"
    at = timeline.marks(capture)
    incidents["kv-0"] = (capture, timeline.stretched(timeline.load(capture), at["thrash"] + 60, at["recovery"], 1740), "a 30-minute KV saturation")
    capture = CAPTURES / "real-vllm-h200-hung_kernel.jsonl.gz"
    at = timeline.marks(capture)
    incidents["hung-0"] = (
        capture,
        timeline.stretched(timeline.load(capture), at["kernel_hung"] + 20, at["kernel_hung"] + 38, 600),
        "a kernel hung for 10 minutes",
    )
    capture = CAPTURES / "real-vllm-h200-killed.jsonl.gz"
    incidents["down-0"] = (capture, timeline.load(capture), "vLLM killed")
    capture = CAPTURES / "real-vllm-h200-api_server_bound.jsonl.gz"
    at = timeline.marks(capture)
    incidents["slo-0"] = (
        capture,
        timeline.stretched(timeline.load(capture), at["streaming"] + 20, at["streaming"] + 140, 1200),
        "20 minutes of a saturated API server: 83 % of the requests over the 2.5 s TTFT target",
    )
    length = max(r[-1].timestamp - r[0].timestamp for _, r, _ in incidents.values()) + 330  # the last incident's alerts resolve (keep_firing_for 5m)
    paths = {}
    for pod, (capture, readings, how) in incidents.items():
        last = readings[-1].timestamp
        held = timeline.stretched(readings, last - 15, last + 1, length - (last - 15 - readings[0].timestamp))
        paths[pod] = timeline.write(tmp_path / f"{pod}.jsonl.gz", capture, held, how)
    return paths


# A vLLM that never starts, as a live sidecar on this host sees it: vllm_unreachable's start bars at the rules' speed.
# The chart's defaults at this speed: its start-up budget, and no vLLM process for 150 s is no start.
NEVER_STARTS_CONFIG = "sources: vllm,process\n" + STARTUP_BUDGET + "conditions:\n  vllm_unreachable: {for_seconds: 2, not_started_seconds: 15}\n"
# An API server that dies 3 s after it starts (a bad model path), restarted 1 s later under a new pid (the kubelet's
# 10 s back-off at this speed).
CRASHING_API_SERVER = "import time; time.sleep(3); raise SystemExit(1)"


class CrashLoop:
    """Starts a process titled like vLLM's API server for `port` again each time it exits, until stopped."""

    def __init__(self, port: int) -> None:
        self.stopped = threading.Event()
        self.command = [sys.executable, "-c", CRASHING_API_SERVER, "vllm.entrypoints.openai.api_server", "--port", str(port)]
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            subprocess.run(self.command, check=False)
            self.stopped.wait(1)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)


def test_replayed_h200_incidents_page_once_each_and_a_rollout_pages_nobody(tmp_path):
    """The done-when of paging: four pods in one Prometheus and one Alertmanager, each a sidecar replaying a real H200
    capture at the default settings and the vLLM page that capture read (served back on the sidecar's clock); beside
    them two live sidecars whose vLLM never answers: one where no vLLM process ever starts, one crash-looping; and a pod
    whose saturated API server burns the model's TTFT SLO."""
    webhook = Webhook()
    alertmanager_process, alertmanager = start_alertmanager(tmp_path, faster_alertmanager(webhook.url))
    rules = tmp_path / "rules.yml"
    # the chat model's team set its TTFT objective (the chart's vllmThresholds): its fast burn pages
    rules.write_text(yaml.safe_dump(faster_rules({"ttftTargetSeconds": SLOS["ttft"][2]})))
    sidecars, pages = {}, {}
    try:
        incidents = replayed_incidents(tmp_path)
        first_started = time.monotonic()  # the first sidecar's capture loops first: the deadline counts from its start
        for pod, capture in incidents.items():
            (tmp_path / pod).mkdir()
            pages[pod] = timeline.ReplayedVllm(timeline.load(capture), REPLAY_SPEED)
            sidecars[pod] = start_sidecar(tmp_path / pod, "http://127.0.0.1:9", "", "--demo", "--demo-capture", str(capture), "--demo-speed", str(REPLAY_SPEED))
            pages[pod].restart_clock()
        readings = timeline.load(capture)
        length = readings[-1].timestamp - readings[0].timestamp  # every capture's
        addresses = {pod: page.address for pod, page in pages.items()}
        live_started = time.monotonic()
        for pod in ("never-0", "crash-0"):
            (tmp_path / pod).mkdir()
            port = vllm_server.free_port()  # nothing listens there
            addresses[pod] = f"127.0.0.1:{port}"
            sidecars[pod] = start_sidecar(tmp_path / pod, f"http://{addresses[pod]}", NEVER_STARTS_CONFIG)
        crash_loop = CrashLoop(int(addresses["crash-0"].rsplit(":", 1)[1]))
        prometheus = start_prometheus(
            tmp_path,
            {
                "vllm": [(address, {"namespace": NAMESPACES.get(pod, "llm"), "pod": pod}) for pod, address in addresses.items()],
                "vllm-triage": [(sidecars[pod].url.removeprefix("http://"), {"namespace": NAMESPACES.get(pod, "llm"), "pod": pod}) for pod in sidecars],
            },
            rules,
            alertmanager,
        )
        try:
            time.sleep(max(0.0, first_started + length / REPLAY_SPEED - 10 - time.monotonic()))  # before the first capture loops
            fired = {(s["metric"].get("pod", ""), s["metric"]["alertname"]) for s in prometheus.query('max_over_time(ALERTS{alertstate="firing"}[1h])')}
            prometheus_causes = prometheus.query('max_over_time(vllm_triage_condition_cause{condition="vllm_unreachable"}[1h]) == 1')
        finally:
            prometheus.stop()
            crash_loop.stop()
        posts = "\n".join(map(str, webhook.posts))
        for pod in sidecars:
            print(
                pod, "fired in Prometheus:", sorted(a for p, a in fired if p == pod), "paged:", webhook.pages(about=pod), "tickets:", webhook.tickets(about=pod)
            )
        assert webhook.first_paged("rollout-0") is None, posts
        assert not {"VllmTargetDown", "VllmTriageSourceDown", "VllmTriageVllmUnreachable"} & {a for p, a in fired if p == "rollout-0"}, fired
        # a full KV cache is capacity: a ticket, not a page (users' harm pages through the SLO burn, per model)
        assert webhook.first_paged("kv-0") is None, posts
        assert any("VllmTriageKvCacheSaturated" in names for names in webhook.tickets(about="kv-0")), posts
        assert webhook.pages(about="hung-0") == [("VllmTriageEngineWedged",)], posts
        # liveness by blast radius: vLLM killed on one of the model's four replicas is a ticket while it could be a restart,
        # and a page once it outlasts a start-up (30 minutes: VllmTriageVllmUnreachableLong), never before
        assert webhook.pages(about="down-0") == [("VllmTriageVllmUnreachableLong",)], posts
        paged = webhook.first_paged("down-0")
        assert paged is not None and paged - first_started >= 1800 / REPLAY_SPEED - 30, f"down-0 paged {paged - first_started:.0f} s in"
        assert any("VllmTriageVllmUnreachable" in names for names in webhook.tickets(about="down-0")), posts  # VllmTargetDown: inhibited by it
        # a vLLM that never starts and one that crash-loops, no model named by either: that model has no replica answering,
        # one page for it within 5 minutes (30 s at this speed: 15 s to not_started, 2 s, the alert's 6 s, group_wait's 3 s),
        # and 10 s (24 s measured here) for Prometheus' and Alertmanager's own rounds on a machine busy with other lanes
        assert [names for names in webhook.pages() if "VllmModelUnavailable" in names] == [("VllmModelUnavailable",)], posts
        first = webhook.first_paged("llm")
        print(f"the model of never-0 and crash-0 paged {first - live_started:.0f} s after their sidecars started" if first else "not paged")
        assert first is not None and first - live_started <= 30 + 10, f"the model of never-0 and crash-0: on the pager {first - live_started:.0f} s in"
        # users' harm pages through the SLO burn, once per model (its own namespace here: the burn is per model and namespace)
        assert webhook.pages(about="chat") == [("VllmTtftSloBurnFast",)], posts
        causes = {(s["metric"]["pod"], s["metric"]["cause"]) for s in prometheus_causes}
        assert ("crash-0", "crash_loop") in causes, causes
        # What made them one page: the other alerts about the same incident fired and were inhibited.
        assert {"VllmKvCacheFull", "VllmTriagePreemptionStorm"} <= {a for p, a in fired if p == "kv-0"}, fired
        assert "VllmTargetDown" in {a for p, a in fired if p == "down-0"}, fired
    finally:
        for page in pages.values():
            page.stop()
        for sidecar in sidecars.values():
            sidecar.process.kill()
        alertmanager_process.terminate()
        webhook.server.shutdown()
