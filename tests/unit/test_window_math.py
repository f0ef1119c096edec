"""Window math: rates across counter resets, quantiles from histogram deltas, gauge statistics."""

from __future__ import annotations

import itertools
import random

import pytest
from vllm_triage.model import VLLM_SOURCE, Reading, SeriesKey, make_labels
from vllm_triage.scope import AGGREGATE_SCOPE, Scope, engine_scope
from vllm_triage.signals.vllm import VLLM_SIGNALS
from vllm_triage.signals.window import ServerFacts, WindowView, compute_signals, counter_step, histogram_quantile
from vllm_triage.store import Frame, Store

from .pages import Counters, page, reading


def generated_tokens(totals: list[tuple[float, float]]) -> Store:
    """A store of vLLM pages whose generation-token counter reads `totals` at their times."""
    store = Store(horizon_seconds=300)
    c = Counters()
    for t, total in totals:
        c.generation_tokens = total
        store.add(reading(t, page(1, 0, 0.1, c)))
    return store


def test_counter_increase_sums_steps_and_a_reset_starts_a_new_baseline():
    # vLLM restarted between t=2 and t=3: 30 -> 4. The reset step contributes nothing, never a negative.
    store = generated_tokens([(0, 10), (1, 20), (2, 30), (3, 4), (4, 9)])
    assert WindowView(store.window("vllm", 0, 2)).increase("vllm:generation_tokens_total", engine_scope("m", "0")) == 20
    assert WindowView(store.window("vllm", 0, 4)).increase("vllm:generation_tokens_total", engine_scope("m", "0")) == 25
    # the steps kept in the frames give the same answer at the next tick, over a moved window
    assert WindowView(store.window("vllm", 1, 4)).increase("vllm:generation_tokens_total", engine_scope("m", "0")) == 15
    assert WindowView(store.window("vllm", 0, 0)).increase("vllm:generation_tokens_total", engine_scope("m", "0")) is None
    assert WindowView(store.window("vllm", 0, 4)).increase("vllm:no_such_counter_total", engine_scope("m", "0")) is None


def test_rate_over_a_window_with_a_restart():
    store = generated_tokens([(0, 100), (10, 120), (20, 140), (30, 5), (40, 25)])
    view = WindowView(store.window("vllm", 0, 40))
    # 20 + 20 + (reset) + 20 tokens over 40 s
    assert view.rate("vllm:generation_tokens_total", engine_scope("m", "0")) == pytest.approx(60 / 40)


def test_histogram_quantile_matches_a_known_distribution():
    # 10 000 observations uniform on [0, 10); fine buckets make interpolation nearly exact.
    rng = random.Random(1)
    values = [rng.uniform(0, 10) for _ in range(10_000)]
    bounds = [i * 0.5 for i in range(1, 21)] + [float("inf")]
    buckets = [(b, float(sum(1 for v in values if v <= b))) for b in bounds]
    assert histogram_quantile(0.5, buckets) == pytest.approx(5.0, abs=0.1)
    assert histogram_quantile(0.95, buckets) == pytest.approx(9.5, abs=0.1)
    assert histogram_quantile(0.99, buckets) == pytest.approx(9.9, abs=0.1)


def test_histogram_quantile_edge_cases():
    assert histogram_quantile(0.5, []) is None
    assert histogram_quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None
    # everything above the last finite bound: the best answer is that bound
    assert histogram_quantile(0.5, [(1.0, 0.0), (float("inf"), 10.0)]) == 1.0


def test_quantiles_come_from_deltas_not_from_the_whole_history():
    """Old slow requests (before the window) must not leak into the window's p95."""
    store = Store(horizon_seconds=1000)
    c = Counters(ttft=[8.0] * 100)  # a bad hour long ago
    store.add(reading(0, page(1, 0, 0.1, c)))
    store.add(reading(100, page(1, 0, 0.1, c)))
    c.ttft += [0.03] * 50  # the window: all fast
    store.add(reading(160, page(1, 0, 0.1, c)))
    signals = compute_signals(WindowView(store.window("vllm", 100, 160)), engine_scope("m", "0"), ServerFacts(256), VLLM_SIGNALS)
    assert signals["ttft_seconds_observations"] == 50
    assert signals["ttft_seconds_p95"] is not None and signals["ttft_seconds_p95"] <= 0.05
    # The cumulative histogram (what a naive reading of /metrics gives) says the opposite.
    last = store.window("vllm", 160, 160)[0].by_name["vllm:time_to_first_token_seconds_bucket"]
    cumulative = [(float(dict(s.labels)["le"]), s.value) for s in last]
    assert (histogram_quantile(0.95, cumulative) or 0) > 5


def test_gauge_min_mean_max_and_aggregate_over_engines():
    store = Store(horizon_seconds=300)
    c = Counters()
    for t, waiting in [(0, 2), (10, 4), (20, 6)]:
        text = page(3, waiting, 0.5, c, engine="0") + page(1, 0, 0.9, c, engine="1").replace("# TYPE", "# IGNORED")
        store.add(reading(t, text))
    view = WindowView(store.window("vllm", 0, 20))
    assert view.scopes() == [engine_scope("m", "0"), engine_scope("m", "1")]
    engine0 = compute_signals(view, engine_scope("m", "0"), ServerFacts(256), VLLM_SIGNALS)
    assert (engine0["requests_waiting_min"], engine0["requests_waiting_mean"], engine0["requests_waiting_max"]) == (2, 4, 6)
    total = compute_signals(view, AGGREGATE_SCOPE, ServerFacts(256), VLLM_SIGNALS)
    assert total["requests_running_mean"] == 4  # running sums over engines
    assert total["kv_cache_usage_ratio_mean"] == 0.9  # KV usage: the fullest engine


def test_a_single_frame_gives_no_rates():
    store = Store(horizon_seconds=300)
    store.add(reading(0, page(1, 0, 0.1, Counters())))
    signals = compute_signals(WindowView(store.window("vllm", 0, 0)), engine_scope("m", "0"), ServerFacts(256), VLLM_SIGNALS)
    assert signals["requests_running_mean"] == 1
    assert signals["preemptions_per_second"] is None


def test_store_drops_frames_past_the_horizon():
    store = Store(horizon_seconds=30)
    for t in range(0, 100, 10):
        store.add(reading(t, page(1, 0, 0.1, Counters())))
    assert [f.timestamp for f in store.window("vllm", 0, 100)] == [60, 70, 80, 90]


def mfu_store(flops_per_second: float, bytes_per_second: float) -> Store:
    """Pages with vLLM's --enable-mfu-metrics counters rising at the given rates for 20 s."""
    store = Store(horizon_seconds=300)
    for t in range(0, 21, 2):
        text = page(4, 0, 0.5, Counters()) + (
            f'vllm:estimated_flops_per_gpu_total{{engine="0",model_name="m"}} {flops_per_second * t}\n'
            f'vllm:estimated_read_bytes_per_gpu_total{{engine="0",model_name="m"}} {bytes_per_second * 0.75 * t}\n'
            f'vllm:estimated_write_bytes_per_gpu_total{{engine="0",model_name="m"}} {bytes_per_second * 0.25 * t}\n'
        )
        store.add(reading(float(t), text))
    return store


H200 = ServerFacts(256, 989e12, 4.8e12)


def test_model_flops_and_bandwidth_utilization_against_the_gpus_peaks():
    # decode-like: 2.4 TB/s at 60 FLOPs per byte, under the H200's ridge (989e12 / 4.8e12 = 206 FLOPs per byte)
    decode = compute_signals(WindowView(mfu_store(144e12, 2.4e12).window("vllm", 0, 20)), engine_scope("m", "0"), H200, VLLM_SIGNALS)
    assert decode["model_flops_utilization_ratio"] == pytest.approx(144 / 989)
    assert decode["model_bandwidth_utilization_ratio"] == pytest.approx(0.5)
    assert decode["roofline_memory_bound"] == 1.0
    assert decode["roofline_attainment_ratio"] == pytest.approx(0.5)  # half the memory roof at its intensity
    # prefill-like: 1000 FLOPs per byte, past the ridge: the compute roof; 495 of 989 TFLOP/s
    prefill = compute_signals(WindowView(mfu_store(494.5e12, 0.4945e12).window("vllm", 0, 20)), engine_scope("m", "0"), H200, VLLM_SIGNALS)
    assert prefill["roofline_memory_bound"] == 0.0 and prefill["roofline_attainment_ratio"] == pytest.approx(0.5)


def test_no_mfu_without_the_flag_or_a_known_gpu():
    off = compute_signals(WindowView(mfu_store(0.0, 0.0).window("vllm", 0, 20)), engine_scope("m", "0"), H200, VLLM_SIGNALS)
    assert off["model_flops_per_second"] is None and off["model_flops_utilization_ratio"] is None  # counters at 0: the flag is off
    unknown_gpu = compute_signals(WindowView(mfu_store(1e12, 1e11).window("vllm", 0, 20)), engine_scope("m", "0"), ServerFacts(256), VLLM_SIGNALS)
    assert unknown_gpu["model_flops_per_second"] == pytest.approx(1e12) and unknown_gpu["model_flops_utilization_ratio"] is None


def test_prompt_tokens_by_origin_are_shares_of_the_window():
    # vLLM 0.32's counter: 300 computed, 700 from the local prefix cache, none transferred, over the window
    store = Store(horizon_seconds=300)
    for t, (computed, cached) in enumerate([(1000.0, 2000.0), (1300.0, 2700.0)]):
        text = page(1, 0, 0.1, Counters()) + "".join(
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="{source}"}} {value}\n'
            for source, value in (("local_compute", computed), ("local_cache_hit", cached), ("external_kv_transfer", 0.0))
        )
        store.add(reading(float(t * 10), text))
    signals = compute_signals(WindowView(store.window("vllm", 0, 10)), engine_scope("m", "0"), ServerFacts(256), VLLM_SIGNALS)
    assert signals["prompt_tokens_local_compute_ratio"] == pytest.approx(0.3)
    assert signals["prompt_tokens_local_cache_hit_ratio"] == pytest.approx(0.7)
    assert signals["prompt_tokens_external_kv_transfer_ratio"] == 0.0


COUNTER, HISTOGRAM = "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds"
GAUGE = "vllm:num_requests_running"


def _plain_increase(frames: list[Frame], name: str, scope: str) -> float | None:
    """The definition: the sum of every step of the window, each step over the series both frames have."""
    if len(frames) < 2:
        return None
    total, seen = 0.0, bool(frames[0].series(name, scope))
    for previous, frame in itertools.pairwise(frames):
        before = {s.labels: s.value for s in previous.series(name, scope)}
        for s in frame.series(name, scope):
            seen = True
            if s.labels in before:
                total += counter_step(before[s.labels], s.value)
    return total if seen else None


def _plain_buckets(frames: list[Frame], name: str, scope: Scope) -> list[tuple[float, float]]:
    by_bound: dict[float, float] = {}
    for previous, frame in itertools.pairwise(frames):
        before = {s.labels: s.value for s in previous.series(name + "_bucket", scope)}
        for s in frame.series(name + "_bucket", scope):
            if s.le is not None:
                by_bound[s.le] = by_bound.get(s.le, 0.0) + (counter_step(before[s.labels], s.value) if s.labels in before else 0.0)
    return sorted(by_bound.items())


def test_window_sums_kept_in_frames_match_the_plain_sums_whatever_windows_ask_and_in_what_order():
    """Windows of different lengths (a condition's own window beside the global one), asked in any order,
    over counters that reset, series that come and go and a histogram whose buckets change with a restart,
    read what summing the window's steps reads."""
    rng = random.Random(7)
    store = Store(horizon_seconds=10_000)
    tokens, buckets = 0.0, [0.0, 0.0, 0.0]
    for t in range(200):
        if rng.random() < 0.05:
            tokens, buckets = 0.0, [0.0, 0.0, 0.0]  # vLLM restarted
        tokens += rng.choice([0, 0, 5, 17.5])
        buckets = [b + rng.choice([0, 0, 1]) for b in buckets]
        buckets = [max(buckets[: i + 1]) for i in range(3)]  # cumulative
        bounds = ("0.1", "1.0", "+Inf") if t < 120 else ("0.5", "2.0", "+Inf")  # a new layout after a restart
        samples: dict[SeriesKey, float] = {(COUNTER, make_labels({"engine": "0", "model_name": "m"})): tokens}
        if t % 3:  # a second engine's series comes and goes
            samples[(COUNTER, make_labels({"engine": "1", "model_name": "m"}))] = float(t)
        for le, count in zip(bounds, buckets, strict=True):
            samples[(HISTOGRAM + "_bucket", make_labels({"engine": "0", "model_name": "m", "le": le}))] = count
        store.add(Reading(VLLM_SOURCE, float(t), True, samples))
    asked = [(end - length, end) for end in range(1, 200) for length in (10, 30, 60)]
    rng.shuffle(asked)
    for start, end in asked:
        frames = store.window(VLLM_SOURCE, start, end)
        view = WindowView(frames)
        for scope in (engine_scope("m", "0"), engine_scope("m", "1"), AGGREGATE_SCOPE):
            assert view.increase(COUNTER, scope) == pytest.approx(_plain_increase(frames, COUNTER, scope), rel=1e-12), (start, end, scope)
        histogram = view.histogram(HISTOGRAM, engine_scope("m", "0"))
        plain = _plain_buckets(frames, HISTOGRAM, engine_scope("m", "0"))
        assert (histogram.buckets if histogram else []) == plain, (start, end)  # counts: whole numbers, exact


def test_a_counter_that_stood_still_increases_by_exactly_zero():
    """engine_wedged reads "no token in 20 s" as an increase of 0: running totals of fractional steps must
    not leave a rounding remainder over a window where nothing moved."""
    store = generated_tokens([(t, 0.1 * t) for t in range(21)] + [(t, 2.0) for t in range(21, 40)])
    assert WindowView(store.window(VLLM_SOURCE, 0, 39)).increase(COUNTER, engine_scope("m", "0")) == pytest.approx(2.0)  # totals from frame 0
    assert WindowView(store.window(VLLM_SOURCE, 22, 39)).increase(COUNTER, engine_scope("m", "0")) == 0.0


def test_gauge_points_kept_in_the_newest_frame_match_each_frames_own_whatever_windows_ask_and_in_what_order():
    """A window's gauge points are its frames' own, tick after tick (the 60 s window, its last 10 s, a longer
    lookback) and in any order (a diagnosis at a past moment), for a source read more often than the tick and a
    series that comes and goes."""
    rng = random.Random(11)
    store = Store(horizon_seconds=10_000)
    for t in range(300):
        samples: dict[SeriesKey, float] = {(GAUGE, make_labels({"engine": "0", "model_name": "m"})): float(rng.randint(0, 9))}
        if (t // 7) % 3:  # a second engine comes and goes
            samples[(GAUGE, make_labels({"engine": "1", "model_name": "m"}))] = float(t)
        store.add(Reading(VLLM_SOURCE, t * 0.5, True, samples))  # read every 0.5 s

    def plain(frames: list[Frame], scope: Scope) -> list[float]:
        return [sum(values) for f in frames if (values := [s.value for s in f.series(GAUGE, scope)])]

    ticks = [(end - length, float(end)) for end in range(2, 150, 2) for length in (60, 10, 120)]
    shuffled = [(end - length, float(end)) for end in range(1, 150) for length in (5, 30, 90)]
    rng.shuffle(shuffled)
    for start, end in ticks + shuffled:
        frames = store.window(VLLM_SOURCE, start, end)
        view = WindowView(frames)
        for scope in (engine_scope("m", "0"), engine_scope("m", "1"), AGGREGATE_SCOPE):
            assert view.gauge_points(GAUGE, scope) == plain(frames, scope), (start, end, scope)
