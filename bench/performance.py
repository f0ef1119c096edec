"""Run the benchmarks of `make bench` and write what they printed to docs/performance.md, with the machine and the
commit they ran on. Nothing is enforced: the figures are this machine's, at this commit.

    make bench        # or: .venv/bin/python -m bench.performance [--out docs/performance.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent

# (module, what it measures): each prints its figures; the page quotes them as printed.
BENCHES = (
    (
        "bench.sidecar_overhead",
        "The sidecar's CPU, RSS and `/metrics` latency next to a real vLLM (CPU build) under 8 clients, all four sources at "
        "the default cadence, scraped as Prometheus would.",
    ),
    ("bench.scrape_bursts", "`/metrics` under bursts of 50 new connections and one back-to-back scraper, beside a bare aiohttp server's (the floor)."),
    ("bench.many_engines", "The same as the watched server grows to many data-parallel engines, and a page whose labels explode (refused)."),
    ("bench.many_gpus", "What each watched GPU adds to a tick and to `/metrics`, replaying the demo capture with its GPU readings copied."),
    (
        "bench.detection_latency",
        "The default settings replaying the demo capture and the flagship regimes' captures (a real vLLM 0.26.0 on an H200; "
        "gpu_shared and eager_change on an H100), each read as the default cadence reads it: CPU per tick, and when each "
        "verdict changes in each phase.",
    ),
)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "")
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{platform.machine()}, {psutil.cpu_count()} logical cores ({model or platform.processor() or 'CPU model unknown'}), "
        f"{memory:.0f} GiB; {platform.system()} {platform.release()}; Python {platform.python_version()}; "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", "exporter", "bench")
    return head + (" with uncommitted changes to exporter/ or bench/" if changed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    header = [
        "# Performance",
        "",
        "Written by `make bench` (`bench/performance.py`): each benchmark's output as it printed it, on the machine and at",
        "the commit below; nothing here is enforced by a test. Figures measured on the H200, and single runs by hand, are in",
        "[measurements.md](measurements.md).",
        "",
        f"- Machine: {machine()}",
        f"- Commit: {commit()}",
        f"- Run: {started:%Y-%m-%d %H:%M} UTC",
    ]
    sections = []
    for module, what in BENCHES:
        print(f"== {module}", flush=True)
        began = datetime.datetime.now(datetime.timezone.utc)
        run = subprocess.run([sys.executable, "-m", module], cwd=ROOT, capture_output=True, text=True, check=False)
        took = (datetime.datetime.now(datetime.timezone.utc) - began).total_seconds()
        print(run.stdout, end="", flush=True)
        output = run.stdout.rstrip() if run.returncode == 0 else f"failed (exit {run.returncode}):\n{(run.stdout + run.stderr).strip()[-3000:]}"
        sections += ["", f"## `python -m {module}`", "", f"{what} ({took:.0f} s)", "", "```text", output, "```"]
    Path(args.out).write_text("\n".join(header + sections) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
