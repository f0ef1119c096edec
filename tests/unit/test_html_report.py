"""The incident page (`vllm-triage replay --html`) of real captures: the verdict bands say what the replay judged,
the three layers are plotted, each span carries its evidence and next actions, and the file is self-contained."""

from __future__ import annotations

import dataclasses
import html
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from vllm_triage import html_report
from vllm_triage.cli import main
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.pipeline import replay

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURES = {
    "serving": demo_capture_path(),
    "hung_kernel": DATA / "real-vllm-h200-hung_kernel.jsonl.gz",
    "kv_thrash": DATA / "real-vllm-h200-kv_thrash.jsonl.gz",
}


def judged(path: Path) -> tuple[list, list]:
    readings = list(read_readings(path))
    snapshots: list = []
    replay(readings, load(env={}), snapshots.append)
    return readings, snapshots


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_page_shows_the_verdicts_the_replay_judged_over_the_three_layers(name, tmp_path):
    readings, snapshots = judged(CAPTURES[name])
    page = html_report.render(readings, snapshots, name)
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        ET.fromstring(svg)  # every plot is well-formed SVG
    active = {v.condition for s in snapshots for v in s.verdicts if v.active}
    lanes = set(re.findall(r'class="lane" text-anchor="end">([a-z_]+)<', page))
    assert lanes == active and active, (lanes, active)
    primaries = {s.primary for s in snapshots if s.primary}
    dark = set(re.findall(r'class="primary"><title>([a-z_]+)', page))
    assert dark == primaries
    titles = [html.unescape(t) for t in re.findall(r"<h3>([^<]+)</h3><svg", page)]
    assert {"Requests running and waiting", "KV cache usage", "Tokens", "GPU activity", "vLLM's processes: CPU"} <= set(titles), titles
    found = html_report.spans(snapshots)
    for span in found:
        assert html.escape(span.verdict.next_actions[0]) in page  # each span's next actions, as the sidecar gives them
        for advice in span.verdict.advice:  # and the advice /report prints, computed from what was observed
            assert html.escape(advice) in page
    # one primary at each moment: the dark bands are the ticks each verdict led, never two at once
    for snapshot in snapshots:
        leading = [s.condition for s in found for a, b in s.primary_runs if a <= snapshot.timestamp <= b]
        assert leading == ([snapshot.primary] if snapshot.primary else []), (snapshot.timestamp, leading, snapshot.primary)
    # the verdicts' sections, most severe first
    order = {"critical": 0, "warning": 1, "info": 2}
    listed = re.findall(r"<div class=\"span\"[^>]*><h3>[a-z_]+[^<]*: (critical|warning|info), ", page)
    assert [order[s] for s in listed] == sorted(order[s] for s in listed) and len(listed) == len(found)
    # self-contained: nothing fetched, nothing run
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_a_hang_is_a_band_of_engine_wedged_with_its_cause_and_the_evidence_it_came_with():
    readings, snapshots = judged(CAPTURES["hung_kernel"])
    page = html_report.render(readings, snapshots, "hung kernel")
    wedged = [s for s in html_report.spans(snapshots) if s.condition == "engine_wedged"]
    assert len(wedged) == 1 and wedged[0].primary and "hung_kernel" in wedged[0].causes
    assert "a kernel is resident and does not finish" in page


def test_a_verdict_that_led_for_a_while_is_dark_only_while_it_led_and_itl_has_its_own_axis():
    """kv_thrash: gpu_starved and preemption_storm lead for part of their spans, the KV cache's verdicts for the rest.
    ITL (tens of ms) is not drawn on TTFT's axis (seconds), where it would lie flat on the floor."""
    readings, snapshots = judged(CAPTURES["kv_thrash"])
    page = html_report.render(readings, snapshots, "kv thrash")
    partly = [s for s in html_report.spans(snapshots) if s.primary and s.primary_runs != ((s.start, s.end),)]
    assert partly
    for span in partly:
        led = sum(b - a for a, b in span.primary_runs)
        assert 0 <= led < span.end - span.start
        assert re.search(rf"{span.condition}[^<]*: [a-z]+, primary \+\d+–\+\d+ s[^<]*, else secondary", page), span.condition
    titles = [html.unescape(t) for t in re.findall(r"<h3>([^<]+)</h3><svg", page)]
    ttft, itl = (
        re.search(rf"<h3>{t}</h3>(<svg.*?</svg>)", page, re.S)
        for t in ("Time to first token \\(window quantiles\\)", "Inter-token latency \\(window quantiles\\)")
    )
    assert ttft and itl, titles
    assert "ITL p50" in itl.group(1) and "ITL" not in ttft.group(1) and "TTFT p95" in ttft.group(1)


def test_an_hour_of_readings_stays_a_small_file(tmp_path):
    """An hour of 2 s readings (the demo's 10 minutes six times over): under 2 MB."""
    readings = list(read_readings(demo_capture_path()))
    span = readings[-1].timestamp - readings[0].timestamp + 2.0
    hour = [dataclasses.replace(r, timestamp=r.timestamp + k * span) for k in range(6) for r in readings]
    snapshots: list = []
    replay(hour, load(env={}), snapshots.append)
    page = html_report.render(hour, snapshots, "an hour")
    assert snapshots[-1].timestamp - snapshots[0].timestamp >= 3400
    assert len(page.encode()) < 2_000_000, len(page.encode())


def test_replay_writes_the_page(tmp_path, capsys):
    out = tmp_path / "incident.html"
    assert main(["replay", str(CAPTURES["kv_thrash"]), "--html", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "kv_cache_saturated" in page
    assert f"wrote {out}" in capsys.readouterr().err


def test_the_live_sidecar_serves_the_page_of_its_last_minutes_and_report_writes_it(tmp_path):
    from harness.components import get, start_sidecar

    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "window_seconds: 20\n", "--demo")
    try:
        time.sleep(8)  # a few seconds of the demo's readings in memory
        status, body = get(sidecar.url + "/report.html")
        assert status == 200 and body.startswith(b"<!DOCTYPE html>") and b"Requests running and waiting" in body, body[:300]
        assert b'href="report.html"' in get(sidecar.url + "/")[1]
        out = tmp_path / "live.html"
        assert main(["report", "--url", sidecar.url, "--html", str(out)]) == 0
        assert "the bundled demo capture" in out.read_text()
    finally:
        sidecar.process.kill()


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_live_page_reads_only_the_plotted_samples_and_draws_the_same_page(name):
    """The live page takes from the in-memory window only the samples the plots read (html_report.PLOTTED: a reload of
    the page every second with 31 engines cost 0.22 cores when every sample was copied): the page is the same."""
    from vllm_triage.pipeline import Pipeline

    readings = list(read_readings(CAPTURES[name]))[-120:]
    pipeline, snapshots = Pipeline(load(env={}), readings), []
    pipeline.replay(readings, snapshots.append)
    every, plotted = pipeline.store.readings(), pipeline.store.readings(html_report.PLOTTED)
    assert sum(len(r.samples) for r in plotted) < sum(len(r.samples) for r in every)
    assert html_report.render(plotted, snapshots, name) == html_report.render(every, snapshots, name)


def test_a_verdict_active_before_the_page_begins_says_since_when_and_that_it_is_clipped():
    """The live page shows the sidecar's last minutes: a verdict active since before them (the demo's KV saturation, 80 s
    into the last window) is drawn from the page's edge with an arrow, and says when it began; its evidence is said to be
    the first tick's, not its onset's."""
    readings, snapshots = judged(CAPTURES["serving"])
    onset = next(s.timestamp for s in snapshots if any(v.condition == "kv_cache_saturated" and v.active for v in s.verdicts))
    late = [s for s in snapshots if s.timestamp >= onset + 80]
    page = html_report.render([r for r in readings if r.timestamp >= onset + 80], late, "the last minutes")
    saturated = next(v for v in late[0].verdicts if v.condition == "kv_cache_saturated")
    assert saturated.active and saturated.since is not None and saturated.since < late[0].timestamp
    assert f"Active since {html_report._wall(saturated.since)} UTC" in page and "before this page begins" in page
    assert "◂" in page and "Evidence at the page's first tick" in page
