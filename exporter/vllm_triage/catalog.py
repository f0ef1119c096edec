"""The sources' catalog: what each source is, as data, one entry each: its signal table, the scopes its signals are
computed in, how they are exported, how far back it looks, the families of its last reading exported as read (with
their help), and the config option of its cadence. Everything derived from the sources (the exposition's help, the
history query, each source's stale-after default, the reference docs) reads this table; how a source is built is the
`build` of its module in sources/ (registry.py). A new source is an entry here, its module in sources/ and its table in
signals/ (docs/development.md, Adding a source)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .model import GIL_SOURCE, GPU_SOURCE, PROCESS_SOURCE, VLLM_SOURCE
from .options import bad, boolean, choice, gpu_list, number, option, optional, text
from .scope import ScopeKind
from .signals.gpu import GPU_SIGNALS
from .signals.host import GIL_SIGNALS, HOST_SIGNALS
from .signals.vllm import VLLM_SIGNALS
from .signals.window import SignalDef

EXPORTED_PREFIX = "vllm_triage_"
# Where the config sets nothing: a source's readings stay evidence this many of its intervals after it starts failing.
STALE_INTERVALS = 3
STALE_MIN_SECONDS = 15.0


@dataclass(frozen=True)
class SourceEntry:
    name: str
    signals: tuple[SignalDef, ...]
    # "engine" and "gpu": computed per engine / GPU and for their aggregate; "host": once, over vLLM's processes by role
    # (the host scope holds every such table's signals)
    scope_kind: ScopeKind
    exported_as: str  # its windowed signals are vllm_triage_<exported_as><family>{<scope_labels>, ...}
    interval_option: str  # the option of its cadence: the config's own or one of `options`
    title: str  # its signal table's title in docs/reference.md
    scope_labels: tuple[str, ...] = ()
    lookback_intervals: float = 0.0  # its window (and history) reaches back at least this many of its own intervals
    # The families of its last reading exported as read (vllm_triage_<family>, like dcgm-exporter), each with its help;
    # every one begins with the source's name.
    latest_help: Mapping[str, str] = field(default_factory=dict)
    # Its own options: a frozen dataclass of `option` fields (each a YAML key, a VLLM_TRIAGE_* variable and a flag),
    # which config.py adds to the options table; its builder reads them with `config.options(<the class>)`.
    options: type[Any] | None = None

    @property
    def exports_latest(self) -> bool:
        return bool(self.latest_help)

    @property
    def latest_prefix(self) -> str:
        """The exported prefix of its last reading's families (and of their history in Prometheus)."""
        return f"{EXPORTED_PREFIX}{self.name}_"


_PROCESS_HELP = {
    "process_cpu_seconds_total": "CPU time of a vLLM process (role api_server | engine_core | worker, index within the role).",
    "process_resident_memory_bytes": "Resident memory of a vLLM process.",
    "process_threads": "Threads of a vLLM process.",
    "process_start_time_seconds": "When a vLLM process started (Unix time): how long it has run, or loaded.",
    "process_exits_total": "vLLM API server processes seen exiting since the sidecar started (a crash loop restarts it under new pids).",
    "process_stopped": "1 when a vLLM process can run no code: stopped by a signal (SIGSTOP, a debugger) or a zombie.",
    "process_busiest_thread_cpu_ratio": "The process's busiest thread since the previous sample, share of one core (1.0 = saturated).",
    "process_thread_runqueue_wait_ratio": "Seconds per second the process's neediest thread waited runnable for a CPU (schedstat) since the previous sample.",
    "process_thread_cpu_demand_ratio": "The process's neediest thread's CPU run plus waited for, share of one core, since the previous sample.",
    "process_orphaned": "vLLM processes of the role (engine core, worker) that outlived their API server: they hold their GPU memory; kill them.",
    "process_lost": "vLLM workers (ranks) gone, exited or zombies, while the engine core that ran them runs on: its other ranks wait in a collective.",
    "process_cgroup_periods_total": "CPU periods of vLLM's container (cgroup cpu.stat nr_periods).",
    "process_cgroup_throttled_periods_total": "Periods in which vLLM's container was throttled by its CPU limit.",
    "process_cgroup_throttled_seconds_total": "Time vLLM's container was throttled by its CPU limit.",
}
_GIL_HELP = {
    "gil_held_ratio": "Share of the latest py-spy window in which a thread of the role's process held the GIL.",
    "gil_failed_sample_ratio": "Share of the latest py-spy window's samples whose stack py-spy could not read (nonblocking: counted as held).",
    "gil_hot_function_ratio": "Share of the latest py-spy window spent in this function while holding the GIL (top N).",
}
_GPU_HELP = {
    "gpu_utilization_ratio": "util.gpu: share of the last sample period a kernel ran (not how busy the SMs are).",
    "gpu_memory_activity_ratio": "util.memory: share of the last sample period device memory was read or written.",
    "gpu_memory_used_bytes": "GPU memory used (vLLM preallocates most of it: read KV usage instead).",
    "gpu_memory_total_bytes": "GPU memory total.",
    "gpu_power_watts": "Power draw.",
    "gpu_power_limit_watts": "Enforced power limit.",
    "gpu_temperature_celsius": "GPU temperature.",
    "gpu_sm_clock_hertz": "SM clock.",
    "gpu_memory_clock_hertz": "Memory clock.",
    "gpu_clock_event_active": "1 while the clock event reason is set (gpu_idle, sw_power_cap, hw_slowdown, ...).",
    "gpu_pcie_link_generation": "Current PCIe link generation.",
    "gpu_pcie_link_generation_max": "Maximum PCIe link generation.",
    "gpu_pcie_link_width": "Current PCIe link width (lanes).",
    "gpu_pcie_link_width_max": "Maximum PCIe link width (lanes).",
    "gpu_pcie_replay_errors_total": "PCIe replay counter.",
    "gpu_gpm_supported": "1 when GPM metrics (SM activity, tensor, DRAM bandwidth) are read from this GPU.",
    "gpu_sm_active_ratio": "GPM SM activity since the previous GPU reading (0..1).",
    "gpu_sm_occupancy_ratio": "GPM SM occupancy since the previous GPU reading (0..1).",
    "gpu_tensor_active_ratio": "GPM tensor-core activity since the previous GPU reading (0..1).",
    "gpu_dram_bandwidth_utilization_ratio": "GPM DRAM bandwidth utilisation since the previous GPU reading (0..1).",
    "gpu_pcie_tx_bytes_per_second": "PCIe transmit throughput (GPM, or NVML's 20 ms sample without GPM).",
    "gpu_pcie_rx_bytes_per_second": "PCIe receive throughput (GPM, or NVML's 20 ms sample without GPM).",
    "gpu_nvlink_tx_bytes_per_second": "NVLink transmit throughput over all links (GPM, or dcgm-exporter's); absent on a GPU with no NVLink up.",
    "gpu_nvlink_rx_bytes_per_second": "NVLink receive throughput over all links (GPM, or dcgm-exporter's); absent on a GPU with no NVLink up.",
    "gpu_xid_errors_total": "XID errors reported by the driver, by XID.",
    "gpu_foreign_compute_processes": (
        "Processes other than vLLM's holding a compute context on the GPU (NVML's compute processes; only where NVML's pids are the sidecar's)."
    ),
    "gpu_foreign_sm_ratio": (
        "Share of the GPU's time the other programs' kernels ran (NVML's per-process samples since the list was read before; absent where the GPU keeps none)."
    ),
}


@dataclass(frozen=True)
class ProcessOptions:
    process_interval_seconds: float = option(5.0, number(0.5), "How often to sample vLLM's processes' CPU (new processes are looked for every 30 s).", "S")
    process_title_prefix: str = option("VLLM", text, "vLLM's VLLM_PROCESS_NAME_PREFIX (process titles VLLM::EngineCore...).", "PREFIX")


@dataclass(frozen=True)
class GpuOptions:
    gpu_interval_seconds: float = option(5.0, number(0.1), "How often to read the GPUs (GPM covers each interval whole).", "S")
    gpus: tuple[str, ...] | None = option(None, optional(gpu_list), "GPUs to watch (indices or UUIDs); default: those vLLM's processes use.", "LIST")
    gpus_file: str | None = option(
        None,
        optional(text),
        "A file naming the GPUs vLLM's container was given (UUIDs or indices, one per line), written by that container; read until it appears.",
        "FILE",
    )
    gpu_source: str = option(
        "nvml",
        choice("nvml", "dcgm"),
        "Where the GPU readings come from: nvml (the sidecar reads the GPUs itself) or dcgm (the node's dcgm-exporter, at dcgm_url).",
        "NAME",
    )
    dcgm_url: str | None = option(
        None,
        optional(text),
        "dcgm-exporter's /metrics (gpu_source: dcgm), e.g. http://$(NODE_IP):9400/metrics; its GPUs of this pod (POD_NAME, POD_NAMESPACE) are read.",
        "URL",
    )
    gpm: bool = option(True, boolean, "Use GPM (SM activity, tensor, DRAM bandwidth) where the GPU supports it.", "BOOL")

    def __post_init__(self) -> None:
        if self.gpu_source == "dcgm" and not self.dcgm_url:
            raise bad("dcgm_url", self.dcgm_url, "gpu_source: dcgm needs dcgm-exporter's URL, e.g. http://10.0.0.5:9400/metrics")


@dataclass(frozen=True)
class GilOptions:
    # py-spy reads vLLM's memory without pausing it (nonblocking): a window cost a CPU-bound real engine nothing
    # measurable while open, where blocking cost it 2-7 % (README, bench/real_engine.py gil_window).
    gil_interval_seconds: float = option(300.0, number(5.0), "How often to sample the GIL of the engine core and the API server with py-spy.", "S")
    gil_window_seconds: float = option(3.0, number(0.5), "Length of each py-spy window (one process at a time).", "S")
    gil_rate: int = option(20, number(1, 1000, integer=True), "py-spy samples per second.", "HZ")
    gil_nonblocking: bool = option(
        True,
        boolean,
        "py-spy --nonblocking: vLLM is not paused (false: py-spy's blocking mode stops every thread for each sample, which costs "
        "vLLM throughput while a window is open; docs/measurements.md has the figures).",
        "BOOL",
    )


CATALOG: tuple[SourceEntry, ...] = (
    SourceEntry(VLLM_SOURCE, VLLM_SIGNALS, "engine", "vllm_", "scrape_interval_seconds", "Layer-1 signals", ("engine", "model_name")),
    SourceEntry(
        PROCESS_SOURCE,
        HOST_SIGNALS,
        "host",
        "process_window_",
        "process_interval_seconds",
        "Process (psutil) signals",
        latest_help=_PROCESS_HELP,
        options=ProcessOptions,
    ),
    SourceEntry(GPU_SOURCE, GPU_SIGNALS, "gpu", "gpu_window_", "gpu_interval_seconds", "GPU signals", ("gpu",), latest_help=_GPU_HELP, options=GpuOptions),
    # py-spy windows come minutes apart: the latest one stays evidence until the next has come (a window is seconds long)
    SourceEntry(
        GIL_SOURCE,
        GIL_SIGNALS,
        "host",
        "process_window_",
        "gil_interval_seconds",
        "GIL (py-spy) signals",
        lookback_intervals=1.25,
        latest_help=_GIL_HELP,
        options=GilOptions,
    ),
)
SOURCE_NAMES = tuple(entry.name for entry in CATALOG)  # the `sources` setting's choices (config.py)
CATALOG_BY_NAME = {entry.name: entry for entry in CATALOG}
LATEST_HELP = {family: text for entry in CATALOG for family, text in entry.latest_help.items()}


class _Cadences(Protocol):
    """What stale_after reads of the Config (which imports this table: a Protocol, not the Config, keeps the import
    one way): the setting, and each source's interval_option by name."""

    @property
    def stale_after_seconds(self) -> float | None: ...

    def value(self, key: str) -> Any: ...


def lookbacks(config: _Cadences) -> dict[str, float]:
    """Per source that reads far apart: the least window its signals are computed over (`lookback_intervals` of its
    cadence)."""
    return {e.name: e.lookback_intervals * float(config.value(e.interval_option)) for e in CATALOG if e.lookback_intervals}


def stale_after(config: _Cadences) -> dict[str, float]:
    """Per source: how long its readings stay evidence after it starts failing: the config's stale_after_seconds, or by
    default STALE_INTERVALS of the source's own cadence (its `interval_option`), at least STALE_MIN_SECONDS."""
    configured = config.stale_after_seconds
    return {e.name: configured if configured is not None else max(STALE_MIN_SECONDS, STALE_INTERVALS * config.value(e.interval_option)) for e in CATALOG}
