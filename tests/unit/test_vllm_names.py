"""Name normalisation on the real 0.32.0 captures and on hand-written pages of older versions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from vllm_triage import derive, store
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_readings
from vllm_triage.model import HISTOGRAM_SUFFIXES
from vllm_triage.pipeline import replay
from vllm_triage.signals.vllm import OFFLOAD_BYTES, OFFLOAD_BYTES_BY_TYPE, SPEC_ACCEPTED, SPEC_DRAFT_TOKENS, SPEC_DRAFTS, VLLM_SAMPLES_READ, VLLM_SIGNALS
from vllm_triage.signals.window import WindowView
from vllm_triage.sources.vllm import ScrapeError, parse_page

from .pages import TTFT_BOUNDS, Counters, page

# Real captures of vLLM 0.32.0 (copied from shared/fixtures so the repo tests on its own).
FIXTURES = Path(__file__).resolve().parents[1] / "data"


def names(samples):
    return {name for name, _ in samples}


# vLLM 0.32.0 on the CPU here, 0.26.0 on the H200 (harness/gpu/real_vllm.py): both versions' names.
REAL_PAGES = [
    "vllm-0.32.0-cpu-idle.metrics.txt",
    "vllm-0.32.0-cpu-kv-saturated.metrics.txt",
    "vllm-0.26.0-h200-kv-saturated.metrics.txt",
    "vllm-0.26.0-h200-decode.metrics.txt",
]


@pytest.mark.parametrize("capture", REAL_PAGES)
def test_real_capture_parses_to_vllm_series_without_created(capture):
    samples, facts = parse_page((FIXTURES / capture).read_text())
    assert "vllm:kv_cache_usage_perc" in names(samples)
    assert "vllm:time_to_first_token_seconds_bucket" in names(samples)
    assert not any(n.endswith("_created") for n in names(samples))
    assert all(n.startswith("vllm:") for n in names(samples))  # http_*, python_*, process_* dropped
    assert facts["series"] == len(samples)
    labels = dict(next(lbl for n, lbl in samples if n == "vllm:num_requests_running"))
    assert labels == {"engine": "0", "model_name": "tiny"}


def test_saturated_capture_reads_as_saturated():
    samples, _ = parse_page((FIXTURES / "vllm-0.32.0-cpu-kv-saturated.metrics.txt").read_text())
    values = {n: v for (n, _), v in samples.items()}
    assert values["vllm:kv_cache_usage_perc"] == 1.0
    assert values["vllm:num_requests_waiting"] > 0


def test_every_family_the_signals_read_is_on_both_versions_real_pages():
    """The version alias table against real pages of 0.26.0 (H200) and 0.32.0 (CPU): every vLLM family a
    signal reads is there under today's name, whatever the version."""
    # v0's only; only with speculative decoding on; only with KV offloading on (below)
    offload = {*OFFLOAD_BYTES.values(), OFFLOAD_BYTES_BY_TYPE}
    read = VLLM_SAMPLES_READ - {"vllm:num_requests_swapped", SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED, *offload}
    for capture in ("vllm-0.32.0-cpu-kv-saturated.metrics.txt", "vllm-0.26.0-h200-kv-saturated.metrics.txt", "vllm-0.26.0-h200-kv-offload.metrics.txt"):
        samples, facts = parse_page((FIXTURES / capture).read_text())
        assert read <= names(samples), (capture, sorted(read - names(samples)))
        assert "old_names" not in facts, capture
    # vLLM 0.26 with --kv-offloading-size, after prompts came back from CPU memory: stores and loads, both spellings
    samples, _ = parse_page((FIXTURES / "vllm-0.26.0-h200-kv-offload.metrics.txt").read_text())
    assert offload <= names(samples)


def test_v0_names_are_renamed_to_todays():
    text = page(2, 1, 0.7, Counters(), v0=True)
    text += "\n".join(
        [
            "# TYPE vllm:gpu_prefix_cache_queries counter",
            'vllm:gpu_prefix_cache_queries_total{model_name="m"} 40',
            "# TYPE vllm:gpu_prefix_cache_hits counter",
            'vllm:gpu_prefix_cache_hits_total{model_name="m"} 10',
            "# TYPE vllm:time_per_output_token_seconds histogram",
            'vllm:time_per_output_token_seconds_bucket{model_name="m",le="0.1"} 3',
            'vllm:time_per_output_token_seconds_bucket{model_name="m",le="+Inf"} 4',
            'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.5',
            'vllm:time_per_output_token_seconds_count{model_name="m"} 4',
            "# TYPE vllm:num_requests_swapped gauge",
            'vllm:num_requests_swapped{model_name="m"} 0',
        ]
    )
    samples, facts = parse_page(text + "\n")
    got = names(samples)
    assert {"vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"} <= got
    assert {"vllm:inter_token_latency_seconds_bucket", "vllm:inter_token_latency_seconds_count"} <= got
    assert "vllm:gpu_cache_usage_perc" not in got
    assert facts["engine_generation"] == "v0"
    assert "vllm:gpu_cache_usage_perc" in facts["old_names"]


def test_when_old_and_new_names_coexist_the_new_one_wins():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.2\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.7\n'
    )
    samples, _ = parse_page(text)
    assert [v for (n, _), v in samples.items() if n == "vllm:kv_cache_usage_perc"] == [0.7]


def test_garbage_is_a_parse_error():
    with pytest.raises(ScrapeError) as info:
        parse_page("vllm:num_requests_running{engine=0 oops\n")
    assert info.value.reason == "parse"


def test_a_page_without_vllm_series_is_named_as_such():
    with pytest.raises(ScrapeError) as info:
        parse_page("# TYPE up gauge\nup 1\n")
    assert info.value.reason == "no_vllm_metrics"
    assert "vllm:num_requests" in str(info.value)


def test_nan_values_are_dropped_and_counted():
    text = page(1, 0, 0.5, Counters()).replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5', 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN'
    )
    samples, facts = parse_page(text)
    assert "vllm:kv_cache_usage_perc" not in names(samples)
    assert facts["dropped"] == {"nan_values": 1}


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "1.7e308", "-1e31"])
def test_infinite_and_out_of_range_values_are_refused_at_the_edge(value):
    text = (
        page(3, 2, 0.5, Counters(preemptions=4))
        .replace('vllm:num_requests_running{engine="0",model_name="m"} 3', f'vllm:num_requests_running{{engine="0",model_name="m"}} {value}')
        .replace('vllm:num_preemptions_total{engine="0",model_name="m"} 4', f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {value}')
    )
    samples, facts = parse_page(text)
    assert "vllm:num_requests_running" not in names(samples) and "vllm:num_preemptions_total" not in names(samples)
    assert "vllm:num_requests_waiting" in names(samples)
    assert facts["dropped"] == {"non_finite_values": 2}


@pytest.mark.parametrize("le", ["abc", "", "0x10", "NaN"])
def test_a_histogram_with_a_non_numeric_bucket_is_refused_whole(le):
    c = Counters(ttft=[0.02, 0.3])
    text = page(1, 0, 0.5, c).replace('le="0.5"', f'le="{le}"')
    samples, facts = parse_page(text)
    assert not any(name.startswith("vllm:time_to_first_token_seconds") for name in names(samples))
    assert "vllm:num_requests_running" in names(samples)
    assert facts["dropped"]["bad_bucket"] == len(TTFT_BOUNDS) + 3  # every bucket, _sum and _count


def test_label_values_over_the_limit_are_refused():
    text = page(1, 0, 0.5, Counters(), model="m" * 2000)
    samples, facts = parse_page(text + 'vllm:num_requests_running{engine="1",model_name="short"} 2\n')
    assert {dict(labels).get("model_name") for _, labels in samples} <= {"short", None}
    assert facts["dropped"]["label_too_long"] >= 10
    samples, facts = parse_page(text, max_label_value_length=4096)
    assert "dropped" not in facts


def test_each_vllm_signal_reads_only_the_samples_it_declares(monkeypatch):
    """The source parses only VLLM_SAMPLES_READ, which the signals' declarations make: replaying real H200 captures
    (recorded with every sample: serving, a hung kernel, the MFU estimates, KV offloading) through every signal and
    condition, each vLLM signal reads no sample it did not declare, and nothing else of the pipeline reads a vLLM
    sample outside the set."""
    current: list[str] = []  # the signal being computed
    by_signal: dict[str, set[str]] = {}
    read: set[str] = set()

    def note(*samples: str) -> None:
        read.update(samples)
        if current:
            by_signal.setdefault(current[-1], set()).update(samples)

    def recording(method, samples_of=lambda name: (name,)):
        def wrapped(self, name, scope, *args, **kwargs):
            note(*samples_of(name))
            return method(self, name, scope, *args, **kwargs)

        return wrapped

    # at the views' entry points too: a second signal asking for what a first one read is answered from a cache
    for method in ("gauge_points", "increase", "step_increases", "latest_labels"):
        monkeypatch.setattr(WindowView, method, recording(getattr(WindowView, method)))
    monkeypatch.setattr(WindowView, "histogram", recording(WindowView.histogram, lambda name: [name + suffix for suffix in HISTOGRAM_SUFFIXES]))
    monkeypatch.setattr(store.Frame, "series", recording(store.Frame.series))

    def computing(signal):
        def compute(ctx):
            current.append(signal.id)
            try:
                return signal.compute(ctx)
            finally:
                current.pop()

        return dataclasses.replace(signal, compute=compute)

    compute_signals = derive.compute_signals
    monkeypatch.setattr(derive, "compute_signals", lambda view, scope, facts, table: compute_signals(view, scope, facts, tuple(map(computing, table))))
    for capture in (
        demo_capture_path(),
        *(FIXTURES / f"real-vllm-h200-{name}.jsonl.gz" for name in ("gpu_heavy", "hung_kernel", "efficiency_wedge", "kv_offload")),
    ):
        replay(list(read_readings(capture)), load(env={}), lambda snapshot: None)
    declared = {signal.id: set(signal.samples) for signal in VLLM_SIGNALS}
    undeclared = {signal: sorted(samples - declared[signal]) for signal, samples in by_signal.items() if signal in declared and samples - declared[signal]}
    assert not undeclared, undeclared
    vllm_read = {name for name in read if name.startswith("vllm:")}
    assert len(vllm_read) > 30 and vllm_read <= VLLM_SAMPLES_READ, sorted(vllm_read - VLLM_SAMPLES_READ)
    # the captures exercise most declarations: a declaration nothing reads is one no replay can check
    assert len({signal for signal in by_signal if signal in declared}) > 0.8 * len([s for s in VLLM_SIGNALS if s.samples])


@pytest.mark.parametrize("capture", REAL_PAGES)
def test_parsing_only_what_is_read_keeps_those_samples_exactly(capture):
    text = (FIXTURES / capture).read_text()
    everything, _ = parse_page(text)
    kept, _ = parse_page(text, keep=VLLM_SAMPLES_READ)
    assert kept == {key: value for key, value in everything.items() if key[0] in VLLM_SAMPLES_READ}
    assert len(kept) < 0.8 * len(everything)  # the skipped part is real work saved
    with pytest.raises(ScrapeError, match="max_series"):  # the limit still counts every vllm: series
        parse_page(text, max_series=len(kept), keep=VLLM_SAMPLES_READ)


def test_lines_unchanged_since_the_last_page_are_reused_and_the_result_is_the_same():
    """The source keeps the last page's parsed lines: consecutive real pages (idle, then saturated) read
    exactly as parsed from scratch, and a garbled line on a later page is still refused."""
    memo: dict = {}
    for capture in ("vllm-0.32.0-cpu-idle.metrics.txt", "vllm-0.32.0-cpu-kv-saturated.metrics.txt", "vllm-0.32.0-cpu-kv-saturated.metrics.txt"):
        text = (FIXTURES / capture).read_text()
        assert parse_page(text, keep=VLLM_SAMPLES_READ, memo=memo) == parse_page(text, keep=VLLM_SAMPLES_READ)
    assert memo and all(line.startswith("vllm:") for line in memo)
    with pytest.raises(ScrapeError, match="not valid Prometheus text"):
        parse_page(text + 'vllm:num_requests_running{engine="0" oops\n', memo=memo)
