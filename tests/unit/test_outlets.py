"""/metrics, /diagnosis, /healthz, /readyz and / as a scraper and a person see them."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gzip
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from vllm_triage.config_loader import load
from vllm_triage.daemon import Daemon
from vllm_triage.diagnosis.conditions import CONDITIONS
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.server import make_app

from harness.components import get, start_sidecar

from .pages import Counters, failed, page, reading
from .test_vllm_source import free_port


def serve_and_get(daemon: Daemon, requests: list[tuple[str, dict[str, str]]]):
    async def body():
        runner = web.AppRunner(make_app(daemon))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        out = []
        try:
            async with aiohttp.ClientSession(auto_decompress=False) as session:
                for path, headers in requests:
                    # aiohttp asks for gzip by default; a plain scraper may not
                    headers = {"Accept-Encoding": "identity", **headers}
                    async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response:
                        out.append((response.status, dict(response.headers), await response.read()))
        finally:
            await runner.cleanup()
        return out

    return asyncio.run(body())


def saturated_daemon() -> Daemon:
    clock = {"t": 0.0}
    config = load(env={}, flags={"max_num_seqs": "64"})
    daemon = Daemon(config, clock=lambda: clock["t"])
    c = Counters()
    for i in range(40):
        clock["t"] = i * 2.0
        c.preemptions += 4
        c.finished += 2
        c.generation_tokens += 480
        daemon.ingest(reading(clock["t"], page(60, 12, 1.0, c)))
        daemon.tick()
    return daemon


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_before_first_evaluation_and_readyz():
    daemon = Daemon(load(env={}))
    (metrics, ready, health, diagnosis) = serve_and_get(daemon, [("/metrics", {}), ("/readyz", {}), ("/healthz", {}), ("/diagnosis", {})])
    assert metrics[0] == 200 and b"vllm_triage_build_info" in metrics[2]
    assert ready[0] == 503 and health[0] == 200
    assert diagnosis[0] == 503 and json.loads(diagnosis[2])["status"] == "starting"


def test_metrics_carry_verdicts_signals_and_health():
    daemon = saturated_daemon()
    ((status, headers, body), ready) = serve_and_get(daemon, [("/metrics", {}), ("/readyz", {})])
    assert status == 200 and ready[0] == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    got = families(body.decode())
    active = {s.labels["condition"]: s for s in got["vllm_triage_condition_active"].samples}
    assert set(active) == {c.id for c in CONDITIONS}  # every condition, ids exactly as the table
    assert active["kv_cache_saturated"].value == 1.0
    assert active["kv_cache_saturated"].labels == {"condition": "kv_cache_saturated", "layer": "1", "severity": "warning"}
    assert active["request_errors"].value == 0.0
    causes = {(s.labels["condition"], s.labels["cause"]): s.value for s in got["vllm_triage_condition_cause"].samples}
    assert causes[("queue_backlog", "kv_capacity")] == 1.0 and causes[("queue_backlog", "unknown")] == 0.0
    kv = {s.labels["stat"]: s.value for s in got["vllm_triage_vllm_kv_cache_usage_ratio"].samples}
    assert kv["mean"] == 1.0
    assert {s.labels["source"]: s.value for s in got["vllm_triage_source_up"].samples} == {"vllm": 1.0}
    thresholds = {(s.labels["condition"], s.labels["threshold"]): s.value for s in got["vllm_triage_condition_threshold"].samples}
    assert thresholds[("kv_cache_saturated", "usage_min")] == 0.8
    assert "process_resident_memory_bytes" in got  # the sidecar's own footprint
    # no colons, units in names, HELP says the values are windowed
    assert all(":" not in name for name in got)
    assert "Windowed" in got["vllm_triage_vllm_requests_waiting"].documentation


def test_openmetrics_and_gzip_when_asked():
    daemon = saturated_daemon()
    ((_, om_headers, om_body), (_, gz_headers, gz_body)) = serve_and_get(
        daemon,
        [("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}), ("/metrics", {"Accept-Encoding": "gzip"})],
    )
    assert om_headers["Content-Type"].startswith("application/openmetrics-text")
    assert om_body.rstrip().endswith(b"# EOF")
    assert gz_headers["Content-Encoding"] == "gzip"
    assert b"vllm_triage_condition_active" in gzip.decompress(gz_body)


def test_diagnosis_json_says_what_why_and_what_next():
    daemon = saturated_daemon()
    ((status, _, body),) = serve_and_get(daemon, [("/diagnosis", {})])
    doc = json.loads(body)
    assert status == 200
    kv = next(c for c in doc["conditions"] if c["condition"] == "kv_cache_saturated")
    assert kv["state"] == "active" and 0.5 < kv["score"] <= 1
    assert kv["since"] is not None and kv["next_actions"]
    assert any(e["signal"] == "kv_cache_usage_ratio_mean" and e["holds"] and e["threshold"] == 0.8 for e in kv["evidence"])
    backlog = next(c for c in doc["conditions"] if c["condition"] == "queue_backlog")
    assert backlog["cause"] == "kv_capacity"
    assert doc["sources"]["vllm"]["up"] is True
    assert doc["discovery"]["max_num_seqs_origin"] == "config"
    assert doc["signals"]["m/0"]["requests_waiting_mean"] == 12
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == 1  # first, so a consumer reads it first


def test_report_reads_like_the_diagnose_command_and_is_rendered_once_per_snapshot():
    daemon = saturated_daemon()
    (first, second) = serve_and_get(daemon, [("/report", {}), ("/report", {})])
    status, headers, body = first
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    assert text.startswith("vllm-triage: http://127.0.0.1:8000 at ") and "\nvllm-triage diagnosis of http://127.0.0.1:8000" in text
    assert "kv_cache_saturated" in text and "Capacity is the limit" in text
    assert second[2] == body
    starting = Daemon(load(env={}))
    ((status, _, _),) = serve_and_get(starting, [("/report", {})])
    assert status == 503


def test_vllm_down_keeps_metrics_answering_with_unknowns():
    daemon = saturated_daemon()
    t0 = daemon.snapshot.timestamp if daemon.snapshot else 0.0

    def fail_until(seconds: float) -> dict:
        for i in range(1, int(seconds / 2) + 1):
            daemon.clock = lambda i=i: t0 + i * 2.0
            daemon.ingest(failed(t0 + i * 2.0))
            daemon.tick()
        ((status, _, body),) = serve_and_get(daemon, [("/metrics", {})])
        assert status == 200
        return families(body.decode())

    got = fail_until(48)
    assert {s.labels["source"]: s.value for s in got["vllm_triage_source_up"].samples}["vllm"] == 0.0
    errors = {s.labels["reason"]: s.value for s in got["vllm_triage_source_errors"].samples}
    assert errors["connect"] == 24
    active = {s.labels["condition"]: s.value for s in got["vllm_triage_condition_active"].samples}
    unknown = {s.labels["condition"]: s.value for s in got["vllm_triage_condition_unknown"].samples}
    primary = {s.labels["condition"]: s.value for s in got["vllm_triage_condition_primary"].samples}
    assert active["vllm_unreachable"] == 1.0 and primary["vllm_unreachable"] == 1.0
    # unknown since 15 s (stale_after), held active for its 60 s clear_for: the page does not flap
    assert active["kv_cache_saturated"] == 1.0 and unknown["kv_cache_saturated"] == 1.0
    got = fail_until(100)
    active = {s.labels["condition"]: s.value for s in got["vllm_triage_condition_active"].samples}
    unknown = {s.labels["condition"]: s.value for s in got["vllm_triage_condition_unknown"].samples}
    assert active["kv_cache_saturated"] == 0.0 and unknown["kv_cache_saturated"] == 1.0


def test_landing_page_links_the_endpoints():
    ((status, headers, body),) = serve_and_get(saturated_daemon(), [("/", {})])
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    for link in (b'href="metrics"', b'href="diagnosis"', b'href="report"', b'href="healthz"', b'href="readyz"'):
        assert link in body
    assert b"kv_cache_saturated" in body


@pytest.mark.parametrize("capture", ["gpu-starved-h200.jsonl.gz", "gpu-h200-phases.jsonl.gz", "demo"])
def test_exposition_of_every_layer_passes_promtool_check_metrics(capture):
    """Every family the sidecar exports, fed by real readings of all four sources, linted as node_exporter's are."""
    path = demo_capture_path() if capture == "demo" else Path(__file__).resolve().parents[1] / "data" / capture
    readings = list(read_readings(path))
    clock = {"t": readings[0].timestamp}
    daemon = Daemon(load(env={}), clock=lambda: clock["t"])
    for r in readings[:300]:
        clock["t"] = r.timestamp
        daemon.ingest(r)
        daemon.tick()
    text = daemon.exposition.render(openmetrics=False).decode()
    assert "vllm_triage_condition_active" in text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result.stdout + result.stderr


def test_report_marks_what_holds_but_is_not_yet_active_and_names_sources_turned_off():
    clock = {"t": 0.0}
    daemon = Daemon(load(env={}, flags={"max_num_seqs": "64", "sources": "vllm"}), clock=lambda: clock["t"])
    c = Counters()
    for i in range(5):  # 8 s of saturation: the predicate holds, kv_cache_saturated's `for` (60 s) has not passed
        clock["t"] = i * 2.0
        c.preemptions += 4
        c.finished += 2
        c.generation_tokens += 480
        daemon.ingest(reading(clock["t"], page(60, 12, 1.0, c)))
        daemon.tick()
    ((_, _, body), (_, _, doc)) = serve_and_get(daemon, [("/report", {}), ("/diagnosis", {})])
    text = body.decode()
    kv = next(c for c in json.loads(doc)["conditions"] if c["condition"] == "kv_cache_saturated")
    assert kv["state"] == "inactive" and kv["raw"] is True
    assert "kv_cache_saturated on m/0: KV cache is full and requests are queueing or being preempted (holds now; not active until" in text
    assert re.search(r"condition\(s\) missing source gpu is turned off \(the sources setting\): [a-z_, ]*gpu_starved", text), text


def test_a_vllm_page_with_an_exploding_label_is_refused_while_the_sidecar_keeps_answering(tmp_path):
    """10 MiB of `vllm:` series with a label that changes per series (160k engine/model combinations).
    Before the series limit, the sidecar judged every one of them on its event loop: /metrics never
    answered again and SIGTERM went unheard."""
    (tmp_path / "metrics").write_text("".join(f'vllm:num_requests_running{{engine="0",model_name="m{i}"}} 1\n' for i in range(160_000)))
    port = free_port()
    vllm = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)])
    try:
        sidecar = start_sidecar(tmp_path, f"http://127.0.0.1:{port}", "sources: [vllm]\n")
        try:

            def refused() -> float:
                errors = sidecar.metrics().get("vllm_triage_source_errors", [])
                return sum(s.value for s in errors if s.labels["reason"] == "too_many_series")

            sidecar.wait_for(lambda: refused() >= 3, 60, "three scrapes refused for too many series")
            assert {s.labels["source"]: s.value for s in sidecar.metrics()["vllm_triage_source_up"]}["vllm"] == 0.0
            diagnosis = sidecar.diagnosis()
            assert "160000 vllm: series, over the 15000 limit (max_series)" in diagnosis["sources"]["vllm"]["last_error"]
            unreachable = sidecar.condition("vllm_unreachable")
            assert any(e["text"].startswith("last error (too_many_series): the page has 160000") for e in unreachable["evidence"])
            assert any("max_series" in action for action in unreachable["next_actions"])
            sidecar.process.send_signal(signal.SIGTERM)
            assert sidecar.process.wait(timeout=15) == 0
        finally:
            sidecar.process.kill()
            sidecar.process.wait()
    finally:
        vllm.kill()
        vllm.wait()


def test_serve_demo_judges_the_bundled_capture_and_says_what_it_lacks(tmp_path):
    """What `make run` starts: the bundled capture replayed at real speed behind the real endpoints."""
    demo = start_sidecar(tmp_path, "http://127.0.0.1:9", "", "--demo")
    try:
        layers = (b"source vllm: up", b"source gpu: up", b"source process: up", b"source gil: up")
        demo.wait_for(lambda: all(layer in get(demo.url + "/report")[1] for layer in layers), 30, "every layer of the demo")
        report = get(demo.url + "/report")[1].decode()
        assert report.startswith("vllm-triage: the bundled demo capture at ") and "\nvllm-triage diagnosis of the bundled demo capture" in report, report
        assert "vLLM version: 0.26.0" in report
        demo.process.terminate()
        assert demo.process.wait(timeout=15) == 0
    finally:
        demo.process.kill()
        demo.process.wait()


def test_a_format_is_rendered_once_asked_for_and_at_ticks_while_scraped_often():
    daemon = saturated_daemon()
    assert daemon.exposition.rendered(openmetrics=True) is None  # nobody asked: ticks render nothing
    ((_, _, first), (_, _, second)) = serve_and_get(daemon, [("/metrics", {})] * 2)
    assert first == second
    assert daemon.exposition.rendered(openmetrics=True) is None
    daemon.tick()
    assert daemon.exposition.rendered(openmetrics=False) is not None  # asked for twice in a row: ready at every tick


def scrape_timeline(offsets: list[float], period: float, seconds: float, tick: float | None = None) -> tuple[int, int, int]:
    """Ticks every `tick` s (the default tick_seconds) and scrapers every `period` s at `offsets`; (renders, scrapes,
    scrapes that found the body ready). Every scrape must read the current snapshot's body, ready or rendered then."""
    daemon = saturated_daemon()
    exposition = daemon.exposition
    tick = tick or exposition.tick_seconds
    events = sorted(
        [(t, "tick") for t in [i * tick for i in range(int(seconds / tick))]]
        + [(o + k * period, "scrape") for o in offsets for k in range(int(seconds / period))]
    )
    scrapes = ready = 0
    for now, kind in events:
        if kind == "tick":
            snapshot = daemon.pipeline.evaluate(now)
            exposition.update(snapshot, now)
            continue
        scrapes += 1
        exposition.scraped(True, now)
        body = exposition.rendered(True)
        ready += body is not None
        body = body or exposition.render(True)
        evaluated = re.search(rb"^vllm_triage_last_evaluation_timestamp_seconds (\S+)$", body, re.MULTILINE)
        assert evaluated and float(evaluated[1]) == snapshot.timestamp
    return exposition.renders, scrapes, ready


def test_a_format_is_rendered_at_the_ticks_before_its_scrapes_are_due():
    # Prometheus every 15 s, ticks every 5 s (120 in 600 s): after the first three scrapes, each finds its body
    # ready, rendered at the one tick before it was due (or a quarter tick after); whatever the scrapes' offset.
    for offset in (0.7, 0.1, 1.9):
        renders, scrapes, ready = scrape_timeline([offset], 15.0, 600.0)
        assert scrapes == 40 and ready >= scrapes - 3 and renders <= scrapes + 8, (offset, renders, ready)
    # An HA pair scraping at different offsets: the same.
    renders, scrapes, ready = scrape_timeline([0.7, 5.3], 15.0, 600.0)
    assert scrapes == 80 and ready >= scrapes - 4 and renders <= scrapes + 8
    # One request (a person's curl): rendered for it, not at every tick after.
    assert scrape_timeline([0.7], 100.0, 120.0) == (1, 1, 0)
    # A scraper faster than the tick: rendered on every tick.
    renders, scrapes, ready = scrape_timeline([0.5], 1.0, 60.0)
    assert ready >= scrapes - 3 and renders >= 60 / load(env={}).tick_seconds


GOLDEN = Path(__file__).resolve().parents[1] / "data" / "exposition.golden.txt"


def test_the_whole_exposition_matches_the_golden_file():
    """node_exporter's end-to-end test: the demo (a real vLLM on the H200, all four sources) replayed to
    minute 6 and rendered; every family, label and value the sidecar exports, against a committed file.
    The sidecar's own process_*/python_*/CPU footprint and build versions vary by machine and are left out.
    After an intended change: UPDATE_GOLDEN=1 pytest tests/unit/test_outlets.py -k golden, and review the diff."""
    readings = list(read_readings(demo_capture_path()))
    clock = {"t": readings[0].timestamp}
    daemon = Daemon(load(env={}), clock=lambda: clock["t"])
    for recorded in readings:
        if recorded.timestamp > readings[0].timestamp + 370:
            break
        clock["t"] = recorded.timestamp
        daemon.ingest(recorded)
        daemon.tick()
    text = daemon.exposition.render(openmetrics=False).decode()
    own = tuple(f"{prefix}{name}" for prefix in ("", "# HELP ", "# TYPE ") for name in ("process_", "python_", "vllm_triage_sidecar_cpu_seconds"))
    own += ("vllm_triage_build_info",)
    kept = "".join(line + "\n" for line in text.splitlines() if not line.startswith(own))
    # Prometheus refuses a whole scrape with one series twice (a family whose signals disagree on their labels)
    series = [(s.name, tuple(sorted(s.labels.items()))) for family in text_string_to_metric_families(kept) for s in family.samples]
    assert not [key for key, count in collections.Counter(series).items() if count > 1]
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(kept)
    assert kept == GOLDEN.read_text(), "the exposition changed: UPDATE_GOLDEN=1 to accept it after reviewing the diff"


def test_a_reloaded_config_judges_the_readings_already_in_its_window():
    """After a config file change the new daemon continues from the old one's readings: its first
    evaluation already sees the saturated window (with the new threshold), not an empty one."""
    before = saturated_daemon()
    assert before.snapshot is not None and "kv_cache_saturated" in {v.condition for v in before.snapshot.verdicts if v.active}
    retuned = load(env={}, flags={"max_num_seqs": "64"})
    immediate = dataclasses.replace(retuned.conditions["kv_cache_saturated"], for_seconds=0.0)
    retuned = dataclasses.replace(retuned, conditions={**retuned.conditions, "kv_cache_saturated": immediate})
    after = Daemon(retuned, clock=lambda: 78.0)
    after.take_over(before)
    assert after.snapshot is before.snapshot  # served until its own first evaluation
    snapshot = after.tick()
    verdict = next(v for v in snapshot.verdicts if v.condition == "kv_cache_saturated")
    assert verdict.active and snapshot.signals  # judged on the inherited window at once


def test_a_reload_keeps_each_verdict_where_it_stood():
    """Any valid reload, even of an unrelated key: active verdicts stay active since the same moment (their alerts
    neither resolve nor page again), the primary stays, and the evaluation count goes on."""
    before = saturated_daemon()
    assert before.snapshot is not None
    active = {v.condition: v.since for v in before.snapshot.verdicts if v.active}
    assert "kv_cache_saturated" in active
    after = Daemon(load(env={}, flags={"max_num_seqs": "64", "log_level": "debug"}), clock=lambda: 78.0)  # default `for`s: 60 s and more
    after.take_over(before)
    snapshot = after.tick()
    assert {v.condition: v.since for v in snapshot.verdicts if v.active} == active
    assert snapshot.primary == before.snapshot.primary
    assert snapshot.evaluations == before.snapshot.evaluations + 1


def test_the_live_incident_page_shows_the_verdicts_as_the_sidecar_gave_them_outage_included():
    """The live /report.html once judged its window again from the successful scrapes only: during an outage it said
    no verdict was active, and its onsets came late. It now draws the snapshots the sidecar served: vllm_unreachable
    is a band, and each band starts at the `since` /diagnosis gave."""
    from vllm_triage import html_report

    daemon = saturated_daemon()  # 80 s of a saturated vLLM
    clock = daemon.clock
    start = clock()
    for i in range(1, 31):  # then 60 s of failed scrapes
        now = start + 2.0 * i
        daemon.clock = lambda now=now: now
        daemon.ingest(failed(now))
        daemon.tick()
    last = daemon.snapshot
    assert last is not None
    unreachable = next(v for v in last.verdicts if v.condition == "vllm_unreachable")
    assert unreachable.active
    ((status, _, body),) = serve_and_get(daemon, [("/report.html", {})])
    lanes = set(re.findall(rb'class="lane" text-anchor="end">([a-z_]+)<', body))
    assert status == 200 and b"vllm_unreachable" in lanes, lanes
    spans = {s.condition: s for s in html_report.spans(list(daemon.history))}
    assert spans["vllm_unreachable"].start == unreachable.since


def test_a_flood_of_bundle_requests_builds_one_bundle_and_a_reload_answers_503_not_500(monkeypatch):
    """3,000 requests once kept the sidecar at 0.9 of a core for minutes, each building its own bundle behind a lock; a
    reload while they waited answered 500 with a traceback. Now the requests of ASKED_BUNDLE_SECONDS share one build, and
    a reload says 503 with when to ask again."""
    from vllm_triage import daemon as daemon_module

    built = []

    def counting(*args: object) -> bytes:
        built.append(args[0])
        return b"bundle"

    monkeypatch.setattr(daemon_module, "bundle_archive", counting)
    daemon = saturated_daemon()
    answers = serve_and_get(daemon, [("/bundle.tar.gz", {})] * 40)
    assert [a[0] for a in answers] == [200] * 40 and built == ["asked"]
    daemon._asked = None  # past ASKED_BUNDLE_SECONDS: the next request builds anew, on a pipeline a reload shut down
    daemon.shutdown()
    ((status, headers, body),) = serve_and_get(daemon, [("/bundle.tar.gz", {})])
    assert status == 503 and headers["Retry-After"] == "5" and b"ask again" in body
