"""The incidents the paging test replays are real captures stretched in place: what a stretch does to them."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from harness.components import REPO
from tests.support import timeline

KV_THRASH = REPO / "tests" / "data" / "real-vllm-h200-kv_thrash.jsonl.gz"


def series(readings, name):
    return [(r.timestamp, v) for r in readings for (n, _), v in r.samples.items() if n == name]


def test_a_stretched_stretch_repeats_with_its_counters_rising_at_their_rate_and_what_follows_moved_on():
    readings = timeline.load(KV_THRASH)
    at = timeline.marks(KV_THRASH)
    start, end = at["thrash"] + 60, at["recovery"]
    longer = timeline.stretched(readings, start, end, 1740)
    repeats = 9  # ceil(1740 / the 213 s stretch)
    added = (repeats - 1) * (end - start)
    assert longer[-1].timestamp - readings[-1].timestamp == added
    assert [r.source for r in longer if r.timestamp >= start + added + (end - start)] == [r.source for r in readings if r.timestamp >= end]
    # Every counter goes on rising (none steps back at a seam), at the stretch's own rate.
    by_series = defaultdict(list)
    for reading in longer:
        for key, value in reading.samples.items():
            if key[0].endswith(timeline.COUNTER_SUFFIXES):
                by_series[(reading.source, key)].append(value)
    assert by_series and all(values == sorted(values) for values in by_series.values())
    preemptions = series(longer, "vllm:num_preemptions_total")
    original = series(readings, "vllm:num_preemptions_total")

    def rate(points, a, b):
        inside = [(t, v) for t, v in points if a <= t <= b]
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])

    assert rate(original, start, end) > 1  # a KV thrash: preempting all the time
    assert abs(rate(preemptions, start, start + added + (end - start)) / rate(original, start, end) - 1) < 0.02
    # What was after the stretch is as it was, its counters raised by what the repeats added.
    after, moved = [p for p in original if p[0] >= end], [p for p in preemptions if p[0] >= end + added]
    assert len(after) == len(moved) and len({round(v2 - v1, 6) for (_, v1), (_, v2) in zip(after, moved, strict=True)}) == 1
    assert moved[0][1] - after[0][1] > 0


def test_a_vllm_reading_is_served_back_as_the_page_it_was_parsed_from():
    reading = next(r for r in timeline.load(KV_THRASH) if r.source == "vllm" and r.ok)
    parsed = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(timeline.exposition(reading).decode()) for s in f.samples
    }
    assert parsed == {(name, labels): value for (name, labels), value in reading.samples.items()}
