"""The on-call report's first screen (report.py): what holds, since when, the numbers that decided it, the one thing to
do and where the runbook is, in ten lines; the rest below a rule. On the bundled demo (a real vLLM 0.26.0 on an H200)."""

from __future__ import annotations

import re

from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.model import Reading
from vllm_triage.pipeline import Pipeline
from vllm_triage.report import HEADLINE_LINES, RULE, format_report
from vllm_triage.server import landing_page


def demo_at(seconds: float, *, readings: list[Reading] | None = None):
    """The snapshot a live sidecar at the defaults would show `seconds` into the demo (idle 30 s, 2 clients 190 s, 40
    clients on a 48-block cache 190 s, recovery 150 s)."""
    readings = readings if readings is not None else list(read_readings(demo_capture_path()))
    start = readings[0].timestamp
    snapshots: list = []
    Pipeline(load(env={}), readings).replay([r for r in readings if r.timestamp <= start + seconds], snapshots.append)
    return snapshots[-1]


def test_the_first_screen_of_the_kv_saturated_phase_says_what_since_why_and_what_to_do():
    snapshot = demo_at(30 + 190 + 120)  # two minutes into the 40 clients
    report = format_report(snapshot, "demo")
    first, _, rest = report.partition(RULE)
    lines = first.strip("\n").split("\n")
    assert len(lines) <= HEADLINE_LINES, first
    assert re.match(r"PRIMARY +\[warning\] kv_cache_saturated on tiny/0 since \d\d:\d\d:\d\d UTC \(1 min \d\d s\)", lines[1]), lines[1]
    because = next(line for line in lines if line.startswith("BECAUSE"))
    assert "KV cache usage (window mean)" in because and "preemptions per second" in because
    do = next(line for line in lines if line.startswith("DO"))
    assert re.search(r"--max-num-seqs \d+: the cache's 768 KV tokens hold", do), do  # computed from what was observed
    assert any(line.startswith("RUNBOOK") and line.endswith("runbooks.md#vllmtriagekvcachesaturated") for line in lines)
    also = [line for line in lines if line.startswith("ALSO")]
    assert any("queue_backlog (cause kv_capacity)" in line for line in also) and any("preemption_storm" in line for line in also)
    # below the rule: the evidence in full, the observed cause's actions, and no action for a cause not observed
    assert "WHAT IS WRONG" in rest and "(other cause)" not in rest and "more for causes not observed: --verbose" in rest
    assert "(other cause) cause=concurrency_cap" in format_report(snapshot, "demo", verbose=True)
    page = landing_page(snapshot, "demo")
    assert page.index("kv_cache_saturated on tiny/0") < page.index("Endpoints") and 'http-equiv="refresh"' in page


def test_an_outage_is_one_reason_once_with_what_it_blinds():
    """vLLM down for five minutes: each condition that needs its page could not be judged for the same reason; the report
    says that reason once with the conditions it blinds, not once per condition."""
    readings = list(read_readings(demo_capture_path()))
    cut = readings[0].timestamp + 100
    down = [r for r in readings if r.timestamp <= cut] + [
        Reading("vllm", cut + t, False, error="Cannot connect to host 127.0.0.1:8000", error_reason="connect") for t in range(5, 300, 5)
    ]
    report = format_report(demo_at(395, readings=down), "demo")
    judged = report.split("COULD NOT JUDGE\n", 1)[1]
    reasons = [line for line in judged.split("\n") if line.startswith("  ")]
    assert len(reasons) < 4 and "source vllm is down" in reasons[0], judged
    assert re.match(r"  \d+ condition\(s\) missing ", reasons[0])
    assert report.count("Cannot connect to host") <= 3, report
