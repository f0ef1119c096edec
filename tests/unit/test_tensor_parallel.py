"""Tensor-parallel verdicts on captures built from the real H200 readings (the 2-GPU machine was not lent): the 1-GPU
capture's GPU readings copied to a second GPU, two workers titled as vLLM titles a TP=2 engine's holding one each, and
the fault written into GPU 1's copy as each test says. What the sidecar tells of the group and of the straggler."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from vllm_triage.config_loader import load
from vllm_triage.history.capture import read_readings
from vllm_triage.model import GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE, Labels, Reading, Snapshot, make_labels
from vllm_triage.pipeline import replay
from vllm_triage.scope import gpu_scope

DATA = Path(__file__).resolve().parents[1] / "data"
# vLLM 0.26.0 on the H200 serving 8 layers of 8192 (dummy weights) to 128 clients: SM 0.62, util.gpu 0.75, ~8,000 tokens/s
CONTENTION = DATA / "real-vllm-h200-contention.jsonl.gz"
# the same engine with a kernel that never ends on its stream: util.gpu 1.0 while the SMs do nothing, as a rank spinning
# in an all-reduce for a peer reads
HUNG_KERNEL = DATA / "real-vllm-h200-hung_kernel.jsonl.gz"
# another program (bf16 matmuls in torch) computing on the engine's GPU for 90 s, under 128 clients (wide model, dummy weights)
FOREIGN = DATA / "real-vllm-h200-foreign.jsonl.gz"
WORKERS = (900001, 900002)  # the TP0 and TP1 workers' pids (no such processes: the readings say so)
Rewrite = Callable[[str, dict[str, str], float], float | None]  # (name, GPU 1's labels, value) -> GPU 1's value


def _phase(path: Path, name: str) -> tuple[float, float]:
    marks = json.loads(path.with_suffix("").with_suffix(".json").read_text())
    start = next(t for phase, t in marks if phase == name)
    return start, next(t for _, t in marks if t > start)


def as_tensor_parallel(
    readings: list[Reading],
    gpu1: Rewrite = lambda name, labels, value: value,
    tp: int = 2,
    foreign: bool = False,
    gpu1_from: list[Reading] | None = None,
) -> list[Reading]:
    """The readings as a TP=`tp` engine's sidecar would take them: GPU 0 as read, GPU 1 a copy of the same reading (or
    of the next one of `gpu1_from`) rewritten by `gpu1`; tp=1: as recorded, one GPU and no worker. With `foreign`, NVML
    also lists another program's process on GPU 1; a copied reading brings the other programs NVML really listed."""
    vllm = {p["pid"] for r in readings if r.source == PROCESS_SOURCE for p in r.meta.get("processes", [])}
    copies = iter(gpu1_from) if gpu1_from is not None else None
    out = []
    for reading in readings:
        if reading.source == GPU_SOURCE and reading.ok and tp > 1:
            other = next(copies) if copies is not None else reading
            samples = dict(reading.samples)
            labels1: dict[str, str] = {}
            for (name, labels), value in other.samples.items():
                copy = dict(labels)
                if copy.get("gpu") != "0":
                    continue
                copy.update(gpu="1", **({"uuid": copy["uuid"] + "-tp1"} if "uuid" in copy else {}))
                labels1 = {"gpu": "1", "uuid": copy.get("uuid", "")}
                if (rewritten := gpu1(name, copy, value)) is not None:
                    samples[(name, make_labels(copy))] = rewritten
            held = [{"gpu": i, "pid": pid, "used_bytes": 70.0 * 2**30} for i, pid in enumerate(WORKERS)]
            held += [{**p, "gpu": 1} for p in other.meta.get("compute_processes", []) if p["pid"] not in vllm]
            if foreign:
                held.append({"gpu": 1, "pid": 4242, "used_bytes": 8.0 * 2**30})
                samples[("gpu_foreign_compute_processes", make_labels(labels1))] = 1.0
            for labels in ({"gpu": "0", "uuid": labels1["uuid"].removesuffix("-tp1")}, labels1):
                samples.setdefault(("gpu_foreign_compute_processes", make_labels(labels)), 0.0)  # recorded before it was read
            gpus = [*reading.meta.get("gpus", []), {**reading.meta["gpus"][0], "gpu": 1}]
            reading = dataclasses.replace(reading, samples=samples, meta={**reading.meta, "gpus": gpus, "compute_processes": held})
        elif reading.source == PROCESS_SOURCE and tp > 1:
            workers = [{"pid": pid, "role": "worker", "index": i, "status": "sleeping", "title": f"VLLM::Worker_TP{i}"} for i, pid in enumerate(WORKERS)]
            samples = dict(reading.samples)
            for i in range(len(WORKERS)):
                samples[("process_stopped", make_labels({"role": "worker", "index": str(i)}))] = 0.0
            samples[("process_lost", make_labels({"role": "worker"}))] = 0.0
            reading = dataclasses.replace(reading, samples=samples, meta={**reading.meta, "processes": [*reading.meta["processes"], *workers]})
        out.append(reading)
    return out


def judged(readings: list[Reading], until: float) -> Snapshot:
    snapshot = replay([r for r in readings if r.timestamp <= until], load(env={}), lambda _: None)
    assert snapshot is not None
    return snapshot


def verdict(snapshot: Snapshot, condition: str):  # type: ignore[no-untyped-def]
    return next(v for v in snapshot.verdicts if v.condition == condition)


def texts(v) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.text for e in v.evidence]


def serving() -> tuple[list[Reading], float]:
    """The contention capture up to the end of its serving phase (before its CPU contention), and that moment."""
    _, end = _phase(CONTENTION, "serving")
    return [r for r in read_readings(CONTENTION) if r.timestamp <= end], end - 2


def test_the_group_of_two_gpus_is_found_and_a_balanced_group_holds_no_tp_verdict():
    readings, end = serving()
    snapshot = judged(as_tensor_parallel(readings), end)
    assert snapshot.discovery.parallelism[0].startswith("engine 0: TP=2, 2 ranks on GPUs 0,1: TP0 GPU 0 (worker pid 900001)")
    for condition in ("tp_straggler", "communication_bound", "tp_rank_lost"):
        assert verdict(snapshot, condition).state == "inactive", (condition, texts(verdict(snapshot, condition)))
    assert snapshot.signals[gpu_scope("1")]["gpu_sm_clock_to_peers_ratio"] == 1.0 and snapshot.signals[gpu_scope("0")]["gpu_peers"] == 1.0


def test_a_gpu_whose_clock_runs_below_its_peers_is_the_straggler_and_names_its_brake():
    """GPU 1 at 80 % of the SM clock GPU 0 really ran at, its power brake set: the group runs at its pace."""

    def braked(name: str, labels: dict[str, str], value: float) -> float | None:
        if name == "gpu_sm_clock_hertz":
            return value * 0.8
        if name == "gpu_clock_event_active" and labels.get("reason") == "hw_power_brake_slowdown":
            return 1.0
        return value

    readings, end = serving()
    snapshot = judged(as_tensor_parallel(readings, braked), end)
    straggler = verdict(snapshot, "tp_straggler")
    assert straggler.active and straggler.scopes == ("gpu:1",) and straggler.cause == "clocks", texts(straggler)
    assert any("it runs at 80% of its peers' SM clock (HW slowdown/thermal/power brake set 100% of the window)" in t for t in texts(straggler))
    assert verdict(snapshot, "gpu_throttled").scopes == ("gpu:1",)  # the GPU's own story beside the group's
    # one GPU alone (TP=1, as recorded) with the same brake: no group, no straggler
    alone = judged(as_tensor_parallel(readings, braked, tp=1), end)
    assert verdict(alone, "tp_straggler").state == "inactive"


def test_another_program_computing_on_one_rank_s_gpu_makes_it_the_straggler_and_an_idle_one_does_not():
    """NVML lists another program's process on GPU 1 and its SMs are 40 % busier than GPU 0's (vLLM's kernels and the
    other's share them); the same process holding memory without computing is no straggler."""

    def busier(name: str, labels: dict[str, str], value: float) -> float | None:
        return min(1.0, value * 1.4) if name in ("gpu_sm_active_ratio", "gpu_utilization_ratio") else value

    readings, end = serving()
    snapshot = judged(as_tensor_parallel(readings, busier, foreign=True), end)
    straggler = verdict(snapshot, "tp_straggler")
    assert straggler.active and straggler.scopes == ("gpu:1",) and straggler.cause == "foreign_process", texts(straggler)
    assert any("processes other than vLLM's computing on this GPU 1 is >= 1" in t for t in texts(straggler))
    idle = judged(as_tensor_parallel(readings, foreign=True), end)
    assert verdict(idle, "tp_straggler").state == "inactive", texts(verdict(idle, "tp_straggler"))


def spinning(link: str) -> tuple[list[Reading], float]:
    """The serving phase with every GPU reading replaced, in order, by the hung-kernel capture's readings while its kernel
    was resident (util.gpu 1.0, SMs 0.008 active: what a rank reads while it spins in an all-reduce), and 2 GiB/s each
    way on `link` (20 MiB/s on PCIe beside NVLink)."""
    readings, end = serving()
    start, stop = _phase(HUNG_KERNEL, "kernel_hung")
    inside = [r for r in read_readings(HUNG_KERNEL) if r.source == GPU_SOURCE and r.ok and start <= r.timestamp <= stop]
    hung = iter([r for r in inside if min(v for (name, _), v in r.samples.items() if name == "gpu_utilization_ratio") == 1.0] * 4)
    out = []
    for reading in readings:
        if reading.source == GPU_SOURCE and reading.ok:
            samples: dict[tuple[str, Labels], float] = {k: v for k, v in next(hung).samples.items() if "pcie_tx" not in k[0] and "pcie_rx" not in k[0]}
            for name in (f"gpu_{link}_tx_bytes_per_second", f"gpu_{link}_rx_bytes_per_second", "gpu_pcie_tx_bytes_per_second", "gpu_pcie_rx_bytes_per_second"):
                samples.setdefault((name, make_labels({"gpu": "0", "uuid": "x"})), 2.0 * 2**30 if link in name else 20.0 * 2**20)
            reading = dataclasses.replace(reading, samples=samples)
        out.append(reading)
    return out, end


def test_a_group_whose_busy_gpus_wait_on_collectives_over_pcie_is_communication_bound():
    readings, end = spinning("pcie")
    snapshot = judged(as_tensor_parallel(readings), end)
    bound = verdict(snapshot, "communication_bound")
    assert bound.active and bound.cause == "pcie", texts(bound)
    assert any(t.startswith("interconnect per processed token") and "is >= 32 KiB" in t for t in texts(bound)), texts(bound)
    busy = verdict(snapshot, "gpu_busy_not_computing")
    assert not busy.active and busy.suppressed_by == "communication_bound"
    # the same GPU readings on one GPU without tensor parallelism: no collectives, the busy-but-idle GPU is its own story
    alone = judged(as_tensor_parallel(readings, tp=1), end)
    assert verdict(alone, "communication_bound").state == "inactive" and verdict(alone, "gpu_busy_not_computing").active


def test_collectives_over_nvlink_are_named_so():
    readings, end = spinning("nvlink")
    bound = verdict(judged(as_tensor_parallel(readings), end), "communication_bound")
    assert bound.active and bound.cause == "nvlink", texts(bound)


def test_a_rank_whose_gpu_another_program_computes_on_is_the_straggler_on_the_h200s_real_readings():
    """GPU 0: what the H200 read while vLLM served alone; GPU 1: what it read, over the same stretch of the next phase,
    while another program ran bf16 matmuls beside vLLM (NVML listed its pid; GPM's SM activity 0.80-0.87 against
    0.56-0.75). The sidecar's own foreign-process count and NVML's process list are the real ones."""
    readings = list(read_readings(FOREIGN))
    serving_start, serving_end = _phase(FOREIGN, "serving")
    shared_start, _ = _phase(FOREIGN, "shared")
    alone = iter([r for r in readings if r.source == GPU_SOURCE and r.ok and serving_start <= r.timestamp <= serving_end])
    # from 10 s into the shared phase (NVML lists a process from its first allocation), as long as the serving phase lasted
    shared = [r for r in readings if shared_start + 10 <= r.timestamp <= shared_start + 10 + serving_end - serving_start]
    beside = [r for r in shared if r.source == GPU_SOURCE and r.ok]
    assert {v for r in beside for (name, _), v in r.samples.items() if name == "gpu_foreign_compute_processes"} == {1.0}
    timeline = []  # the shared phase's, GPU 0 reading what it read while vLLM served alone
    for reading in shared:
        if reading.source == GPU_SOURCE and reading.ok:
            if (served := next(alone, None)) is None:
                break
            reading = dataclasses.replace(reading, samples=served.samples, meta=served.meta)
        timeline.append(reading)
    snapshot = judged(as_tensor_parallel(timeline, gpu1_from=beside), timeline[-1].timestamp)
    straggler = verdict(snapshot, "tp_straggler")
    assert straggler.active and straggler.scopes == ("gpu:1",) and straggler.cause == "foreign_process", texts(straggler)
    assert (
        snapshot.signals[gpu_scope("1")]["gpu_sm_activity_to_peers_ratio"] > 1.15 and snapshot.signals[gpu_scope("0")]["gpu_foreign_compute_processes_max"] == 0
    )


def as_two_engines(
    readings: list[Reading], gpu: Callable[[int, str, float], float] = lambda index, name, value: value, engine1_from: list[Reading] | None = None
) -> list[Reading]:
    """The TP=2 readings (as_tensor_parallel) as two data-parallel engines' would be (DP=2 x TP=2, four GPUs): GPUs 0 and 1
    copied as GPUs 2 and 3 (from the same reading of `engine1_from`, a timeline of the same readings, where given), each
    copy rewritten by `gpu(index, name, value)`; four workers titled VLLM::Worker_DP{d}_TP{t}, one per GPU; with
    `engine1_from`, vLLM's page also carries engine 1, a copy of engine 0's series."""
    pids = (*WORKERS, 900003, 900004)
    out = []
    engine1 = as_tensor_parallel(engine1_from) if engine1_from is not None else None
    for position, reading in enumerate(as_tensor_parallel(readings)):
        if reading.source == VLLM_SOURCE and reading.ok and engine1 is not None:
            samples = dict(reading.samples)
            for (name, labels), value in reading.samples.items():
                if ("engine", "0") in labels:
                    samples[(name, make_labels({**dict(labels), "engine": "1"}))] = value
            reading = dataclasses.replace(reading, samples=samples)
        elif reading.source == GPU_SOURCE and reading.ok:
            samples = dict(reading.samples)
            for (name, labels), value in (engine1[position] if engine1 is not None else reading).samples.items():
                copy = dict(labels)
                if copy.get("gpu") in ("0", "1"):
                    index = int(copy["gpu"]) + 2
                    copy.update(gpu=str(index), **({"uuid": copy["uuid"] + "-dp1"} if "uuid" in copy else {}))
                    samples[(name, make_labels(copy))] = gpu(index, name, value)
            held = [{"gpu": i, "pid": pid, "used_bytes": 70.0 * 2**30} for i, pid in enumerate(pids)]
            gpus = [*reading.meta["gpus"], *({**g, "gpu": g["gpu"] + 2} for g in reading.meta["gpus"])]
            reading = dataclasses.replace(reading, samples=samples, meta={**reading.meta, "gpus": gpus, "compute_processes": held})
        elif reading.source == PROCESS_SOURCE:
            others = [p for p in reading.meta["processes"] if p["role"] != "worker"]
            workers = [
                {"pid": pid, "role": "worker", "index": i, "status": "sleeping", "title": f"VLLM::Worker_DP{i // 2}_TP{i % 2}"} for i, pid in enumerate(pids)
            ]
            samples = {**reading.samples, **{("process_stopped", make_labels({"role": "worker", "index": str(i)})): 0.0 for i in range(4)}}
            reading = dataclasses.replace(reading, samples=samples, meta={**reading.meta, "processes": [*others, *workers]})
        out.append(reading)
    return out


def test_with_two_data_parallel_engines_a_gpu_is_compared_with_its_own_group_only():
    """DP=2 x TP=2 on four GPUs built from the H200's readings. GPU 3 braked to 80 % of the SM clock: the straggler of
    engine 1's group (GPU 2 its one peer). Engine 1's two GPUs both at 80 %: a slower engine, no straggler (against every
    GPU watched, GPU 2 and 3 would each read 0.8 of the others' median)."""
    readings, end = serving()

    def gpu3_braked(index: int, name: str, value: float) -> float:
        return value * 0.8 if index == 3 and name == "gpu_sm_clock_hertz" else value

    snapshot = judged(as_two_engines(readings, gpu3_braked), end)
    assert snapshot.discovery.parallelism[1].startswith("engine 1: TP=2, 2 ranks on GPUs 2,3"), snapshot.discovery.parallelism
    straggler = verdict(snapshot, "tp_straggler")
    assert straggler.active and straggler.scopes == ("gpu:3",) and straggler.cause == "clocks", texts(straggler)
    assert any("GPUs in its tensor-parallel group (the rank map) 2 is >= 2" in t for t in texts(straggler)), texts(straggler)
    assert snapshot.signals[gpu_scope("3")]["gpu_peers"] == 1.0 and snapshot.signals[gpu_scope("0")]["gpu_sm_clock_to_peers_ratio"] == 1.0

    def engine1_slower(index: int, name: str, value: float) -> float:
        return value * 0.8 if name == "gpu_sm_clock_hertz" else value

    slower = judged(as_two_engines(readings, engine1_slower), end)
    assert verdict(slower, "tp_straggler").state == "inactive", texts(verdict(slower, "tp_straggler"))
    assert slower.signals[gpu_scope("2")]["gpu_sm_clock_to_peers_ratio"] == 1.0


def test_with_two_data_parallel_engines_each_is_judged_beside_its_own_gpus():
    """DP=2 x TP=2: engine 0's GPUs serve as the H200 read them; engine 1's spin in their collectives over PCIe (the
    hung-kernel capture's resident-kernel readings, 2 GiB/s each way), while both engines' pages count the same tokens.
    Judged beside every GPU's mean, the group's picture is blurred; beside its own GPUs, engine 1 is communication-bound
    and engine 0 is not."""
    readings, end = serving()
    spun, _ = spinning("pcie")
    snapshot = judged(as_two_engines(readings, engine1_from=spun), end)
    bound = verdict(snapshot, "communication_bound")
    assert bound.active and bound.scopes == ("tiny/1",) and bound.cause == "pcie", texts(bound)
    assert snapshot.discovery.parallelism[1].startswith("engine 1: TP=2, 2 ranks on GPUs 2,3"), snapshot.discovery.parallelism
