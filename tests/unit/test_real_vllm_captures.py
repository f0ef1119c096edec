"""Every verdict on a real vLLM 0.26.0 serving on the H200 (gpu_shared and eager_change: on an H100, the card lent
then), recorded with all four sources (harness/gpu/real_vllm.py, whose SCENARIOS hold the truth written before the
run) and replayed here.

- serving: a 1B random Llama, 48 KV blocks of 16, max 32 sequences: idle, 2 clients, 40 clients, recovery.
- cpu_bound: a tiny Llama, 128 clients of 8-word prompts and 16 tokens: the engine core's Python loop is the limit.
- gpu_heavy: the 1B Llama, 32 clients of 900-word prompts (prefill), then 128 clients of 400 tokens (decode).
- profiled: the serving setup again, with vLLM's torch profiler taking 1 s late in each loaded phase
  (the underload trace is tests/data/vllm-0.26.0-h200-profile-underload/).
- efficiency_wedge: the 1B Llama with --enable-mfu-metrics: prefill (32 clients of 900 words), decode (128
  clients of 400 tokens), then 8 clients with the engine core stopped by SIGSTOP for 35 s, and continued.
- contention, contention-2: wide layers (8 x 8192, dummy weights), 128 clients; the engine core pinned to one CPU
  shared with three busy loops for 100 s, then freed (two runs; the second with a 150 s recovery).
- kv_thrash: the 1B Llama with 128 sequences admitted on 48 blocks of 16, 128 clients of 300 tokens: KV thrash.
- hung_kernel: the wide model, 8 clients; a 40 s kernel enqueued in the engine core.
- orphan: the 1B model, 8 clients; then the API server SIGKILLed while its engine core lives on.
- rollout: recorded from the pod's start: the 1B model loading (vLLM launched 5 s in, answering 107 s later), then 16
  clients.
- killed: the 1B model, 16 clients, then every vLLM process SIGKILLed; nothing answers for 3 minutes.
- foreign: the wide model, 128 clients; another program runs bf16 matmuls on the same GPU for 90 s.
- gpu_shared: another program holds a context on vLLM's GPU for 30 s, then computes for 60 s (NVML's per-process SM samples).
- eager_change: the 1B model at vLLM's defaults (torch.compile, CUDA graphs) under 32 clients, then relaunched with
  --enforce-eager under the same load.
- compute_limit: the wide model at 12, 128, then 384 streamed clients of 900-word prompts: the GPU at its compute limit.
- api_server_bound: a tiny model, 384 streamed clients asking for logprobs: the API server saturated.
- seqs_cap: the wide model with --max-num-seqs 8 and 48 clients.
- token_budget: the wide model with --max-num-batched-tokens 256 and 64 clients of 900-word prompts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest
from vllm_triage import catalog
from vllm_triage.config import Config
from vllm_triage.config_loader import load
from vllm_triage.history.capture import demo_capture_path, read_description, read_readings
from vllm_triage.model import VLLM_SOURCE, Reading
from vllm_triage.pipeline import Pipeline, replay
from vllm_triage.scope import HOST_SCOPE, engine_scope, gpu_scope
from vllm_triage.signals.window import RECENT_SECONDS
from vllm_triage.traces import summarize_paths

from harness.gpu.truth import ALL, CPU_BOUND, GPU_HEAVY, SERVING, check, read_phases

DATA = Path(__file__).resolve().parents[1] / "data"
# A verdict within a minute of its regime's onset at the default settings, tighter than the truths written before the
# runs (90 s): what lets the on-call act before users notice.
ONSET_TO_VERDICT_SECONDS = 60


def recorded(name: str, suffix: str) -> Path:
    """tests/data/real-vllm-<card>-<name><suffix>: the card it was recorded on is in the name."""
    return next(path for card in ("h200", "h100") if (path := DATA / f"real-vllm-{card}-{name}{suffix}").exists())


def capture(name: str) -> tuple[Path, list[tuple[str, float, float]]]:
    """The capture and its phases: (name, start, end) from the marks the recorder kept."""
    # the serving capture is the bundled demo (`make run`): one copy, in the package
    path = demo_capture_path() if name == "serving" else recorded(name, ".jsonl.gz")
    phases = read_phases(recorded(name, ".json"))
    return path, profiler_stalls(phases) if name == "profiled" else phases


def profiler_stalls(phases: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """A 1 s profile froze the engine while the trace was written (12 s in underload, 19 s in saturation:
    vLLM's gauges stood still, no preemptions). A phase's steady part ends where its profile starts; the
    stall and the window after it are a phase of their own."""
    profiles = json.loads((DATA / "real-vllm-h200-profiled-profiles.json").read_text())
    split = []
    for name, start, end in phases:
        profile = next(((s, e) for n, s, e in profiles if n == name), None)
        split += [(name, start, end)] if profile is None else [(name, start, profile[0]), ("profiler_stall", profile[0], end)]
    return split


def short_settings(tmp_path: Path) -> Config:
    """20 s windows, 2 s for/clear_for: phases of 70-190 s get a long steady part."""
    path = tmp_path / "short.yaml"
    path.write_text("window_seconds: 20\ntick_seconds: 2\nconditions:\n" + "".join(f"  {c}: {{for_seconds: 2, clear_for_seconds: 2}}\n" for c in sorted(ALL)))
    return load(str(path), env={})


PROFILED = {  # idle and recovery are 10 and 20 s here: shorter than a window
    "underload": SERVING["underload"],
    "kv_saturation": SERVING["kv_saturation"],
    # a frozen engine is no evidence of anything new: no verdict the serving phases do not have
    "profiler_stall": (set(), {"kv_fragmentation_suspected", "prefix_cache_ineffective", "client_underload", "compute_bound", "memory_bandwidth_bound"}),
}


@pytest.mark.parametrize(("name", "expected"), [("serving", SERVING), ("cpu_bound", CPU_BOUND), ("gpu_heavy", GPU_HEAVY), ("profiled", PROFILED)])
def test_each_phase_of_the_real_engine_gets_its_verdicts(tmp_path, name, expected):
    path, phases = capture(name)
    assert read_description(path)["truth"], "the truth was written into the capture before the run"
    problems = check(path, phases, short_settings(tmp_path), expected)
    assert not problems, "\n".join(problems[:20])


def replayed(name: str, config: Config) -> list:
    path, _ = capture(name)
    snapshots: list = []
    replay(list(read_readings(path)), config, snapshots.append)
    return snapshots


def in_phase(snapshots: list, phases, name: str, settle: float = 0.0) -> list:
    start, end = next((s, e) for n, s, e in phases if n == name)
    return [s for s in snapshots if start + settle <= s.timestamp <= end]


def verdict(snapshot, condition: str):
    return next(v for v in snapshot.verdicts if v.condition == condition)


def test_saturation_primary_and_cause_and_one_story(tmp_path):
    _, phases = capture("serving")
    steady = in_phase(replayed("serving", short_settings(tmp_path)), phases, "kv_saturation", settle=24)
    assert {s.primary for s in steady} == {"kv_cache_saturated"}
    assert all(verdict(s, "queue_backlog").cause == "kv_capacity" for s in steady if verdict(s, "queue_backlog").active)
    assert all(verdict(s, "gpu_starved").role == "secondary" for s in steady if verdict(s, "gpu_starved").active)


def test_a_small_cache_is_full_within_one_block_not_only_at_exactly_one(tmp_path):
    """48 blocks (47 usable): usage moves in steps of 1/47, and 20 s windows peaked at 46/47 = 0.979 while
    35 requests waited and ~6.5 preemptions/s ran. Full is judged within one block."""
    _, phases = capture("serving")
    steady = in_phase(replayed("serving", short_settings(tmp_path)), phases, "kv_saturation", settle=24)
    peaks = [s.signals[engine_scope("tiny", "0")]["kv_cache_usage_ratio_max"] for s in steady]
    assert min(peaks) < 0.99, "the capture must hold windows that never sampled a full cache"
    assert all(verdict(s, "kv_cache_saturated").active for s in steady)
    below = next(s for s in steady if s.signals[engine_scope("tiny", "0")]["kv_cache_usage_ratio_max"] < 0.99)
    assert any("within one KV block" in e.text for e in verdict(below, "kv_cache_saturated").evidence)


def test_queue_time_quantiles_stay_within_what_the_mean_allows(tmp_path):
    """No queue at all (mean 15 us) must not read as p50 0.15 s / p95 0.285 s (interpolation over the
    whole first bucket, 0-0.3 s): a quantile of non-negative values is at most mean / (1 - q)."""
    _, phases = capture("serving")
    for snapshot in in_phase(replayed("serving", short_settings(tmp_path)), phases, "underload", settle=24):
        values = snapshot.signals[engine_scope("tiny", "0")]
        mean = values["queue_time_seconds_mean"]
        assert mean < 0.001
        assert values["queue_time_seconds_p50"] <= 2 * mean + 1e-12 and values["queue_time_seconds_p95"] <= 20 * mean + 1e-12


def test_live_token_ratio_never_reads_impossible(tmp_path):
    for name in ("serving", "gpu_heavy", "cpu_bound"):
        for snapshot in replayed(name, short_settings(tmp_path)):
            value = snapshot.signals.get(engine_scope("tiny", "0"), {}).get("kv_live_token_ratio")
            assert value is None or 0 <= value <= 1, (name, value)


def test_a_stale_underload_verdict_clears_when_the_incident_starts():
    """With gpu_starved off (a sidecar without GPU access) underload leads the 2-client phase; when 40
    clients arrive and requests wait, it clears at once, not after its 60 s clear_for."""
    config = load(env={})
    config = dataclasses.replace(config, conditions={**config.conditions, "gpu_starved": dataclasses.replace(config.conditions["gpu_starved"], enabled=False)})
    _, phases = capture("serving")
    snapshots = replayed("serving", config)
    assert verdict(in_phase(snapshots, phases, "underload")[-1], "client_underload").active
    saturation = in_phase(snapshots, phases, "kv_saturation")
    cleared = next(s for s in saturation if not verdict(s, "client_underload").active)
    assert cleared.timestamp - saturation[0].timestamp <= 15
    assert any("cleared at once" in e.text for e in verdict(cleared, "client_underload").evidence)


def test_default_settings_detect_within_window_plus_for_and_never_cry_wolf():
    """The demo's settings (60 s window, each condition's own for): every true verdict of a loaded phase
    is active within its window + for + two ticks; no false verdict at any time."""
    config = load(env={})
    _, phases = capture("serving")
    snapshots = replayed("serving", config)
    for phase, conditions in (("underload", ("gpu_starved",)), ("kv_saturation", ("kv_cache_saturated", "queue_backlog", "preemption_storm"))):
        during = in_phase(snapshots, phases, phase)
        for condition in conditions:
            limit = config.window_seconds + config.conditions[condition].for_seconds + 2 * config.tick_seconds
            first = next((s for s in during if verdict(s, condition).active), None)
            assert first is not None and first.timestamp - during[0].timestamp <= limit, (phase, condition)
    never = {"kv_fragmentation_suspected", "prefix_cache_ineffective", "client_underload", "request_errors", "gpu_throttled", "pcie_link_degraded"}
    assert not [(verdict(s, c).condition, s.timestamp) for s in snapshots for c in never if verdict(s, c).active]


def test_the_profilers_trace_and_the_sidecar_tell_the_same_story():
    """At the moment vLLM's profiler ran (default settings), the sidecar's primary verdict and what
    `vllm-triage trace` finds in the engine's trace agree: in underload the GPU waits on the engine core
    (gpu_starved; SMs and the trace's busy time both low), in saturation the cache is full and leads."""
    config = load(env={})
    snapshots = replayed("profiled", config)
    profiles = {name: start for name, start, _ in json.loads((DATA / "real-vllm-h200-profiled-profiles.json").read_text())}
    at = {name: min(snapshots, key=lambda s: abs(s.timestamp - start)) for name, start in profiles.items()}
    assert at["underload"].primary == "gpu_starved"
    assert at["kv_saturation"].primary == "kv_cache_saturated" and verdict(at["kv_saturation"], "gpu_starved").role == "secondary"
    summaries, _ = summarize_paths([str(DATA / "vllm-0.26.0-h200-profile-underload")])
    (gpu,) = summaries[0].gpus
    sm_active = at["underload"].signals[gpu_scope("0")]["gpu_sm_active_ratio_mean"]
    assert gpu.busy_ratio < 0.15 and sm_active < 0.15
    assert any("gpu_starved" in finding for finding in summaries[0].findings)


def wedge_marks() -> dict[str, float]:
    return {name: start for name, start in json.loads((DATA / "real-vllm-h200-efficiency_wedge.json").read_text())}


def test_a_stopped_engine_core_on_the_h200_is_engine_wedged_and_clears_when_continued():
    """Default settings. The truth written before the run: engine_wedged (process_stopped) within 30 s of the
    SIGSTOP, primary, with the GPU idle in its evidence; cleared within 5 s of SIGCONT; nothing else in the stop."""
    marks = wedge_marks()
    snapshots = replayed("efficiency_wedge", load(env={}))
    stopped = [s for s in snapshots if marks["engine_stopped"] <= s.timestamp <= marks["engine_continued"]]
    first = next(s for s in stopped if verdict(s, "engine_wedged").active)
    assert first.timestamp - marks["engine_stopped"] <= 35, first.timestamp - marks["engine_stopped"]
    wedged = verdict(first, "engine_wedged")
    assert wedged.cause == "process_stopped" and first.primary == "engine_wedged"
    assert any("nothing runs on it" in e.text for e in wedged.evidence), [e.text for e in wedged.evidence]
    # Nothing else comes from the stop: what held before it (gpu_starved: the 128-client decode before the phase was
    # CPU-bound, SM activity 0.1 under a saturated engine-core thread) is not judged true again once the host's last
    # 10 s (RECENT_SECONDS) are all of the stop.
    before = {v.condition for v in next(s for s in reversed(snapshots) if s.timestamp < marks["engine_stopped"]).verdicts if v.active}
    assert {v.condition for s in stopped for v in s.verdicts if v.active} - before == {"engine_wedged"}
    inside = [s for s in stopped if s.timestamp > marks["engine_stopped"] + RECENT_SECONDS]
    assert not [(s.timestamp, v.condition) for s in inside for v in s.verdicts if v.condition in before and v.raw]
    after = [s for s in snapshots if s.timestamp > marks["engine_continued"]]
    cleared = next(s for s in after if not verdict(s, "engine_wedged").active)
    assert cleared.timestamp - marks["engine_continued"] <= 5
    # and it never fires where the engine works, nor on the profiler's 12-19 s freezes or any other real capture
    outside = [s for s in snapshots if not marks["engine_stopped"] <= s.timestamp <= marks["engine_continued"] + 5]
    assert not [s.timestamp for s in outside if verdict(s, "engine_wedged").active]
    for name in ("serving", "cpu_bound", "gpu_heavy", "profiled"):
        assert not [s.timestamp for s in replayed(name, load(env={})) if verdict(s, "engine_wedged").active], name


def test_model_flops_and_bandwidth_utilization_on_the_h200_against_its_roofline(tmp_path):
    """vLLM's own estimates (--enable-mfu-metrics) over the H200's peaks (989 TFLOP/s bf16, 4.8 TB/s), beside
    GPM's measured activity: prefill sits under the compute roof, decode under the memory roof."""
    marks = wedge_marks()
    snapshots = replayed("efficiency_wedge", short_settings(tmp_path))

    def steady(phase: str, following: str) -> list[dict]:
        return [s.signals[engine_scope("tiny", "0")] | s.signals[gpu_scope("0")] for s in snapshots if marks[phase] + 24 <= s.timestamp <= marks[following]]

    prefill, decode = steady("prefill_heavy", "decode_heavy"), steady("decode_heavy", "wedged")
    assert all(s["roofline_memory_bound"] == 0.0 for s in prefill) and all(s["roofline_memory_bound"] == 1.0 for s in decode)
    # model FLOPs are what the tensor cores did at most (GPM tensor activity), and prefill's far above decode's
    assert all(0.2 <= s["model_flops_utilization_ratio"] <= s["gpu_tensor_active_ratio_mean"] + 0.05 for s in prefill), prefill
    assert max(s["model_flops_utilization_ratio"] for s in decode) < min(s["model_flops_utilization_ratio"] for s in prefill) / 5
    # decode's bytes by vLLM's estimate agree with the DRAM bandwidth GPM measured, within 0.05 of the peak
    assert all(abs(s["model_bandwidth_utilization_ratio"] - s["gpu_dram_bandwidth_utilization_ratio_mean"]) < 0.05 for s in decode), decode
    assert snapshots[-1].discovery.gpu_peak["model"] == "H200"


def test_saturation_advice_carries_its_numbers(tmp_path):
    """The demo's saturation (48 blocks of 16, max_num_seqs 32, 40-word prompts and 160 tokens out): the advice
    is a --max-num-seqs whose requests fit the blocks, replicas for the demand, and no GPU-memory advice where
    NVML's view misses vLLM's own allocation (2 % used under a vLLM reserving 50 % on this H200)."""
    _, phases = capture("serving")
    steady = in_phase(replayed("serving", short_settings(tmp_path)), phases, "kv_saturation", settle=24)
    for snapshot in steady:
        values, kv = snapshot.signals[engine_scope("tiny", "0")], verdict(snapshot, "kv_cache_saturated")
        fit = values["kv_requests_that_fit"]
        blocks_each = -(-(values["prompt_tokens_mean"] + values["generation_tokens_mean"]) // values["block_size_tokens"])
        assert 1 <= fit < 32 and fit * blocks_each <= 47 < (fit + 1) * blocks_each, values
        assert any(a.startswith(f"--max-num-seqs {fit:.0f}:") and "768 KV tokens" in a for a in kv.advice), kv.advice
        assert any("replicas of this size" in a for a in kv.advice)
        assert not any("--gpu-memory-utilization" in a for a in kv.advice)
        assert any("no --gpu-memory-utilization advice" in e.text for e in kv.evidence)


def marks_of(name: str) -> dict[str, float]:
    return {mark: at for mark, at in json.loads(recorded(name, ".json").read_text())}


def first_active(snapshots: list, condition: str, start: float, end: float):
    return next((s for s in snapshots if start <= s.timestamp <= end and verdict(s, condition).active), None)


@pytest.mark.parametrize("name", ["contention", "contention-2"])
def test_an_engine_core_sharing_its_cpu_with_busy_processes_starves_the_gpu_with_cause_cpu_contention(name):
    """Default settings, two runs of the same regime. Wide layers (dummy weights) that keep the H200 busy at full CPU
    (SM activity ~0.6), then the engine core's threads pinned to one CPU shared with three busy loops for 100 s: it got
    ~0.25 of a core, waited ~0.7 s per second for it, tokens/s fell ~4x and SM activity to ~0.15. Its busiest thread
    never read saturated (0.24-0.56 of a core): the thread waiting for a CPU is what tells it. The second run's
    recovery (150 s) is longer than the verdict's window plus clear_for: it clears, and stays cleared."""
    marks = marks_of(name)
    snapshots = replayed(name, load(env={}))
    assert first_active(snapshots, "gpu_starved", 0, marks["contention_started"]) is None  # the GPU kept up before
    first = first_active(snapshots, "gpu_starved", marks["contention_started"], marks["contention_ended"])
    assert first is not None, "gpu_starved never came in the contended phase"
    assert first.timestamp - marks["contention_started"] <= ONSET_TO_VERDICT_SECONDS, first.timestamp - marks["contention_started"]
    starved = verdict(first, "gpu_starved")
    assert starved.cause == "cpu_contention" and first.primary == "gpu_starved", (starved.cause, first.primary)
    texts = [e.text for e in starved.evidence]
    assert any("cause cpu_contention" in t for t in texts) and any("s per second for a CPU" in t and "it may run on 1 CPU" in t for t in texts), texts
    host = first.signals[HOST_SCOPE]
    assert host["host_engine_core_busiest_thread_cpu_ratio_recent"] < 0.85 <= host["host_engine_core_thread_cpu_demand_ratio_recent"]
    print(f"{name}: gpu_starved {first.timestamp - marks['contention_started']:.0f} s after the contention started")
    if name == "contention-2":
        settings = load(env={}).conditions["gpu_starved"]
        bound = marks["contention_ended"] + settings.window_seconds + settings.clear_seconds + 4
        assert not [s.timestamp - marks["contention_ended"] for s in snapshots if s.timestamp > bound and verdict(s, "gpu_starved").active]
        cleared = next(s for s in snapshots if s.timestamp > marks["contention_ended"] and not verdict(s, "gpu_starved").active)
        print(f"{name}: cleared {cleared.timestamp - marks['contention_ended']:.0f} s after the contention ended")


def test_kv_thrash_on_the_h200_is_kv_saturation_and_a_backlog_within_90_s_held_to_the_end():
    """Default settings. The 1B model with 128 sequences admitted on 48 blocks of 16 (two requests of 340 tokens fit
    whole), 128 clients: ~5 preemptions a second, ~96 requests waiting, 1.3 finished a second. The truth written before
    the run: nothing in steady; kv_cache_saturated (primary) and queue_backlog within 90 s of the load's onset, held
    to the phase's end; everything clears in recovery. Measured otherwise in steady: its 3 clients kept the eager engine
    core's thread at 0.99 of a core beside SM activity 0.05, the serving capture's underload regime, so gpu_starved
    (launch_overhead) is the one verdict there, once its SM activity is judged on the last 10 s."""
    marks = marks_of("kv_thrash")
    snapshots = replayed("kv_thrash", load(env={}))
    steady = [s for s in snapshots if s.timestamp < marks["thrash"]]
    assert not [(s.timestamp, v.condition) for s in steady for v in s.verdicts if v.active and v.condition != "gpu_starved"]
    assert {verdict(s, "gpu_starved").cause for s in steady if verdict(s, "gpu_starved").active} <= {"launch_overhead"}
    onset = marks["thrash"]
    for condition in ("kv_cache_saturated", "queue_backlog", "preemption_storm"):
        first = first_active(snapshots, condition, onset, marks["recovery"])
        assert first is not None and first.timestamp - onset <= ONSET_TO_VERDICT_SECONDS, (condition, first and first.timestamp - onset)
        held = [s for s in snapshots if first.timestamp <= s.timestamp <= marks["recovery"]]
        assert all(verdict(s, condition).active for s in held), condition
        print(f"{condition} {first.timestamp - onset:.0f} s after the load's onset")
    saturated = [s for s in snapshots if onset <= s.timestamp <= marks["recovery"] and verdict(s, "kv_cache_saturated").active]
    assert {s.primary for s in saturated} == {"kv_cache_saturated"}
    assert {verdict(s, "queue_backlog").cause for s in saturated if verdict(s, "queue_backlog").active} == {"kv_capacity"}
    for condition in ("kv_cache_saturated", "queue_backlog"):
        settings = load(env={}).conditions[condition]
        cleared = next(s for s in snapshots if s.timestamp > marks["recovery"] and not verdict(s, condition).active)
        assert cleared.timestamp - marks["recovery"] <= settings.window_seconds + settings.clear_seconds + 4, condition


def test_a_kernel_that_does_not_finish_is_engine_wedged_with_cause_hung_kernel_though_vllms_gauges_read_zero():
    """Default settings. A 40 s kernel enqueued in the engine core (wide layers): the 8 requests in flight had just
    finished, the next 8 waited behind the kernel, and vLLM's running and waiting gauges read 0 throughout; util.gpu
    1.0, SM activity 0.01, the engine core 0.015 cores."""
    marks = marks_of("hung_kernel")
    snapshots = replayed("hung_kernel", load(env={}))
    first = first_active(snapshots, "engine_wedged", marks["kernel_hung"], marks["recovery"])
    assert first is not None and first.timestamp - marks["kernel_hung"] <= 40, first and first.timestamp - marks["kernel_hung"]
    wedged = verdict(first, "engine_wedged")
    assert wedged.cause == "hung_kernel" and first.primary == "engine_wedged"
    assert any("a kernel is resident and does not finish" in e.text for e in wedged.evidence), [e.text for e in wedged.evidence]
    assert first.signals[engine_scope("tiny", "0")]["requests_stalled"] == 0  # vLLM's gauges saw nothing pending since the freeze
    tokens_again = next(
        s.timestamp
        for s in snapshots
        if s.timestamp > marks["kernel_hung"] + 20 and (s.signals[engine_scope("tiny", "0")]["seconds_since_last_token"] or 0) == 0
    )
    cleared = next(s for s in snapshots if s.timestamp >= first.timestamp and not verdict(s, "engine_wedged").active)
    assert cleared.timestamp - tokens_again <= 5
    elsewhere = [s.timestamp for s in snapshots if verdict(s, "engine_wedged").active and not marks["kernel_hung"] <= s.timestamp <= cleared.timestamp]
    assert not elsewhere
    assert not [s.timestamp for s in replayed("contention", load(env={})) if verdict(s, "engine_wedged").active]


def test_an_api_server_killed_while_its_engine_core_lives_on_names_the_orphan_and_its_gpu_memory():
    """Default settings. The 1B model's API server SIGKILLed; its engine core lived on holding the GPU (the capture's
    'hung' phase asked for a kernel that never ran: a SIGUSR1 handler, which vLLM 0.26.0's engine core never ran)."""
    marks = marks_of("orphan")
    snapshots = replayed("orphan", load(env={}))
    first = first_active(snapshots, "vllm_unreachable", marks["api_server_killed"], marks["end"] + 30)
    assert first is not None and first.timestamp - marks["api_server_killed"] <= 35
    texts = [e.text for e in verdict(first, "vllm_unreachable").evidence]
    assert any("engine_core pid" in t and "outlived its API server and holds 70.0 GiB on GPU 0" in t and "kill -9" in t for t in texts), texts
    assert first.latest["process"][("process_orphaned", (("role", "engine_core"),))] == 1.0


def active(snapshot) -> set[str]:
    return {v.condition for v in snapshot.verdicts if v.active}


def test_a_pod_whose_vllm_loads_its_model_is_starting_not_unreachable():
    """Default settings. The sidecar recorded from the pod's start; vLLM was launched 5 s later and answered 107 s after
    (the 1B model's real load, CUDA graphs off), then served 16 clients. The truth written before the run: starting
    while it loads, nothing active. (Serving: gpu_starved, cause python, 80 s in: a 1B model at 16 clients keeps the
    engine core's thread busy while the H200's SMs idle, as gpu_heavy's decode; the written truth said nothing there.)"""
    marks = marks_of("rollout")
    snapshots = replayed("rollout", load(env={}))
    loading = [s for s in snapshots if s.timestamp < marks["vllm_ready"]]
    assert loading and all(s.vllm_starting and not active(s) for s in loading), [(s.timestamp, active(s)) for s in loading if active(s)]
    serving = [s for s in snapshots if s.timestamp > marks["vllm_ready"] + 5]
    assert serving and not any(s.vllm_starting for s in serving)
    assert set().union(*map(active, serving)) <= {"gpu_starved"}


def test_vllm_killed_is_unreachable_within_35_s_and_held_while_nothing_answers():
    """Default settings. Every vLLM process SIGKILLed after a minute of 16 clients: nothing listens, the GPU's memory
    is freed. The truth written before the run: vllm_unreachable within 35 s, held to the end; no engine_wedged."""
    marks = marks_of("killed")
    snapshots = replayed("killed", load(env={}))
    first = first_active(snapshots, "vllm_unreachable", marks["vllm_killed"], marks["end"] + 30)
    assert first is not None and first.timestamp - marks["vllm_killed"] <= 35, first and first.timestamp - marks["vllm_killed"]
    assert all(verdict(s, "vllm_unreachable").active for s in snapshots if s.timestamp >= first.timestamp)
    assert not [s.timestamp for s in snapshots if verdict(s, "engine_wedged").active]
    # Before the kill the eager engine core's thread ran at 0.98 of a core beside SM activity 0.04: the GPU starved,
    # as in every eager capture of the 1B model, and nothing else.
    assert not [s.timestamp for s in snapshots if s.timestamp < marks["vllm_killed"] and active(s) - {"gpu_starved"}]
    assert {verdict(s, "gpu_starved").cause for s in snapshots if s.timestamp < marks["vllm_killed"] and verdict(s, "gpu_starved").active} == {
        "launch_overhead"
    }
    assert first.primary == "vllm_unreachable" and not first.vllm_starting
    # Readings from before the kill are no ground for a new verdict once the scrapes fail (raised in the outage, it would
    # page on the past). gpu_starved, active when the kill came, is held on them as Prometheus' keep_firing_for holds an
    # alert: judged on stale readings (said so), then unknown, and over within stale_after + clear_for.
    after = [s for s in snapshots if s.timestamp >= marks["vllm_killed"]]
    raised = [(s.timestamp, c) for before, s in itertools.pairwise(after) for c in active(s) - active(before) - {"vllm_unreachable"}]
    assert not raised
    held = [verdict(s, "gpu_starved") for s in after if s.timestamp > marks["vllm_killed"] + 2 and verdict(s, "gpu_starved").active]
    assert held and all(v.state == "unknown" or any("judged on readings up to" in note for note in v.stale) for v in held)
    settings = load(env={}).conditions["gpu_starved"]
    limit = marks["vllm_killed"] + catalog.stale_after(load(env={}))[VLLM_SOURCE] + settings.clear_seconds + 4
    assert not [s.timestamp for s in after if s.timestamp > limit and verdict(s, "gpu_starved").active]


def test_another_program_on_vllms_gpu_is_seen_by_nvml_and_no_group_verdict_rises_on_one_gpu():
    """Default settings. Another program computed on the H200 beside vLLM for 90 s under 128 clients. The truth written
    before the run: NVML lists it beside the engine core (gpu_foreign_compute_processes 1 while it ran, 0 before and
    after), SM activity above serving's; no tensor-parallel verdict (one GPU)."""
    marks = marks_of("foreign")
    path, _ = capture("foreign")
    counts = [
        (r.timestamp, v)
        for r in read_readings(path)
        if r.source == "gpu" and r.ok
        for (name, _), v in r.samples.items()
        if name == "gpu_foreign_compute_processes"
    ]
    started, ended = marks["foreign_started"], marks["foreign_ended"]
    # NVML's list is read every 10 s (PROCESS_LIST_SECONDS): the program is listed from its first allocation to its exit
    assert {v for t, v in counts if t < started or t > ended + 10} == {0.0}
    assert {v for t, v in counts if started + 10 <= t <= ended} == {1.0}
    snapshots = replayed("foreign", load(env={}))

    def sm_activity_at(moment: float) -> float:  # the window mean of the 60 s before it
        return [s for s in snapshots if s.timestamp <= moment][-1].signals[gpu_scope("0")]["gpu_sm_activity_ratio"]

    serving, shared = sm_activity_at(marks["shared"]), sm_activity_at(ended)
    assert shared > serving + 0.1, (serving, shared)
    assert not [s.timestamp for s in snapshots if {"tp_straggler", "communication_bound", "tp_rank_lost"} & active(s)]


def test_another_program_computing_on_vllms_gpu_is_gpu_shared_within_30_s_naming_its_pid_and_clears_when_it_leaves():
    """Default settings. The truth written before the gpu_shared run: the other program holds a CUDA context and 1 GiB
    for 30 s without a kernel (NVML lists it: no gpu_shared), then runs bf16 matmuls: gpu_shared within 30 s, the
    primary verdict, naming its pid, its GPU memory and its share of the SM time (NVML's per-process samples, well
    above zero), vLLM's own processes not counted, and the ITL change it costs; none before it computes, cleared within
    30 s of its exit."""
    marks = marks_of("gpu_shared")
    started, computing, ended = marks["foreign_started"], marks["foreign_computing"], marks["foreign_ended"]
    snapshots = replayed("gpu_shared", load(env={}))
    first = first_active(snapshots, "gpu_shared", started, ended)
    assert first is not None and 0 <= first.timestamp - computing <= 30, first and first.timestamp - computing
    texts = [e.text for e in verdict(first, "gpu_shared").evidence]
    share = next(e.value for e in verdict(first, "gpu_shared").evidence if e.signal == "gpu_foreign_sm_ratio_recent_max")
    assert any("pid 1270 computes on GPU 0 beside vLLM and holds 1.0 GiB" in t for t in texts), texts
    assert share is not None and share >= 0.2, share
    assert any(t.startswith("vLLM's processes ran ") for t in texts), texts
    assert first.primary == "gpu_shared"
    assert all(verdict(s, "gpu_shared").active for s in snapshots if first.timestamp <= s.timestamp <= ended)
    # what it costs vLLM, against the envelope of the minute before it computed at the same load: ITL 1.5-1.7x
    costs = [t for s in snapshots if verdict(s, "gpu_shared").active for e in verdict(s, "gpu_shared").evidence if (t := e.text).startswith("vLLM now: ")]
    assert costs, "no cost said"
    assert max(float(re.search(r"inter-token latency ([0-9.]+)x", t).group(1)) for t in costs) >= 1.3, costs
    holding = [s for s in snapshots if started + 12 <= s.timestamp <= computing]  # listed by NVML, no kernel of its own
    assert holding and not [s.timestamp for s in holding if verdict(s, "gpu_shared").active]
    assert not [s.timestamp for s in snapshots if (s.timestamp < computing or s.timestamp > ended + 30) and verdict(s, "gpu_shared").active]


def test_a_program_holding_a_context_on_vllms_gpu_is_not_said_to_compute_where_nvml_cannot_tell():
    """The foreign capture was recorded before the source read NVML's per-process samples: NVML listed the program (pid
    1214) for 90 s, nothing said whether it ran kernels. gpu_shared is never active; while it is listed the verdict is
    unknown and says who holds the GPU and that whether it computes is not known (a context alone takes no SM time)."""
    marks = marks_of("foreign")
    snapshots = replayed("foreign", load(env={}))
    assert not [s.timestamp for s in snapshots if verdict(s, "gpu_shared").active]
    listed = [s for s in snapshots if marks["foreign_started"] + 20 <= s.timestamp <= marks["foreign_ended"]]
    assert listed and all(verdict(s, "gpu_shared").state == "unknown" for s in listed)
    texts = [e.text for e in verdict(listed[-1], "gpu_shared").evidence]
    assert any("pid 1214 holds a compute context on GPU 0 beside vLLM (1.0 GiB of its memory)" in t and "not known" in t for t in texts), texts


def test_no_other_capture_has_another_program_on_vllms_gpu():
    """Among them api_server_bound and seqs_cap, where the recording harness itself held a CUDA context (pid 694, 0.6 GiB)
    and ran no kernel beside vLLM: NVML listed it, nothing says it computed."""
    others = ("serving", "kv_thrash", "contention", "hung_kernel", "orphan", "compute_limit", "token_budget", "rollout", "killed")
    for name in (*others, "api_server_bound", "seqs_cap"):
        assert not [s.timestamp for s in replayed(name, load(env={})) if verdict(s, "gpu_shared").active], name


def test_a_gpu_at_its_compute_limit_queues_with_cause_gpu_compute_and_a_well_sized_server_raises_nothing():
    """Default settings. The wide model (8 Llama-70B-shaped layers) at 12 clients (the engine core's thread spins at a
    full core in CUDA syncs), 128 clients (well sized), then 384 streamed clients of 900-word prompts: tensor activity
    ~0.8, client TTFT p50 2.3 s. Written before the run: nothing warns in the first two; in the third a queue whose
    cause is the GPU's compute (with the replicas it takes), compute_bound beside it, no gpu_starved. Measured
    beyond the prediction: each step carried ~8,200 tokens for ~283 sequences, so ITL's cause is the prefill chunks."""
    _, phases = capture("compute_limit")
    snapshots = replayed("compute_limit", load(env={}))
    for name in ("healthy", "well_sized"):
        loud = [(s.timestamp, v.condition) for s in in_phase(snapshots, phases, name) for v in s.verdicts if v.active and v.severity != "info"]
        assert not loud, (name, loud[:5])
    start, end = next((s, e) for n, s, e in phases if n == "saturated")
    first = first_active(snapshots, "queue_backlog", start, end)
    assert first is not None and first.timestamp - start <= ONSET_TO_VERDICT_SECONDS, first and first.timestamp - start
    held = [s for s in snapshots if first.timestamp <= s.timestamp <= end]
    assert all(verdict(s, "queue_backlog").active and s.primary == "queue_backlog" for s in held)
    assert {verdict(s, "queue_backlog").cause for s in held} == {"gpu_compute"}
    assert not any(verdict(s, "gpu_starved").active for s in snapshots if start <= s.timestamp <= end)
    assert verdict(held[-1], "compute_bound").active
    bound = first_active(snapshots, "compute_bound", start, end)
    assert bound is not None and bound.timestamp - start <= ONSET_TO_VERDICT_SECONDS, bound and bound.timestamp - start
    assert any("replicas of this size serve the observed demand" in a for a in verdict(held[-1], "queue_backlog").advice)
    assert {verdict(s, "ttft_high").cause for s in held if verdict(s, "ttft_high").active} == {"queueing"}
    assert {verdict(s, "itl_high").cause for s in held if verdict(s, "itl_high").active} == {"prefill_chunks"}


def test_streaming_clients_that_saturate_the_api_server_are_gpu_starved_by_the_api_server_with_its_count():
    """Default settings. A tiny model, 384 streamed clients asking for 5 logprobs a token: the API server's main thread at
    0.99 of a core, the engine core's at 0.1-0.85, SM activity 0.003, client TTFT p50 10 s / p95 22 s. Written before the
    run and measured so: gpu_starved with cause api_server and --api-server-count advice; ttft_high with cause api_server
    (vLLM's queue and prefill ~0.02 s of a TTFT spent >99 % outside the engine); no compute_bound."""
    _, phases = capture("api_server_bound")
    start, end = next((s, e) for n, s, e in phases if n == "streaming")
    snapshots = [s for s in replayed("api_server_bound", load(env={})) if start <= s.timestamp <= end]
    first = first_active(snapshots, "gpu_starved", start, end)
    assert first is not None and first.timestamp - start <= ONSET_TO_VERDICT_SECONDS, first and first.timestamp - start
    held = [s for s in snapshots if s.timestamp >= first.timestamp]
    assert {verdict(s, "gpu_starved").cause for s in held if verdict(s, "gpu_starved").active} == {"api_server"}
    assert sum(verdict(s, "gpu_starved").active for s in held) >= 0.9 * len(held)
    assert all(any(a.startswith("--api-server-count ") for a in verdict(s, "gpu_starved").advice) for s in held if verdict(s, "gpu_starved").active)
    assert {verdict(s, "ttft_high").cause for s in held if verdict(s, "ttft_high").active} == {"api_server"}
    assert {s.primary for s in held} <= {"gpu_starved", "ttft_high"} and "gpu_starved" in {s.primary for s in held}
    assert not any(verdict(s, c).active for s in snapshots for c in ("compute_bound", "vllm_unreachable", "queue_backlog"))


def test_a_concurrency_cap_below_the_load_leads_with_the_queue_behind_the_cap():
    """Default settings. The wide model with --max-num-seqs 8 and 48 clients: 8 running, ~40 waiting, KV almost empty.
    Written before the run: queue_backlog with cause concurrency_cap, primary; no gpu_starved (a healthy decode). Measured
    otherwise: at 8 sequences a step took 9.4 ms and the GPU ran a kernel 42 % of the time (SM 0.31) while the engine
    core's thread used 0.97 of a core, so gpu_starved holds too. The cap is the fix of both (more sequences per step): the
    queue leads with it, gpu_starved stays a secondary."""
    _, phases = capture("seqs_cap")
    start, end = next((s, e) for n, s, e in phases if n == "capped")
    snapshots = replayed("seqs_cap", load(env={}))
    first = first_active(snapshots, "queue_backlog", start, end)
    assert first is not None and first.timestamp - start <= ONSET_TO_VERDICT_SECONDS, first and first.timestamp - start
    held = [s for s in snapshots if first.timestamp <= s.timestamp <= end]
    assert {verdict(s, "queue_backlog").cause for s in held} == {"concurrency_cap"}
    assert {s.primary for s in held} == {"queue_backlog"}
    assert {verdict(s, "ttft_high").cause for s in held if verdict(s, "ttft_high").active} == {"queueing"}


def test_a_token_budget_too_small_for_long_prompts_leads_with_the_queue_behind_the_budget():
    """Default settings. The wide model with --max-num-batched-tokens 256, 64 clients of 900-word prompts. Written before
    the run: tokens per step at the budget, requests waiting while KV has room and running stays below 128: queue_backlog
    with cause token_budget (advice: raise --max-num-batched-tokens), ttft_high with cause queueing; no concurrency_cap,
    no gpu_starved. Measured: 256 tokens in every step (8 ms), ~58 waiting, 5 running, and the tensor cores 0.58-0.62
    active, at gpu_compute's 0.6: steps pinned at the budget are its cause while the tensor cores have compute to spare
    (0.82 at 8,192-token steps in compute_limit)."""
    _, phases = capture("token_budget")
    start, end = next((s, e) for n, s, e in phases if n == "budget")
    snapshots = replayed("token_budget", load(env={}))
    first = first_active(snapshots, "queue_backlog", start, end)
    assert first is not None and first.timestamp - start <= 60, first and first.timestamp - start
    held = [s for s in snapshots if first.timestamp <= s.timestamp <= end]
    assert {verdict(s, "queue_backlog").cause for s in held} == {"token_budget"}
    assert {s.primary for s in held} == {"queue_backlog"}
    advice = verdict(held[-1], "queue_backlog").advice
    assert any(a.startswith("--max-num-batched-tokens ") and "(now 256)" in a for a in advice), advice
    assert {verdict(s, "ttft_high").cause for s in held if verdict(s, "ttft_high").active} == {"queueing"}
    assert not any(verdict(s, "gpu_starved").active for s in snapshots)
    idle = [s for s in snapshots if s.timestamp < start]
    assert idle and not any(v.active for s in idle for v in s.verdicts)


def _regression(snapshots: list) -> list:
    return [s for s in snapshots if verdict(s, "regression_after_change").active]


def test_cuda_graphs_turned_off_by_a_rollout_is_a_regression_after_change_naming_enforce_eager():
    """Default settings. The 1B model at vLLM's defaults (torch.compile, CUDA graphs) under 32 clients for 120 s, then
    stopped as a pod is and relaunched with --enforce-eager under the same 32 clients. Written before the run: nothing
    in graphs, no regression while relaunching, and in eager output tokens per second per request in flight well below
    graphs', regression_after_change within 90 s naming --enforce-eager and the ratio. Measured: 2,112 requests in 120 s
    eager against 6,969 with graphs."""
    marks = marks_of("eager_change")
    ready = marks["vllm_ready"]
    snapshots = replayed("eager_change", load(env={}))
    first = next((s for s in snapshots if s.timestamp >= ready and verdict(s, "regression_after_change").active), None)
    assert first is not None and first.timestamp - ready <= 90, first and first.timestamp - ready
    assert not [s.timestamp for s in _regression(snapshots) if s.timestamp < ready]
    assert all(verdict(s, "regression_after_change").active for s in snapshots if first.timestamp <= s.timestamp <= marks["idle"])
    found = verdict(first, "regression_after_change")
    texts = [e.text for e in found.evidence]
    assert any(t.startswith("changed at ") and t.endswith(": --enforce-eager added") for t in texts), texts
    ratio = next(e.value for e in found.evidence if e.signal == "vllm_change_throughput_ratio")
    assert ratio is not None and 0.2 <= ratio <= 0.5, ratio  # 2,112 / 6,969 requests: 0.30
    assert any("at 31.3 requests in flight" in t for t in texts), texts  # 32 clients, the same load on both sides


def test_cuda_graphs_off_while_the_gpu_waits_is_said_with_the_flag_and_never_while_graphs_are_on(tmp_path):
    """The same capture, the same 32 clients on the same GPU: with CUDA graphs (vLLM's defaults) the engine core's thread
    is saturated too, but nothing says graphs are off; relaunched with --enforce-eager, SM activity falls to under a
    tenth and feature_ineffective names cuda_graphs with the flag to drop, and gpu_starved's cause says the same. Its
    `for` is 30 s here (300 by default: the command line does not change while vLLM runs)."""
    path = tmp_path / "graphs.yaml"
    path.write_text("conditions:\n  feature_ineffective: {for_seconds: 30}\n")
    marks = marks_of("eager_change")
    snapshots = replayed("eager_change", load(str(path), env={}))

    def says_graphs_off(snapshot) -> bool:
        return any("CUDA graphs are off" in e.text for v in snapshot.verdicts if v.active for e in v.evidence)

    graphs = [s for s in snapshots if marks["graphs"] <= s.timestamp < marks["relaunch"]]
    assert graphs and not [s.timestamp for s in graphs if verdict(s, "feature_ineffective").cause == "cuda_graphs" or says_graphs_off(s)]
    assert any(verdict(s, "gpu_starved").active for s in graphs)  # host-bound with graphs too: the control is not idle
    said = [s for s in snapshots if s.timestamp >= marks["vllm_ready"] and verdict(s, "feature_ineffective").state == "active"]
    first = next((s for s in said if verdict(s, "feature_ineffective").cause == "cuda_graphs"), None)
    assert first is not None and first.timestamp - marks["vllm_ready"] <= 60, first and first.timestamp - marks["vllm_ready"]
    found = verdict(first, "feature_ineffective")
    assert found.cause == "cuda_graphs" and found.role == "secondary", (found.cause, found.role)
    assert any(a.startswith("drop --enforce-eager") for a in found.advice), found.advice
    sm = next(e.value for e in found.evidence if e.signal == "gpu_sm_activity_ratio")
    assert sm is not None and sm < 0.2, sm
    starved = [v for s in snapshots if s.timestamp >= first.timestamp and (v := verdict(s, "gpu_starved")).state == "active" and v.raw]
    launching = [v for v in starved if v.cause in ("launch_overhead", "engine_python")]
    assert launching and all(any(a.startswith("drop --enforce-eager") for a in v.advice) for v in launching), [(v.cause, v.advice) for v in starved][:3]


def test_weights_offloaded_from_a_gpu_with_room_for_them_are_said_with_what_pcie_shows(tmp_path):
    """A real vLLM 0.26 on an H100 (the 1B model, eager, --gpu-memory-utilization 0.5) with --cpu-offload-gb 1 under 32
    clients, then relaunched without the flag under the same clients. Written before the run: feature_ineffective says
    the offload with the flag and the GPU's free memory, advice to drop it; PCIe busier and fewer tokens per second than
    without it. Measured otherwise: the flag changed nothing measurable (38.0 GB of the GPU free in both phases, PCIe at
    0.1 % of the link in both, 4.0k against 4.1k generated tokens per second; vLLM logged "Model loading took 1.88 GiB"
    both times). So the verdict says the weights are not seen crossing PCIe. The eager server's cuda_graphs leads (the
    costlier, measured), the offload's evidence and advice beside it; `for` 30 s here (300 by default)."""
    path = tmp_path / "offload.yaml"
    path.write_text("conditions:\n  feature_ineffective: {for_seconds: 30}\n")
    marks = marks_of("cpu_offload")
    snapshots = replayed("cpu_offload", load(str(path), env={}))

    def offload_advice(v) -> list[str]:
        return [a for a in v.advice if a.startswith("drop --cpu-offload-gb")]

    offloaded = [verdict(s, "feature_ineffective") for s in snapshots if marks["offloaded"] + 60 <= s.timestamp < marks["relaunch"]]
    assert offloaded and all(v.active and v.cause == "cuda_graphs" for v in offloaded), {(v.state, v.cause) for v in offloaded}
    assert {a for v in offloaded for a in offload_advice(v)} == {
        "drop --cpu-offload-gb 1 and raise --gpu-memory-utilization from 0.50 to 0.51: the "
        "GPU has room for the weights, and the flag holds host memory and saves the GPU nothing it needed"
    }
    texts = [e.text for e in offloaded[-1].evidence]
    assert any(t.startswith("--cpu-offload-gb 1: vLLM is asked to keep 1 GiB") for t in texts), texts
    free = next(e.value for e in offloaded[-1].evidence if e.signal == "gpu_memory_free_bytes")
    assert free is not None and free > 30 * 2**30, free  # half of the H100's 80 GB, for 1 GiB offloaded
    assert any(t.startswith("PCIe carries only 0.1% of the link") for t in texts), texts
    resident = [verdict(s, "feature_ineffective") for s in snapshots if s.timestamp >= marks["resident"]]
    assert resident and not [v for v in resident if offload_advice(v) or v.cause == "cpu_offload"]
    assert not [s.timestamp for s in snapshots if verdict(s, "regression_after_change").active]  # dropping the flag made nothing worse


def test_kv_offloading_that_never_loads_back_is_said_and_clears_once_prompts_return(tmp_path):
    """A real vLLM 0.26 on the H200 with --kv-offloading-size 4 and 16 clients: first every prompt new (vLLM copied
    ~200 MB/s of KV blocks out to CPU memory and loaded none back), then prompts drawn from 400 that the GPU's cache
    cannot hold (loads from CPU memory began). Without the GPU source (a sidecar that reads vLLM and its processes), the
    cause is kv_offload with the size and the advice to drop the flag, and it clears once loads come; with every source
    the eager server's cuda_graphs leads, the offload's evidence and advice beside it until the loads. `for` 30 s here
    (300 by default)."""
    path = tmp_path / "offload.yaml"
    path.write_text("window_seconds: 20\nconditions:\n  feature_ineffective: {for_seconds: 30}\n")
    config = load(str(path), env={})
    marks = dict(json.loads(recorded("kv_offload", ".json").read_text())[1:4])
    readings = list(read_readings(recorded("kv_offload", ".jsonl.gz")))
    no_gpu: list = []
    replay([r for r in readings if r.source != "gpu"], config, no_gpu.append)

    def offloading_advised(v) -> bool:
        return any(a.startswith("drop --kv-offloading-size") for a in v.advice)

    unique = [verdict(s, "feature_ineffective") for s in no_gpu if marks["unique"] + 40 <= s.timestamp < marks["returning"]]
    assert unique and all(v.active and v.cause == "kv_offload" and offloading_advised(v) for v in unique), {(v.state, v.cause) for v in unique}
    stored = next(e.value for e in unique[0].evidence if e.signal == "kv_offload_store_bytes_per_second")
    assert stored is not None and stored > 1e7, stored
    assert any("--kv-offloading-size 4" in e.text for e in unique[0].evidence)
    returning = [verdict(s, "feature_ineffective") for s in no_gpu if marks["returning"] + 20 <= s.timestamp < marks["idle"]]
    assert returning and not any(offloading_advised(v) for v in returning)
    assert any(not v.active for v in returning), "the verdict clears within its clear_for once loads come"
    everything: list = []
    replay(readings, config, everything.append)
    led = [verdict(s, "feature_ineffective") for s in everything if marks["unique"] + 40 <= s.timestamp < marks["returning"]]
    assert led and all(v.cause == "cuda_graphs" and offloading_advised(v) for v in led)
    assert not [s for s in everything if s.timestamp >= marks["returning"] + 20 and offloading_advised(verdict(s, "feature_ineffective"))]


def test_a_sidecar_restarted_by_the_rollout_keeps_the_envelope_before_it_in_its_state_file(tmp_path):
    """A rollout replaces the pod, the sidecar with it: the envelope before the change survives only in the state file
    (the chart keeps it on the bundles volume). The eager_change capture cut where vLLM was relaunched: one sidecar
    judges the graphs half and writes its state, a fresh one reads it and judges the eager half. With the file: the
    verdict; without: none, and the evidence says why."""
    marks = marks_of("eager_change")
    path, _ = capture("eager_change")
    readings = list(read_readings(path))
    before = [r for r in readings if r.timestamp < marks["relaunch"]]
    after = [r for r in readings if r.timestamp >= marks["relaunch"]]
    state = tmp_path / "state" / "envelope.json"

    def live(part: list, config: Config) -> list:
        """A live sidecar fed recorded readings on the virtual clock (a replay's envelope is its own, in memory)."""
        pipeline = Pipeline(config)
        snapshots: list = []
        pipeline.replay(part, snapshots.append)
        pipeline.envelope.save()  # as the daemon does when it stops
        return snapshots

    with_file = load(env={}, flags={"envelope_file": str(state)})
    live(before, with_file)
    assert state.exists() and "configurations" in json.loads(state.read_text())
    assert _regression(live(after, with_file))
    without = live(after, load(env={}))
    assert not _regression(without)
    texts = [e.text for e in verdict(without[-1], "regression_after_change").evidence]
    assert any("kept in memory only" in t for t in texts), texts


def test_no_capture_without_a_change_of_vllms_configuration_says_regression_after_change():
    """Every other capture serves one configuration: rollout starts vLLM while recorded, killed and orphan lose it, the
    rest restart nothing. A restart or a stop is never a change."""
    for name in ("serving", "kv_thrash", "contention", "hung_kernel", "orphan", "compute_limit", "token_budget", "rollout", "killed", "gpu_shared"):
        assert not _regression(replayed(name, load(env={}))), name


def chart_default_sources(tmp_path: Path) -> tuple[str, ...]:
    """The sources the sidecar runs as `helm install` renders the chart at its defaults."""
    from tests.unit.test_helm import containers, one, render, sidecar_config

    objects = render({})
    return sidecar_config(containers(one(objects, "Deployment"))["vllm-triage"], objects, tmp_path).sources


def states(readings: list, config: Config) -> list[tuple[float, str | None, dict[str, tuple[str, str | None]]]]:
    """Each tick's primary verdict and every condition's state and cause."""
    ticks: list = []
    replay(readings, config, lambda s: ticks.append((s.timestamp, s.primary, {v.condition: (v.state, v.cause) for v in s.verdicts})))
    return ticks


# What py-spy's GIL share decides: whether the engine core's saturated thread runs Python (engine_python) or launches
# kernels (launch_overhead). Without it the default install says engine_core, and nothing else differs.
PYSPY_CAUSES = {("gpu_starved", "engine_python"): "engine_core", ("gpu_starved", "launch_overhead"): "engine_core"}


@pytest.mark.parametrize("path", sorted(DATA.glob("real-vllm-*.jsonl.gz")), ids=lambda p: p.name.removesuffix(".jsonl.gz"))
def test_the_default_install_gives_every_captures_verdicts_without_pyspy(path, tmp_path):
    """Each real capture read as the chart's default install reads it (its sources only: no py-spy) gives the same
    verdicts and primary at every tick as with all four sources, and the same causes but the one py-spy decides, which
    the evidence says was not measured."""
    from harness.cadence import as_read

    sources = chart_default_sources(tmp_path)
    assert "process" in sources and "gil" not in sources
    config = load(None, env={})
    readings = as_read(list(read_readings(path)), config)
    assert {r.source for r in readings} > set(sources), "recorded with every source"
    default_readings = [r for r in readings if r.source in sources]
    full, default = states(readings, config), states(default_readings, config)

    def expected(condition: str, state_cause: tuple[str, str | None]) -> tuple[str, str | None]:
        state, cause = state_cause
        return state, PYSPY_CAUSES.get((condition, cause or ""), cause)

    differing = [(t, c, a, b) for (t, _, one), (_, _, other) in zip(full, default, strict=True) for c in one if (a := expected(c, one[c])) != (b := other[c])]
    primaries = [(t, a, b) for (t, a, _), (_, b, _) in zip(full, default, strict=True) if a != b]
    assert not differing and not primaries, f"first differences (tick, condition, full, default install): {differing[:5]} {primaries[:5]}"
    notes: list[str] = []
    Pipeline(config, default_readings).replay(
        default_readings, lambda s: notes.extend(e.text for v in s.verdicts if v.condition == "gpu_starved" for e in v.evidence if e.text.startswith("cause "))
    )
    assert not any(note.startswith(("cause engine_python", "cause launch_overhead")) for note in notes), "said without py-spy's GIL share"
    if any(cause == "engine_core" for _, _, ticks in default for state, cause in ticks.values() if state == "active"):
        assert any(note.startswith("cause engine_core") and "GIL share is not measured" in note for note in notes)


def test_vllms_default_max_num_seqs_is_the_one_it_takes_on_the_gpu_it_runs_on():
    """The real eager_change capture (vLLM 0.26.0 on an H100, 80 GiB), its command line's --max-num-seqs 256 left out of
    the process readings, as where vLLM runs at its default: 1024 sequences, not 256, read with the command line visible
    and without it (no process view); without the GPU source the sidecar cannot know the GPU and says so."""

    def unflagged(reading: Reading) -> Reading:
        meta = reading.process_meta()
        if reading.source != "process" or "api_server_args" not in meta:
            return reading
        args = {k: v for k, v in meta["api_server_args"].items() if k != "max_num_seqs"}
        flags = {k: v for k, v in meta.get("api_server_flags", {}).items() if k != "--max-num-seqs"}
        return dataclasses.replace(reading, meta={**meta, "api_server_args": args, "api_server_flags": flags})

    readings = [unflagged(r) for r in read_readings(str(recorded("eager_change", ".jsonl.gz")))]
    config = load(None, env={})

    def discovered(kept: set[str]):
        return Pipeline(config, [r for r in readings if r.source in kept]).replay([r for r in readings if r.source in kept], lambda s: None).discovery

    seen = discovered({"vllm", "process", "gpu"})
    assert (seen.max_num_seqs, seen.max_num_seqs_origin) == (1024, "default")
    assert "vLLM 0.26.0's default on a NVIDIA H100" in seen.max_num_seqs_text and "command line has no --max-num-seqs" in seen.max_num_seqs_text
    blind = discovered({"vllm", "gpu"})
    assert blind.max_num_seqs == 1024 and "command line is not visible" in blind.max_num_seqs_text
    assert seen.served_models == blind.served_models == ("tiny",)  # its --served-model-name; without it, its page's model_name
    no_gpu = discovered({"vllm", "process"})
    assert no_gpu.max_num_seqs == 256 and "the sidecar has read no GPU" in no_gpu.max_num_seqs_text
