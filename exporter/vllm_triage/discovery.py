"""Facts about the watched vLLM that its metrics do not carry (max_num_seqs, version, processes),
resolved from config, then the readings, then vLLM's defaults; each says where it came from."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .hardware import GpuPeak, gpu_peak
from .model import (
    GIL_SOURCE,
    GPU_SOURCE,
    MAX_NUM_SEQS_READ,
    PROCESS_SOURCE,
    VLLM_SOURCE,
    ComputeProcess,
    DiscoveryView,
    GpuEntry,
    GpuMeta,
    LostWorker,
    OrphanEntry,
    ProcessEntry,
    ProcessMeta,
    RankEntry,
)
from .scope import Scope, gpu_scope
from .signals.window import ServerFacts
from .sources.process import STOPPED_STATES
from .store import Store

CONTENTION_NOTE_MIN = 0.1  # seconds per second a thread waited for a CPU from which the host notes name it


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


GIB = 2**30


def default_max_num_seqs(version: str | None, gpu_memory_bytes: float | None = None, gpu_name: str | None = None) -> tuple[int, str]:
    """vLLM's default max_num_seqs for the OpenAI server, as that version takes it on that GPU, and why. From 0.9 on
    (EngineArgs' defaults; `_set_default_max_num_seqs_and_batched_tokens_args` in 0.32 and 0.33): 1024 on GPUs of 70 GiB
    or more other than the A100 (0.33 also leaves out the GB10), and from 0.32 on any GPU of 160 GiB or more; 256 on
    other GPUs; 128 x the world size on the CPU build. Before 0.9: 256. The GPU is NVML's (its memory and name)."""
    parsed = _version_tuple(version) if version else None
    if parsed is not None and parsed < (0, 9):
        return 256, f"vLLM {version}'s default"
    which = f"vLLM {version}'s" if version else "current vLLM's (version unknown)"
    if gpu_memory_bytes is None:
        return 256, f"{which} default on GPUs under 70 GiB; 1024 on H100/H200-class GPUs, and the sidecar has read no GPU"
    gib, name = gpu_memory_bytes / GIB, gpu_name or "GPU"
    newer = parsed is None or parsed >= (0, 32)
    excluded = "A100" in name.upper() or ((parsed is None or parsed >= (0, 33)) and "GB10" in name.upper().replace(" ", ""))
    large = (gib >= 70 and not excluded) or (newer and gib >= 160)
    if large:
        rule = "70 GiB or more other than the A100" + (", or of 160 GiB or more" if newer else "")
        return 1024, f"{which} default on a {name} of {gib:.0f} GiB: 1024 on GPUs of {rule}"
    why = f"the {'A100' if 'A100' in name.upper() else 'GB10'} is left out of the larger default" if excluded else "under 70 GiB"
    return 256, f"{which} default on a {name} of {gib:.0f} GiB: {why}"


def _bounded(value: Any) -> int | None:
    """A count read from the monitored host's command line: data, not trust (1..2^20, else not known)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_NUM_SEQS_READ else None


RANK_PART = re.compile(r"_(DP|PP|PCP|TP|DCP|EP)(\d+)")  # the parts of a worker's (or engine core's) title vLLM sets


@dataclass(frozen=True)
class Discovery:
    max_num_seqs: int
    max_num_seqs_origin: str  # config | command_line | history | default
    max_num_seqs_text: str
    vllm_version: str | None
    api_server_args: dict[str, Any]
    processes: tuple[ProcessEntry, ...]
    gpus: tuple[GpuEntry, ...] = ()
    gpu_selection: str | None = None  # which rule chose the GPUs (config, CUDA_VISIBLE_DEVICES, ...)
    hot_functions: tuple[tuple[str, str, str, float], ...] = ()  # (role, function, file, share) from py-spy
    process_binding: str | None = None  # how the watched processes were tied to the scraped server
    ignored_processes: int = 0  # vLLM-titled processes of other servers
    gpu_peak: GpuPeak | None = None  # the watched GPUs' model's peaks (the slowest, were they mixed)
    runnable_tasks: int | None = None  # threads runnable on the host at the newest process reading
    orphans: tuple[OrphanEntry, ...] = ()  # engine cores and workers that outlived their API server
    gpu_processes: tuple[ComputeProcess, ...] = ()  # NVML's compute processes on the watched GPUs (pid, gpu, used_bytes)
    lost_workers: tuple[LostWorker, ...] = ()  # workers gone while their engine core runs on
    foreign_pids: tuple[int, ...] = ()  # of gpu_processes, those not vLLM's (nor its processes' children)
    api_server_flags: dict[str, str] = field(default_factory=dict)  # every flag of its command line as written
    served_models: tuple[str, ...] = ()  # the model names vLLM serves: its command line's, else its page's

    def facts(self) -> ServerFacts:
        peak = self.gpu_peak
        return ServerFacts(
            self.max_num_seqs,
            peak.bf16_flops_per_second if peak else None,
            peak.memory_bytes_per_second if peak else None,
            self.gpu_groups,
            _bounded(self.api_server_args.get("max_num_batched_tokens")),
            (_bounded(self.api_server_args.get("api_server_count")) or 1) if self.processes else None,
            self.cuda_graphs,
            self.cpu_offload_gib,
        )

    @cached_property  # facts() is asked for at every window of a tick; the command line does not change within one
    def cuda_graphs(self) -> bool | None:
        """Whether vLLM captures CUDA graphs, as its command line says: off with --enforce-eager or a --compilation-config
        whose cudagraph_mode is NONE; None without the host view."""
        if not self.processes:
            return None
        if self.api_server_args.get("enforce_eager"):
            return False
        try:
            compilation = json.loads(self.api_server_flags.get("--compilation-config") or "{}")
        except ValueError:
            compilation = {}
        return not (isinstance(compilation, dict) and str(compilation.get("cudagraph_mode", "")).upper() == "NONE")

    @cached_property
    def cpu_offload_gib(self) -> float | None:
        """The weights vLLM's command line keeps in host memory per GPU (--cpu-offload-gb, GiB): 0 without the flag,
        None without the host view or where its value is not a number."""
        if not self.processes:
            return None
        raw = self.api_server_flags.get("--cpu-offload-gb", "0")
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if math.isfinite(value) and value >= 0 else None

    def _gpus_by(self, key: Callable[[RankEntry], Any]) -> dict[Any, tuple[Scope, ...]]:
        """The GPUs (their scopes) the rank map places ranks on, by `key` of the rank; groups without a GPU left out."""
        grouped: dict[Any, set[Scope]] = {}
        for rank in self.ranks:
            grouped.setdefault(key(rank), set()).update(gpu_scope(str(g)) for g in rank["gpus"])
        return {k: tuple(sorted(gpus)) for k, gpus in sorted(grouped.items()) if gpus}

    @cached_property
    def engine_gpus(self) -> dict[str, tuple[Scope, ...]]:
        """Each data-parallel engine's GPUs (their scopes, by its engine label: the dp rank), where the rank map places
        two or more engines on GPUs: each is judged beside its own GPUs, not every GPU's mean."""
        placed = self._gpus_by(lambda rank: str(rank["dp_rank"]))
        return placed if len(placed) > 1 else {}

    @cached_property
    def gpu_groups(self) -> tuple[tuple[Scope, ...], ...]:
        """Each tensor-parallel group's GPUs (one engine's pipeline stage), as scopes: the ranks whose collectives
        wait for each other."""
        return tuple(self._gpus_by(lambda rank: (rank["dp_rank"], rank["pp_rank"])).values())

    def host_notes(self) -> list[str]:
        """The busiest thread of each engine core / API server, then the functions holding the GIL."""
        notes = self.busiest_threads()
        for role, function, file, share in self.hot_functions:
            notes.append(f"{role} hot while holding the GIL: {function} ({file}) {share:.0%} of the py-spy window")
        return notes

    def busiest_threads(self) -> list[str]:
        """'engine_core 0 (pid 42): busiest thread "VLLM::EngineCor" (main) at 0.97 of a core', one per process, with
        the thread that waited for a CPU where one did."""
        lines = []
        for p in self.processes:
            if p.get("role") not in ("engine_core", "api_server"):
                continue
            who = f"{p['role']} {p.get('index', 0)} (pid {p['pid']})"
            thread = p.get("busiest_thread")
            if thread:
                main = " (main thread)" if thread.get("main") else ""
                lines.append(f'{who}: busiest thread "{thread["name"]}"{main} at {thread["cpu_ratio"]:.2f} of a core')
            needy = p.get("neediest_thread")
            if needy and needy.get("runqueue_wait_ratio", 0.0) >= CONTENTION_NOTE_MIN:
                main = " (main thread)" if needy.get("main") else ""
                cpus = p.get("cpus_allowed")
                where = f"; it may run on {cpus} CPU{'s' if cpus != 1 else ''}" if cpus else ""
                crowd = f", {self.runnable_tasks} threads runnable on the host now" if self.runnable_tasks is not None else ""
                lines.append(
                    f'{who}: thread "{needy["name"]}"{main} waited {needy["runqueue_wait_ratio"]:.2f} s per second for a CPU while it ran '
                    f"{needy['cpu_ratio']:.2f}{where}{crowd}"
                )
        return lines

    def orphan_notes(self) -> list[str]:
        """'engine_core pid 42 (sleeping) outlived its API server and holds 70.0 GiB on GPU 0: ...', one per orphan."""
        notes = []
        for orphan in self.orphans:
            held = [p for p in self.gpu_processes if p.get("pid") == orphan["pid"]]
            memory = (
                " and holds " + ", ".join(f"{used / 2**30:.1f} GiB on GPU {p['gpu']}" for p in held if (used := p.get("used_bytes")) is not None)
                if any(p.get("used_bytes") is not None for p in held)
                else " (NVML lists no GPU memory under its pid: it may hold none, or NVML sees the host's pids)"
            )
            notes.append(
                f"{orphan['role']} pid {orphan['pid']} ({orphan.get('status', '?')}) outlived its API server{memory}: a restarted vLLM "
                f"will not fit beside it; kill it (kill -9 {orphan['pid']})"
            )
        return notes

    def foreign_gpu_notes(self) -> list[tuple[Scope, str]]:
        """(GPU scope, 'pid 1214 computes on GPU 0 beside vLLM and holds 1.0 GiB of it: ...'), one per other program on a
        watched GPU, with what NVML's per-process samples say it computed."""
        notes = []
        for held in self.gpu_processes:
            if held.get("pid") in self.foreign_pids:
                used = held.get("used_bytes")
                gib = f"{used / 2**30:.1f} GiB" if used is not None else None
                share = held.get("sm_ratio")
                if share is not None and share > 0:
                    memory = f" and holds {gib} of it" if gib else ""
                    what = f"computes on GPU {held['gpu']} beside vLLM{memory}: its kernels ran {share:.0%} of the GPU's time (NVML, the last 10 s)"
                else:
                    memory = f" ({gib} of its memory)" if gib else ""
                    why = "it ran no kernel in the last 10 s (NVML)"
                    if share is None:
                        why = "NVML keeps no per-process samples here, so whether it computes is not known"
                    what = f"holds a compute context on GPU {held['gpu']} beside vLLM{memory}: {why}"
                notes.append((gpu_scope(str(held["gpu"])), f"pid {held['pid']} {what} (ps -o pid,user,args -p {held['pid']})"))
        for gpu in sorted({h["gpu"] for h in self.gpu_processes if h.get("pid") in self.foreign_pids}):
            shares = [
                share for h in self.gpu_processes if h["gpu"] == gpu and h.get("pid") not in self.foreign_pids and (share := h.get("sm_ratio")) is not None
            ]
            if shares:
                notes.append((gpu_scope(str(gpu)), f"vLLM's processes ran {sum(shares):.0%} of GPU {gpu}'s time meanwhile (NVML, the last 10 s)"))
        return notes

    def lost_rank_notes(self) -> list[str]:
        """'worker VLLM::Worker_TP1 (pid 42) is gone (exited) while its engine core (pid 40) runs on: ...', one per worker
        gone, then one per worker that runs no code (stopped, a zombie)."""
        notes = [
            f"worker {w['title']} (pid {w['pid']}) is {'gone (exited)' if w['status'] == 'gone' else w['status']} while its engine core "
            f"(pid {w['engine_core_pid']}) runs on: the other ranks wait for it in their next collective"
            for w in self.lost_workers
        ]
        for p in self.processes:
            if p.get("role") == "worker" and p.get("status") in STOPPED_STATES:
                notes.append(
                    f"worker {p.get('title', '?')} (pid {p.get('pid')}) is {p.get('status')}: it runs no code, and the other ranks wait for "
                    "it in their next collective"
                )
        return notes

    @cached_property
    def ranks(self) -> list[RankEntry]:
        """The rank map: each process that runs the model (vLLM's workers, one per GPU; with neither tensor nor pipeline
        parallelism, the engine core itself) with its data-, pipeline- and tensor-parallel rank, read from its title
        (`VLLM::Worker_DP1_PP0_TP1`: a part left out is a group of one), and the GPUs NVML lists its memory on. Made
        once: a tick reads it for the global signals and for /diagnosis."""
        workers = [p for p in self.processes if p.get("role") == "worker"]
        ranked: list[RankEntry] = []
        for p in workers or [p for p in self.processes if p.get("role") == "engine_core"]:
            parts = {kind: int(number) for kind, number in RANK_PART.findall(str(p.get("title", "")).partition("::")[2])}
            if "title" not in p:  # recorded before titles were: the index stands for the engine (engine cores) or rank
                parts = {"DP": p.get("index", 0)} if p.get("role") == "engine_core" else {"TP": p.get("index", 0)}
            gpus = sorted({int(h["gpu"]) for h in self.gpu_processes if h.get("pid") == p.get("pid") and h.get("gpu") is not None})
            ranked.append(
                RankEntry(pid=p.get("pid"), role=p.get("role"), dp_rank=parts.get("DP", 0), pp_rank=parts.get("PP", 0), tp_rank=parts.get("TP", 0), gpus=gpus)
            )
        return sorted(ranked, key=lambda r: (r["dp_rank"], r["pp_rank"], r["tp_rank"]))

    def view(self) -> DiscoveryView:
        """What the outlets read of it (the Snapshot's discovery)."""
        ranks = self.ranks
        return DiscoveryView(
            max_num_seqs=self.max_num_seqs,
            max_num_seqs_origin=self.max_num_seqs_origin,
            max_num_seqs_text=self.max_num_seqs_text,
            vllm_version=self.vllm_version,
            api_server_args=self.api_server_args,
            processes=self.processes,
            orphans=self.orphans,
            lost_workers=self.lost_workers,
            process_binding=self.process_binding,
            ignored_processes=self.ignored_processes,
            gpus=self.gpus,
            gpu_selection=self.gpu_selection,
            gpu_peak=None if self.gpu_peak is None else vars(self.gpu_peak),
            ranks=tuple(ranks),
            parallelism=tuple(parallelism_lines(ranks, bool(self.gpus))),
            served_models=self.served_models,
        )


def parallelism_lines(ranks: list[RankEntry], gpus_read: bool) -> list[str]:
    """A rank map in words, one line per engine: 'engine 0: TP=2, 2 ranks on GPUs 2,3: TP0 GPU 2 (worker pid 41), TP1
    GPU 3 (worker pid 42)'. Without GPU readings (`gpus_read` false: no GPU source) the GPUs are not named."""
    lines = []
    for engine in sorted({r["dp_rank"] for r in ranks}):
        group = [r for r in ranks if r["dp_rank"] == engine]
        tp, pp = 1 + max(r["tp_rank"] for r in group), 1 + max(r["pp_rank"] for r in group)
        where = ", ".join(
            f"{'PP' + str(r['pp_rank']) + ' ' if pp > 1 else ''}TP{r['tp_rank']} "
            + (f"GPU {','.join(map(str, r['gpus']))} " if r["gpus"] else "GPU unknown " if gpus_read else "")
            + f"({r['role']} pid {r['pid']})"
            for r in group
        )
        gpus = sorted({g for r in group for g in r["gpus"]})
        on = f" on GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))}" if gpus else ""
        whose = "its pid" if len(group) == 1 else "some ranks' pids"
        missing = "" if all(r["gpus"] for r in group) or not gpus_read else f" (NVML lists no memory under {whose}: another pid namespace, or not loaded yet)"
        lines.append(f"engine {engine}: TP={tp}{f', PP={pp}' if pp > 1 else ''}, {len(group)} rank{'s' if len(group) > 1 else ''}{on}: {where}{missing}")
    return lines


def discover(store: Store, configured_max_num_seqs: int | None) -> Discovery:
    vllm = store.latest(VLLM_SOURCE)
    version = vllm.vllm_meta().get("version") if vllm is not None and vllm.ok else None
    process = store.latest(PROCESS_SOURCE)
    found = process.process_meta() if process is not None else ProcessMeta()
    args = dict(found.get("api_server_args", {}))
    processes = tuple(found.get("processes", ()))
    origin: str | None = None
    value, text = 0, ""
    if configured_max_num_seqs:
        value, origin = configured_max_num_seqs, "config"
        text = f"max_num_seqs={value} (from the sidecar config)"
    elif (read := _bounded(args.get("max_num_seqs"))) is not None:
        value, origin = read, "command_line"
        text = f"max_num_seqs={value} (from the vLLM command line, pid {found.get('api_server_pid', '?')})"
    elif vllm is not None and (exported := _bounded(vllm.vllm_meta().get("exported_max_num_seqs"))) is not None:
        value, origin = exported, "history"
        text = f"max_num_seqs={value} (what the sidecar beside this vLLM exported, from Prometheus' history)"
    gpu = store.latest(GPU_SOURCE)
    gpu_found = gpu.gpu_meta() if gpu is not None and gpu.ok else GpuMeta()
    gpus = tuple(gpu_found.get("gpus", ()))
    if origin is None:
        # the smallest of the watched GPUs: vLLM sizes its default by the device it runs on (one model, in practice)
        totals = [total for (name, _), total in gpu.samples.items() if name == "gpu_memory_total_bytes"] if gpu is not None and gpu.ok else []
        memory = min(totals, default=None)
        value, why = default_max_num_seqs(version, memory, next((g["name"] for g in gpus if g.get("name")), None))
        origin = "default"
        seen = "vLLM's command line has no --max-num-seqs" if args else "vLLM's command line is not visible: set max_num_seqs in the config to be sure"
        text = f"max_num_seqs={value} ({why}; {seen})"
    selection = gpu_found.get("selection")
    gil = store.latest(GIL_SOURCE)
    hot = (
        tuple(
            sorted(
                (
                    (dict(labels)["role"], dict(labels)["function"], dict(labels)["file"], share)
                    for (name, labels), share in gil.samples.items()
                    if name == "gil_hot_function_ratio"
                ),
                key=lambda item: -item[3],
            )[:6]
        )
        if gil is not None and gil.ok
        else ()
    )
    binding = found.get("binding")
    ignored = found.get("ignored_processes", 0)
    known = [p for g in gpus if (p := gpu_peak(g.get("name"))) is not None]
    peak = min(known, key=lambda p: p.bf16_flops_per_second) if known and len(known) == len(gpus) else None
    runnable = found.get("runnable_tasks")
    orphans = tuple(found.get("orphans", ()))
    held = tuple(gpu_found.get("compute_processes", ()))
    lost = tuple(found.get("lost_workers", ()))
    if "foreign_pids" in gpu_found:
        foreign = tuple(gpu_found["foreign_pids"])
    else:  # recorded before the GPU source said which: a pid that is not one of vLLM's watched processes
        ours = {p["pid"] for p in processes}
        foreign = tuple(sorted({h["pid"] for h in held if h["pid"] not in ours})) if ours & {h["pid"] for h in held} else ()
    flags = dict(found.get("api_server_flags", {}))
    named = args.get("served_model_name") or args.get("model")
    served = (str(named),) if named else _page_models(store)
    return Discovery(
        value, origin, text, version, args, processes, gpus, selection, hot, binding, ignored, peak, runnable, orphans, held, lost, foreign, flags, served
    )


MODELS_MAX = 8  # model names of one vLLM (--served-model-name takes several; a page with more is not one server's)


def _page_models(store: Store) -> tuple[str, ...]:
    """The model_name labels of vLLM's newest page (a vLLM whose command line is not visible), from the store's index
    by metric name: one family's series, not every sample of the page at every tick."""
    latest = store.latest(VLLM_SOURCE)
    frames = store.window(VLLM_SOURCE, latest.timestamp, latest.timestamp) if latest is not None and latest.ok else []
    running = frames[-1].by_name.get("vllm:num_requests_running", ()) if frames else ()
    return tuple(sorted({v for series in running for k, v in series.labels if k == "model_name"}))[:MODELS_MAX]
