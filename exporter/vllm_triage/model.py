"""Plain data passed between the stages: Readings in, Snapshot out.

Everything here is immutable and JSON-friendly so that a capture on disk and the live pipeline
carry exactly the same values.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict, cast

from .scope import Labels as Labels  # the label pairs a series key holds; defined beside the scopes made of them
from .scope import Scope

SeriesKey = tuple[str, Labels]

# Source names: the `source` label of the health metrics and the key of a Reading.
VLLM_SOURCE = "vllm"
PROCESS_SOURCE = "process"
GPU_SOURCE = "gpu"
GIL_SOURCE = "gil"

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")  # the samples of one Prometheus histogram


# What a source learned beside its samples (Reading.meta), one type per source; JSON as it is in a capture.
class VllmMeta(TypedDict, total=False):
    series: int  # series on the page
    old_names: list[str]  # pre-0.12 names the page used
    dropped: dict[str, int]  # reason -> series refused (sources.vllm.DROP_REASONS)
    engine_generation: str  # "v0" where only V0's names appear
    version: str  # vLLM's GET /version
    exported_max_num_seqs: int  # what the sidecar beside it exported (vllm_triage_vllm_max_num_seqs), read from Prometheus' history


# The largest max_num_seqs read from the monitored host or a history (data, not trust): larger is no count of vLLM's.
MAX_NUM_SEQS_READ = 2**20


class ThreadSample(TypedDict, total=False):
    tid: int
    name: str
    main: bool  # the process's main thread
    cpu_ratio: float  # of one core, between the last two reads
    runqueue_wait_ratio: float  # seconds per second it waited for a CPU (neediest only)


class ProcessEntry(TypedDict, total=False):
    pid: int
    role: str  # api_server | engine_core | worker
    index: int  # among its role's processes
    status: str  # psutil's
    title: str  # its title's first word (VLLM::Worker_TP1): its ranks; not for the API server
    busiest_thread: ThreadSample
    neediest_thread: ThreadSample  # the one that wanted the most CPU (ran + waited for one)
    cpus_allowed: int


class OrphanEntry(TypedDict, total=False):
    pid: int
    role: str
    title: str
    status: str


class LostWorker(TypedDict):
    pid: int
    title: str  # VLLM::Worker_TP1: its ranks
    status: str  # psutil's; "gone" once exited
    engine_core_pid: int  # the engine core that ran it, alive


class ProcessMeta(TypedDict, total=False):
    processes: list[ProcessEntry]
    binding: str  # how the processes were tied to the scraped server
    ignored_processes: int  # vLLM-titled processes of other servers
    runnable_tasks: int | None  # threads runnable on the host
    orphans: list[OrphanEntry]  # engine cores and workers that outlived their API server
    lost_workers: list[LostWorker]  # workers gone while their engine core runs
    api_server_args: dict[str, Any]  # its command line's flags, parsed
    api_server_flags: dict[str, str]  # every flag of its command line as written, secrets redacted
    api_server_pid: int
    process_view: bool  # processes beyond the sidecar's own are visible (a shared process namespace)
    api_server_exit_times: list[float]  # when API servers were seen exiting (the last 16)


# nvmlDeviceGetCurrentClocksEventReasons bits (NVML's nvmlClocksEventReason* constants)
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


class GpuEntry(TypedDict, total=False):
    gpu: int  # NVML's index
    uuid: str
    name: str
    gpm: bool | None  # GPM metrics are read (None until asked)
    nvlink: bool  # an NVLink is up


class _ComputeProcessHeld(TypedDict):
    gpu: int
    pid: int  # NVML's: the host's
    used_bytes: float | None


class ComputeProcess(_ComputeProcessHeld, total=False):
    # Its share of the GPU's SM time since the list was read before (NVML's per-process utilisation samples), where
    # NVML kept samples of it.
    sm_ratio: float


class GpuMeta(TypedDict, total=False):
    gpus: list[GpuEntry]
    selection: str  # which rule chose the GPUs
    unsupported: list[str]  # what the GPUs cannot read
    compute_processes: list[ComputeProcess]  # the processes holding memory on the watched GPUs
    # Those of compute_processes that are not vLLM's (nor its processes' children), where NVML's pids are the sidecar's
    foreign_pids: list[int]


# One shared tuple per label set: every scrape repeats the same series, and the store keeps a
# minute of frames, so sharing saves most of the memory (32 engines: 250 -> ~100 MB). A new label set's
# (name, value) pairs are shared too, and their strings interned: a model name new at every scrape is
# then one string and one pair per page, not one copy per series (31 engines of 600-character names
# new at every scrape: 6,000 copies a page, 34 pages in the window).
# The table follows the pages seen: it keeps two generations, a new one begun every
# LABEL_GENERATION_SECONDS (checked when a label set is new). A set in use moves into the new generation
# at its next use; the old generation, with every set no page used since, is dropped at the next turn.
# A model name that never settles then leaves two generations of names behind, not all of them up to
# the byte bound. That bound caps both generations together (by the bytes of label text, not entries:
# churning 4 KB labels grew an entry-bounded table to 500 MB): over it, the old generation is dropped,
# then the new one, which only costs re-sharing the sets still in use.
LABEL_GENERATION_SECONDS = 120.0
MAX_INTERNED_LABEL_BYTES = 16 * 1024 * 1024
_INTERNED_LABELS: dict[Labels, Labels] = {}  # this generation
_INTERNED_LABELS_BEFORE: dict[Labels, Labels] = {}  # the one before: a set used again moves on
_INTERNED_PAIRS: dict[tuple[str, str], tuple[str, str]] = {}  # this generation's
_current_bytes = 0
_before_bytes = 0
_generation_started = time.monotonic()


def _shared_pair(pair: tuple[str, str]) -> tuple[str, str]:
    shared = _INTERNED_PAIRS.get(pair)
    if shared is None:
        shared = _INTERNED_PAIRS[pair] = (sys.intern(pair[0]), sys.intern(pair[1]))
    return shared


def make_labels(labels: dict[str, str]) -> Labels:
    global _INTERNED_LABELS, _INTERNED_LABELS_BEFORE, _current_bytes, _before_bytes, _generation_started
    key = tuple(sorted(labels.items()))
    shared = _INTERNED_LABELS.get(key)
    if shared is not None:
        return shared
    size = 64 + sum(len(k) + len(v) + 16 for k, v in key)
    shared = _INTERNED_LABELS_BEFORE.pop(key, None)
    if shared is not None:
        _before_bytes -= size
    else:
        now = time.monotonic()
        if now - _generation_started >= LABEL_GENERATION_SECONDS:
            _INTERNED_LABELS_BEFORE, _before_bytes, _generation_started = _INTERNED_LABELS, _current_bytes, now
            _INTERNED_LABELS, _current_bytes = {}, 0
            _INTERNED_PAIRS.clear()
        if _current_bytes + _before_bytes + size > MAX_INTERNED_LABEL_BYTES:
            _INTERNED_LABELS_BEFORE, _before_bytes = {}, 0
        if _current_bytes + size > MAX_INTERNED_LABEL_BYTES:
            _INTERNED_LABELS, _current_bytes = {}, 0
            _INTERNED_PAIRS.clear()
        shared = tuple(map(_shared_pair, key))
    _INTERNED_LABELS[shared] = shared
    _current_bytes += size
    return shared


def bucket_bound(le: str | None) -> float | None:
    """A histogram bucket's upper bound, or None for one that is no number ("abc", "", "NaN")."""
    if le is None:
        return None
    try:
        bound = float(le)
    except ValueError:
        return None
    return None if bound != bound else bound


TIMESTAMP_MAX = 1e10  # Unix seconds in 2286: a later stamp is a wrong one (at 1e17 adding a tick no longer moves a clock)


API_SERVER_LABELS: Labels = (("index", "0"), ("role", "api_server"))  # the watched API server's (make_labels' order)


@dataclass(frozen=True)
class Reading:
    """What one source saw at one moment. `ok=False` readings are kept: they are evidence too."""

    source: str
    timestamp: float
    ok: bool
    samples: dict[SeriesKey, float] = field(default_factory=dict)
    error: str | None = None
    error_reason: str | None = None  # bounded vocabulary, used as a metric label
    duration_seconds: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)  # the source's own type: vllm_meta(), process_meta(), gpu_meta()

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"source": self.source, "t": self.timestamp, "ok": self.ok}
        if self.samples:
            record["samples"] = [[name, dict(labels), value] for (name, labels), value in self.samples.items()]
        if self.error is not None:
            record["error"] = self.error
            record["error_reason"] = self.error_reason
        if self.duration_seconds:
            record["duration_seconds"] = self.duration_seconds
        if self.meta:
            record["meta"] = self.meta
        return record

    @classmethod
    def from_json(cls, record: Any) -> Reading:
        """Raises ValueError naming what is wrong with a record that is not a reading."""
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        timestamp = float(record["t"])
        if not math.isfinite(timestamp) or not 0 <= timestamp <= TIMESTAMP_MAX:
            raise ValueError(f"timestamp {str(record['t'])[:40]} is not a time (Unix seconds up to {TIMESTAMP_MAX:.0f}, the year 2286)")
        samples = {}
        for entry in record.get("samples", []):
            if not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[1], dict):
                raise ValueError(f"a sample must be [name, {{labels}}, value], got {str(entry)[:80]}")
            name, labels, value = entry
            samples[(str(name), make_labels({str(k): str(v) for k, v in labels.items()}))] = float(value)
        return cls(
            source=str(record["source"]),
            timestamp=timestamp,
            ok=bool(record["ok"]),
            samples=samples,
            error=record.get("error"),
            error_reason=record.get("error_reason"),
            duration_seconds=float(record.get("duration_seconds", 0.0)),
            meta=dict(record.get("meta", {})),
        )

    def vllm_meta(self) -> VllmMeta:
        return cast(VllmMeta, self.meta) if self.source == VLLM_SOURCE else {}

    def process_meta(self) -> ProcessMeta:
        return cast(ProcessMeta, self.meta) if self.source == PROCESS_SOURCE else {}

    def api_server_started(self) -> float | None:
        """When the API server the process source watches started (Unix time); None where it watches none."""
        return self.samples.get(("process_start_time_seconds", API_SERVER_LABELS)) if self.source == PROCESS_SOURCE else None

    def gpu_meta(self) -> GpuMeta:
        return cast(GpuMeta, self.meta) if self.source == GPU_SOURCE else {}

    def shifted(self, offset_seconds: float) -> Reading:
        """The same reading moved in time (demo replay loops a capture onto the wall clock)."""
        return Reading(
            source=self.source,
            timestamp=self.timestamp + offset_seconds,
            ok=self.ok,
            samples=self.samples,
            error=self.error,
            error_reason=self.error_reason,
            duration_seconds=self.duration_seconds,
            meta=self.meta,
        )


class ProcessTargets:
    """vLLM's processes, (role, pid) in the order the process source listed them: what the GIL and GPU sources sample.
    The daemon sets them from each process reading it takes in; a source reads them when it collects (the tuple is
    replaced whole, so a reader in another thread sees one listing or the next)."""

    def __init__(self, processes: Iterable[tuple[str, int]] = ()) -> None:
        self.processes: tuple[tuple[str, int], ...] = tuple(processes)

    def update(self, reading: Reading) -> None:
        """The processes of the process source's latest reading (none when it failed)."""
        self.processes = tuple((p["role"], p["pid"]) for p in reading.process_meta().get("processes", []))

    def pids(self) -> list[int]:
        return [pid for _, pid in self.processes]

    def first_by_role(self) -> dict[str, int]:
        """The first process of each role: the one the GIL source samples."""
        chosen: dict[str, int] = {}
        for role, pid in self.processes:
            chosen.setdefault(role, pid)
        return chosen


class RankEntry(TypedDict):
    """One process that runs the model, with its data-, pipeline- and tensor-parallel rank and the GPUs it holds."""

    pid: int | None
    role: str | None
    dp_rank: int
    pp_rank: int
    tp_rank: int
    gpus: list[int]


@dataclass(frozen=True)
class DiscoveryView:
    """What discovery found at a tick, as the outlets read it and /diagnosis shows it (its `discovery` object, in this
    order): vLLM's max_num_seqs and where it came from, its version and flags, its processes, the GPUs, the rank map."""

    max_num_seqs: int | None = None
    max_num_seqs_origin: str | None = None  # config | command_line | history | default
    max_num_seqs_text: str = ""
    vllm_version: str | None = None
    api_server_args: dict[str, Any] = field(default_factory=dict)
    processes: tuple[ProcessEntry, ...] = ()
    orphans: tuple[OrphanEntry, ...] = ()
    lost_workers: tuple[LostWorker, ...] = ()
    process_binding: str | None = None
    ignored_processes: int = 0
    gpus: tuple[GpuEntry, ...] = ()
    gpu_selection: str | None = None
    gpu_peak: dict[str, Any] | None = None  # the watched GPUs' model and peaks (hardware.GpuPeak)
    ranks: tuple[RankEntry, ...] = ()
    parallelism: tuple[str, ...] = ()  # the rank map in words, one line per engine
    # the model names vLLM serves (its command line's, else its page's, else the last known: kept across outages and the
    # sidecar's restarts): what ties this pod to its model's other replicas (vllm_triage_vllm_model_info)
    served_models: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {f.name: list(value) if isinstance(value := getattr(self, f.name), tuple) else value for f in fields(self)}


@dataclass(frozen=True)
class SourceHealth:
    source: str
    up: bool | None  # None: no reading yet
    last_error: str | None
    last_error_reason: str | None
    last_success_timestamp: float | None
    collect_duration_seconds: float
    errors_total: dict[str, int]  # by reason
    failing_since: float | None = None  # start of the current run of failed collections

    def to_json(self) -> dict[str, Any]:
        return {
            "up": self.up,
            "last_error": self.last_error,
            "last_error_reason": self.last_error_reason,
            "last_success_timestamp": self.last_success_timestamp,
            "collect_duration_seconds": self.collect_duration_seconds,
            "errors_total": dict(self.errors_total),
            "failing_since": self.failing_since,
        }


@dataclass(frozen=True)
class Evidence:
    """One observed value against the threshold it was judged by, with the sentence a person reads."""

    signal: str
    value: float | None
    threshold: float | None
    comparison: str  # ">=", "<", ... or "" for context-only evidence
    holds: bool | None
    text: str
    scope: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "scope": self.scope,
            "value": self.value,
            "comparison": self.comparison,
            "threshold": self.threshold,
            "holds": self.holds,
            "text": self.text,
        }


@dataclass(frozen=True)
class Verdict:
    condition: str
    layer: str
    severity: str
    summary: str
    state: str  # active | inactive | unknown
    raw: bool | None  # the predicate this tick, before debouncing
    score: float
    since: float | None  # when `state` last changed
    evidence: tuple[Evidence, ...]
    next_actions: tuple[str, ...]
    missing: tuple[str, ...] = ()
    cause: str | None = None
    causes: tuple[str, ...] = ()  # every cause this condition can report (stable metric series)
    scopes: tuple[str, ...] = ()  # engines/models where the predicate holds
    held: bool = False  # unknown now, last judged active: still counts as active until its clear_for
    stale: tuple[str, ...] = ()  # inputs judged on readings of a source that is failing (< stale_after)
    suppressed_by: str | None = None  # another condition explains this one's evidence
    role: str = ""  # primary | secondary (active verdicts): which story the report leads with
    advice: tuple[str, ...] = ()  # values computed from the observed workload, with their arithmetic

    @property
    def active(self) -> bool:
        return self.state == "active" or self.held

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "condition": self.condition,
            "layer": self.layer,
            "severity": self.severity,
            "summary": self.summary,
            "state": self.state,
            "raw": self.raw,
            "score": round(self.score, 4),
            "since": self.since,
            "evidence": [e.to_json() for e in self.evidence],
            "next_actions": list(self.next_actions),
            "missing_inputs": list(self.missing),
            "scopes": list(self.scopes),
        }
        if self.held:
            record["held_active"] = True
        if self.stale:
            record["stale"] = list(self.stale)
        if self.suppressed_by:
            record["suppressed_by"] = self.suppressed_by
        if self.role:
            record["role"] = self.role
        if self.causes:
            record["cause"] = self.cause
        if self.advice:
            record["advice"] = list(self.advice)
        return record


def _gpus_json(latest: dict[SeriesKey, float]) -> dict[str, dict[str, float]]:
    """The last GPU reading by GPU index: {"0": {"gpu_utilization_ratio": 0.98, ...}}."""
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in sorted(latest.items()):
        label = dict(labels)
        key = name + "".join(f"{{{k}={v}}}" for k, v in labels if k not in ("gpu", "uuid"))
        out.setdefault(label.get("gpu", "?"), {})[key] = value
    return out


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float as None: strict JSON parsers (JavaScript's) reject NaN/Infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class SidecarState:
    """The sidecar's own state that outlives one evaluation: what the daemon hands each evaluation to carry, so that
    /metrics, /diagnosis and /readyz show it from the snapshot they serve."""

    evaluation_failures: int = 0  # evaluations that raised since start (reloads included)
    evaluation_error: str | None = None  # the last evaluation's error; None when it succeeded
    config_reload_successful: bool = True  # False once the config file changed into one that was refused

    def to_json(self) -> dict[str, Any]:
        return {
            "evaluation_failures": self.evaluation_failures,
            "evaluation_error": self.evaluation_error,
            "config_reload_successful": self.config_reload_successful,
        }


SIDECAR_AT_START = SidecarState()  # no evaluation failed, no reload refused


@dataclass(frozen=True)
class Snapshot:
    """Everything the outlets show, computed once per tick (after a failed evaluation: the last good one, carrying
    the failure in `sidecar`)."""

    timestamp: float
    signals: dict[Scope, dict[str, float | None]]  # scope -> signal -> value
    verdicts: tuple[Verdict, ...]
    sources: tuple[SourceHealth, ...]
    evaluations: int
    window_seconds: float
    discovery: DiscoveryView = field(default_factory=DiscoveryView)
    primary: str | None = None  # the verdict the report leads with (see diagnosis.engine._primary)
    latest: dict[str, dict[SeriesKey, float]] = field(default_factory=dict)  # source -> its last good reading, as read
    # Python stacks taken when a condition that asks for them became active (engine_wedged): where it is stuck
    stack_dumps: tuple[dict[str, Any], ...] = ()
    # How long vLLM has been starting: no answer yet since the sidecar started, and the host shows a start, not an outage
    # (Engine._vllm_starting_seconds). None when it is not starting.
    vllm_starting_seconds: float | None = None
    sidecar: SidecarState = SIDECAR_AT_START

    @property
    def vllm_starting(self) -> bool:
        return self.vllm_starting_seconds is not None

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = json_safe(
            {
                "schema_version": DIAGNOSIS_SCHEMA_VERSION,
                "timestamp": self.timestamp,
                "window_seconds": self.window_seconds,
                "evaluations": self.evaluations,
                "primary": self.primary,
                "vllm_starting": self.vllm_starting,
                "vllm_starting_seconds": self.vllm_starting_seconds,
                "conditions": [v.to_json() for v in self.verdicts],
                "sources": {s.source: s.to_json() for s in self.sources},
                "signals": {scope.key: values for scope, values in self.signals.items()},
                "discovery": self.discovery.to_json(),
                "gpus": _gpus_json(self.latest.get(GPU_SOURCE, {})),
                "stack_dumps": list(self.stack_dumps),
                "sidecar": self.sidecar.to_json(),
            }
        )
        return record


# /diagnosis' shape: raised when a field goes away or changes its meaning (a new field does not raise it), so that a
# consumer can refuse what it cannot read instead of misreading it.
DIAGNOSIS_SCHEMA_VERSION = 1


def diagnosis_json(snapshot: Snapshot) -> bytes:
    """/diagnosis and `diagnose --json`: strict JSON (no NaN or Infinity: json_safe made them null)."""
    return json.dumps(snapshot.to_json(), indent=1, allow_nan=False).encode()
