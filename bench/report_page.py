"""The incident page's size and time to render for an hour of 2 s readings (the demo capture's ten minutes six times
over): the Python side (replay excluded) and Debian's headless chromium taking a full-page screenshot.

    .venv/bin/python -m bench.report_page
"""

from __future__ import annotations

import dataclasses
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from vllm_triage import html_report
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.pipeline import replay


def main() -> None:
    readings = list(read_readings(demo_capture_path()))
    span = readings[-1].timestamp - readings[0].timestamp + 2.0
    hour = [dataclasses.replace(r, timestamp=r.timestamp + k * span) for k in range(6) for r in readings]
    snapshots: list = []
    replay(hour, load(env={}), snapshots.append)
    started = time.perf_counter()
    page = html_report.render(hour, snapshots, "an hour of the demo")
    rendered = time.perf_counter() - started
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores")
    seconds = snapshots[-1].timestamp - snapshots[0].timestamp
    print(f"{len(hour)} readings over {seconds:.0f} s: page {len(page.encode()) / 1e6:.2f} MB, written in {rendered:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hour.html"
        path.write_text(page)
        command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1080,4000"]
        times = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run([*command, f"--screenshot={Path(tmp) / 'hour.png'}", path.as_uri()], capture_output=True, check=True, timeout=120)
            times.append(time.perf_counter() - started)
        print(f"chromium screenshot (start, render, write), 3 runs: {', '.join(f'{t:.2f} s' for t in times)}")


if __name__ == "__main__":
    main()
