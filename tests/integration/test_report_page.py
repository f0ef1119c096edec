"""The incident page of real captures in a real headless browser (Debian's chromium): it renders, bands and plots
drawn, with nothing fetched; the screenshot is what the README shows for the demo."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
from vllm_triage import html_report
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.pipeline import replay

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURES = {
    "serving": demo_capture_path(),
    "hung_kernel": DATA / "real-vllm-h200-hung_kernel.jsonl.gz",
    "kv_thrash": DATA / "real-vllm-h200-kv_thrash.jsonl.gz",
}
WIDTH, HEIGHT = 1080, 1800


def chromium(*args: str) -> subprocess.CompletedProcess[bytes]:
    # --no-sandbox: CI runs as root; the page is our own file, with no script
    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-background-networking", *args]
    return subprocess.run(command, capture_output=True, timeout=120, check=True)


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_incident_page_renders_in_a_real_browser_with_its_bands_and_plots(name, tmp_path):
    readings = list(read_readings(CAPTURES[name]))
    snapshots: list = []
    replay(readings, load(env={}), snapshots.append)
    page = tmp_path / f"{name}.html"
    page.write_text(html_report.render(readings, snapshots, name))
    dom = chromium("--dump-dom", page.as_uri()).stdout.decode()
    spans = html_report.spans(snapshots)
    # one band per verdict span, and a dark one over it for each run of ticks it led, as the browser parsed them
    assert dom.count("<rect ") == len(spans) + sum(len(s.primary_runs) for s in spans) and spans
    assert dom.count("<polyline ") >= 10 and "<script" not in dom
    shot = tmp_path / f"{name}.png"
    chromium(f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", page.as_uri())
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (WIDTH, HEIGHT)
    # a blank page compresses to a few kB; the bands, the plots' lines and their labels do not
    assert len(png) > 40_000, len(png)
