"""Property-based fuzzing of the page path: parse -> ingest -> signals -> judge -> every output, on
mutations of real vLLM pages (values, labels, bucket order, truncation, bytes). Whatever a page holds:
no exception escapes a tick, /diagnosis is strict JSON, /metrics parses as exposition text, and health
tells the truth (a refused page marks the source down, an accepted one up).

A short budget runs in `make test`; `make fuzz` runs FUZZ_EXAMPLES (default there: 2000) examples.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from vllm_triage.config_loader import load
from vllm_triage.daemon import Daemon
from vllm_triage.model import VLLM_SOURCE, Reading, diagnosis_json
from vllm_triage.report import format_report
from vllm_triage.sources.vllm import ScrapeError, SeriesMemo, parse_page

DATA = Path(__file__).resolve().parents[1] / "data"
PAGES = [
    (DATA / name).read_text()
    for name in ("vllm-0.32.0-cpu-kv-saturated.metrics.txt", "vllm-0.32.0-cpu-idle.metrics.txt", "vllm-0.26.0-h200-kv-saturated.metrics.txt")
]
SAMPLE_LINES = [[i for i, line in enumerate(page.splitlines()) if line.startswith("vllm:")] for page in PAGES]
NASTY_VALUES = ["+Inf", "-Inf", "NaN", "1e308", "-1e308", "1.7976931348623157e308", "-0", "0x10", "1e-320", "", "abc", "9" * 400]
NASTY_LABELS = ["", "abc", "0x10", "\\n", 'a"b', "é" * 50, "x" * 3000, "+Inf", "NaN", "-1"]


def mutate(page: str, lines: list[int], choices: list[tuple[int, int, int]]) -> str:
    """Apply (kind, which line, which nasty thing) mutations to a real page."""
    rows = page.splitlines()
    for kind, where, what in choices:
        index = lines[where % len(lines)]
        row = rows[index]
        name_and_labels, _, _ = row.rpartition(" ")
        if kind == 0:  # a nasty value
            rows[index] = f"{name_and_labels} {NASTY_VALUES[what % len(NASTY_VALUES)]}"
        elif kind == 1 and "le=" in row:  # a nasty bucket bound
            head, _, tail = row.partition('le="')
            rows[index] = head + 'le="' + NASTY_LABELS[what % len(NASTY_LABELS)] + '"' + tail.partition('"')[2]
        elif kind == 2 and "model_name=" in row:  # a nasty label value
            head, _, tail = row.partition('model_name="')
            rows[index] = head + 'model_name="' + NASTY_LABELS[what % len(NASTY_LABELS)] + '"' + tail.partition('"')[2]
        elif kind == 3:  # swap two sample lines (bucket order, families interleaved)
            other = lines[what % len(lines)]
            rows[index], rows[other] = rows[other], rows[index]
        elif kind == 4:  # a counter that goes backwards or jumps
            rows[index] = f"{name_and_labels} {random.Random(what).uniform(-1e6, 1e12):.6g}"
        elif kind == 5:  # cut the page here
            rows = [*rows[:index], row[: what % max(1, len(row))]]
            break
        elif kind == 6:  # garbage bytes in a line
            rows[index] = row[: what % max(1, len(row))] + bytes(range(what % 7, 256, 7)).decode("latin-1")
    return "\n".join(rows) + "\n"


def strict_json(body: bytes) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


mutation = st.tuples(st.integers(0, 6), st.integers(0, 10_000), st.integers(0, 10_000))
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))


def every_nasty_thing_once(test):  # type: ignore[no-untyped-def]
    """Each nasty value, bucket bound and label value on a real page, whatever the random budget finds."""
    for kind, count in ((0, len(NASTY_VALUES)), (1, len(NASTY_LABELS)), (2, len(NASTY_LABELS))):
        for what in range(count):
            for where in (0, 60, 200):
                test = example(sequence=[(0, []), (where % len(PAGES), [(kind, where, what)]), (0, [])])(test)
    return test


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize="FUZZ_EXAMPLES" not in os.environ)
@given(st.lists(st.tuples(st.integers(0, len(PAGES) - 1), st.lists(mutation, max_size=6)), min_size=2, max_size=8))
@every_nasty_thing_once
def test_no_page_can_break_a_tick_or_an_output(sequence):
    daemon = Daemon(load(env={}, flags={"sources": "vllm", "window_seconds": "10"}), clock=lambda: now)
    now = 1000.0
    memo: SeriesMemo = {}  # the source's: series of the previous page are not parsed again
    for step, (which, choices) in enumerate(sequence):
        now = 1000.0 + 2 * step
        text = mutate(PAGES[which], SAMPLE_LINES[which], choices)
        try:
            samples, facts = parse_page(text)
            reading = Reading(VLLM_SOURCE, now, True, samples, meta=facts)
        except ScrapeError as error:
            reading = Reading(VLLM_SOURCE, now, False, error=str(error), error_reason=error.reason)
        try:
            assert parse_page(text, memo=memo) == (reading.samples, reading.meta), "the memo changed what a page reads as"
        except ScrapeError as error:
            assert (error.reason, str(error)) == (reading.error_reason, reading.error), "the memo changed how a page is refused"
        daemon.ingest(reading)
        daemon._tick_if_fed()
        assert daemon.evaluation_error is None, daemon.evaluation_error
        snapshot = daemon.snapshot
        assert snapshot is not None and snapshot.timestamp == now
        health = next(h for h in snapshot.sources if h.source == VLLM_SOURCE)
        assert health.up is reading.ok
        diagnosis = strict_json(diagnosis_json(snapshot))
        assert isinstance(diagnosis, dict) and diagnosis["evaluations"] == step + 1
        for openmetrics in (False, True):
            body = daemon.exposition.render(openmetrics).decode()
            if not openmetrics:
                assert list(text_string_to_metric_families(body))
        assert format_report(snapshot, "fuzz")
