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
from vllm_triage.capture import demo_capture_path, read_readings
from vllm_triage.cli import main
from vllm_triage.config import load
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
    for span in html_report.spans(snapshots):
        assert html.escape(span.verdict.next_actions[0]) in page  # each span's next actions, as the sidecar gives them
    # self-contained: nothing fetched, nothing run
    assert "<script" not in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_a_hang_is_a_band_of_engine_wedged_with_its_cause_and_the_evidence_it_came_with():
    readings, snapshots = judged(CAPTURES["hung_kernel"])
    page = html_report.render(readings, snapshots, "hung kernel")
    wedged = [s for s in html_report.spans(snapshots) if s.condition == "engine_wedged"]
    assert len(wedged) == 1 and wedged[0].primary and "hung_kernel" in wedged[0].causes
    assert "a kernel is resident and does not finish" in page


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
