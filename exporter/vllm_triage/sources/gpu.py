"""Layer 3 (GPU): NVML and, on Hopper and newer, GPM — per GPU that the watched vLLM uses.

Every NVML call blocks (ctypes; the GIL is released), so the daemon runs `collect()` in a thread.
A field a GPU does not support is skipped and listed once as unsupported, not counted as an error.
Without the library, a driver or a GPU, a Reading says so once per state change and the rest of
the sidecar keeps working.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from ..catalog import GpuOptions
from ..cpu_account import CPU
from ..model import CLOCK_EVENT_REASONS, GPU_SOURCE, ComputeProcess, GpuEntry, GpuMeta, Labels, ProcessTargets, Reading, SeriesKey, make_labels
from . import Clock, SourceLoop
from .dcgm import DcgmSource

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

GPM_MIN_INTERVAL_SECONDS = 0.1  # GPM needs two samples at least 100 ms apart
# Fields that move slowly or only by admin action (limits, totals, memory vLLM preallocated,
# temperature, link maxima, replay counter) are read every 10 s, halving NVML calls per tick.
SLOW_REFRESH_SECONDS = 10.0
RESELECT_SECONDS = 30.0
INIT_RETRY_MAX_SECONDS = 60.0  # NVML that could not start: asked again after 1, 2, 4 ... s, then every minute
PROCESS_LIST_SECONDS = 10.0
MAX_COMPUTE_PROCESSES = 32  # per GPU: bounded, whatever a shared node runs
FALLBACK_RULE = "all visible GPUs (no vLLM process or device variable seen yet)"
MIB = 1024 * 1024


def parse_visible_devices(value: str) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES -> device indices or UUIDs; None for "all"."""
    value = value.strip()
    if value in ("", "all"):
        return None
    if value in ("none", "void", "NoDevFiles"):
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass
class _Device:
    index: int
    uuid: str
    handle: Any
    name: str = ""  # NVML's model name ("NVIDIA H200"): the peaks efficiency is measured against
    gpm: bool | None = None  # None until GPM support is asked (when the GPU is first chosen)
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, current], swapped each tick
    gpm_previous_time: float | None = None
    gpm_request: Any = None  # one metrics struct, reused tick after tick
    nvlink: bool = False  # an NVLink of this GPU is up: GPM's NVLink throughput is read (else absent, not 0)
    labels: dict[tuple[str, str], Labels] = field(default_factory=dict)  # built once per series
    slow: dict[str, float | None] = field(default_factory=dict)  # see SLOW_REFRESH_SECONDS
    slow_time: float = -math.inf
    process_samples_seen: int = 0  # NVML's timestamp (us) of the newest per-process utilisation sample read


def foreign_sm_ratio(foreign: Iterable[ComputeProcess]) -> float:
    """The share of the GPU's time other programs' kernels ran: their NVML per-process shares summed (a pid without a
    share ran no kernel), at most the whole GPU."""
    return min(1.0, sum(p.get("sm_ratio", 0.0) for p in foreign))


def _release_freed_heap() -> None:
    """Give the C library's freed heap pages back to the system. NVML's start frees about 10 MB that Python never
    asks malloc for again (small objects live in its own arenas), and glibc keeps them: on an H100 this one call
    after nvmlInit took a sidecar reading GPU and processes from 78 to 67 MB, one at the defaults beside vLLM from
    84 to 78 MB. Nothing happens where libc has no malloc_trim (musl)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


class GpuSource:
    def __init__(
        self,
        selection: Sequence[str] | None = None,
        targets: ProcessTargets | None = None,
        use_gpm: bool = True,
        clock: Callable[[], float] = time.time,
        gpus_file: str | None = None,
    ) -> None:
        self.selection = selection
        self.gpus_file = gpus_file
        self.targets = targets or ProcessTargets()  # none: no process of vLLM's is known
        self.use_gpm = use_gpm
        self.clock = clock
        self._nvml: Any = None
        self._devices: list[_Device] | None = None
        self._every: list[_Device] = []
        self._rule = ""
        self._provisional = False  # chosen before vLLM could be seen: look again every RESELECT_SECONDS
        self._selected_at = -math.inf
        self._unsupported: set[str] = set()
        self._last_state: str | None = None
        self._xid_counts: dict[tuple[int, int], int] = {}
        self._xid_lock = threading.Lock()
        self._xid_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._processes: list[ComputeProcess] = []
        self._processes_at: float | None = None
        self._lineage: dict[int, bool] = {}  # pid -> in vLLM's process tree, for NVML's current list
        # NVML that could not start is asked again after a doubling wait (to INIT_RETRY_MAX_SECONDS), not at every
        # collection: loading the library and failing again cost 0.03 % of a core each second on a host without it.
        self._init_failure: _Unavailable | None = None
        self._init_retry_at = -math.inf
        self._init_backoff = 0.0

    # --- lifecycle -----------------------------------------------------------------------
    def _init(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise _Unavailable("no_library", "nvidia-ml-py is not installed (pip install 'vllm-triage[gpu]')") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _Unavailable("no_driver", f"NVML cannot start ({exc}): no NVIDIA driver or library visible to the sidecar") from None
        self._nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise _Unavailable("no_gpu", "NVML sees no GPU")
        handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        self._every = [
            _Device(index, _text(pynvml.nvmlDeviceGetUUID(handle)), handle, _text(pynvml.nvmlDeviceGetName(handle))) for index, handle in enumerate(handles)
        ]
        self._apply_selection()
        self._xid_thread = threading.Thread(target=self._watch_xid, name="nvml-xid", daemon=True)
        self._xid_thread.start()
        _release_freed_heap()

    def _init_or_wait(self) -> None:
        if self._init_failure is not None and self.clock() < self._init_retry_at:
            raise self._init_failure
        try:
            self._init()
        except _Unavailable as exc:
            self._init_failure = exc
            self._init_backoff = min(INIT_RETRY_MAX_SECONDS, max(1.0, 2 * self._init_backoff))
            self._init_retry_at = self.clock() + self._init_backoff
            raise
        self._init_failure = None

    def _apply_selection(self) -> None:
        """Choose the GPUs to watch. A sidecar often starts before vLLM (a native sidecar always does):
        until a rule that sees vLLM decides, the choice is provisional and is made again later."""
        chosen, rule = self._select(self._every)
        self._selected_at = self.clock()
        self._provisional = rule == FALLBACK_RULE
        if self._devices is not None and [d.index for d in chosen] == [d.index for d in self._devices]:
            self._rule = rule
            return
        for device in self._devices or []:
            if device not in chosen:
                self._free_gpm(device)
        for device in chosen:
            if device.gpm is None:
                device.gpm = self.use_gpm and self._gpm_supported(device)
                device.nvlink = self._nvlink_up(device)
        self._devices, self._rule = chosen, rule
        log.info(
            "GPU source: watching GPU(s) %s (chosen by %s%s); GPM %s",
            ",".join(str(d.index) for d in chosen),
            rule,
            f"; looking again every {RESELECT_SECONDS:g} s" if self._provisional else "",
            "on" if any(d.gpm for d in chosen) else "not supported: SM activity falls back to util.gpu",
        )

    def _free_gpm(self, device: _Device) -> None:
        for sample in device.gpm_samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError:
                pass
        device.gpm_samples.clear()

    def close(self) -> None:
        self._stop.set()
        if self._nvml is not None and self._devices is not None:
            for device in self._devices:
                self._free_gpm(device)

    def _select(self, every: list[_Device]) -> tuple[list[_Device], str]:
        """Config first, then the vLLM processes' *_VISIBLE_DEVICES, then NVML's process list, then all."""

        def pick(wanted: Sequence[str]) -> list[_Device]:
            return [d for d in every if str(d.index) in wanted or d.uuid in wanted or any(d.uuid.startswith(w) for w in wanted if len(w) > 8)]

        if self.selection:
            return pick(self.selection), "config"
        if self.gpus_file:
            try:
                listed = [item.strip() for item in Path(self.gpus_file).read_text().replace(",", "\n").splitlines() if item.strip()]
            except OSError:
                listed = []
            chosen = pick(listed)
            if chosen:
                return chosen, f"{self.gpus_file}, written by vLLM's container"
        pids = self.targets.pids()
        for variable in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
            for pid in pids:
                try:
                    value = psutil.Process(pid).environ().get(variable)
                except (psutil.Error, OSError):
                    continue
                if value is None:
                    continue
                wanted = parse_visible_devices(value)
                if wanted is None:
                    return every, f"{variable}=all of vLLM pid {pid}"
                chosen = pick(wanted)
                if chosen:
                    return chosen, f"{variable}={value} of vLLM pid {pid}"
        if pids:
            assert self._nvml is not None
            using = []
            for device in every:
                try:
                    running = {p.pid for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(device.handle)}
                except self._nvml.NVMLError:
                    continue
                if running & set(pids):
                    using.append(device)
            if using:
                return using, "NVML's compute process list"
        return every, FALLBACK_RULE

    def _gpm_supported(self, device: _Device) -> bool:
        nvml = self._nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(device.handle).isSupportedDevice:
                return False
            device.gpm_samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            return True
        except (nvml.NVMLError, AttributeError):
            return False

    def _nvlink_up(self, device: _Device) -> bool:
        """Whether any NVLink of the GPU is up. The lent H200 (one GPU of a VM) answers not supported for every link,
        while GPM reads its NVLink throughput as 0: absent then says no NVLink, 0 an idle one."""
        nvml = self._nvml
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nvml.nvmlDeviceGetNvLinkState(device.handle, link) == nvml.NVML_FEATURE_ENABLED:
                    return True
            except (nvml.NVMLError, AttributeError):
                continue
        return False

    def _watch_xid(self) -> None:
        """XID errors arrive as NVML events; waiting blocks, hence this thread."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
            for device in self._devices or []:
                try:
                    nvml.nvmlDeviceRegisterEvents(device.handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                except nvml.NVMLError:
                    continue
        except nvml.NVMLError as exc:
            log.info("GPU source: XID events not available (%s)", exc)
            return
        index_of = {d.uuid: d.index for d in self._devices or []}
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, 1000)
            except nvml.NVMLError:
                continue  # timeout: no event this second
            try:
                index = index_of.get(_text(nvml.nvmlDeviceGetUUID(data.device)), -1)
            except nvml.NVMLError:
                index = -1
            with self._xid_lock:
                key = (index, int(data.eventData))
                self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
            log.warning("GPU source: XID %d on GPU %d", data.eventData, index)

    # --- collection ------------------------------------------------------------------------
    def collect(self) -> Reading:
        start = time.perf_counter()
        timestamp = self.clock()
        try:
            if self._devices is None:
                self._init_or_wait()
            elif self._provisional and self.clock() - self._selected_at >= RESELECT_SECONDS:
                self._apply_selection()
            samples, problems = self._read_all()
        except _Unavailable as exc:
            reading = Reading(GPU_SOURCE, timestamp, False, error=exc.message, error_reason=exc.reason, duration_seconds=time.perf_counter() - start)
            self._log_state(reading)
            return reading
        meta = GpuMeta(
            gpus=[GpuEntry(gpu=d.index, uuid=d.uuid, name=d.name, gpm=d.gpm, nvlink=d.nvlink) for d in self._devices or []],
            selection=self._rule,
        )
        if self._unsupported:
            meta["unsupported"] = sorted(self._unsupported)
        meta["compute_processes"] = held = self._compute_processes()
        ours = set(self.targets.pids())
        if ours & {p["pid"] for p in held}:  # NVML's pids are this namespace's: a pid that is not vLLM's is another program's
            theirs = {p["pid"] for p in held if not self._in_vllms_tree(p["pid"], ours)}
            meta["foreign_pids"] = sorted(theirs)
            for device in self._devices or []:
                labels = make_labels({"gpu": str(device.index), "uuid": device.uuid})
                on_it = [p for p in held if p["gpu"] == device.index]
                foreign = [p for p in on_it if p["pid"] in theirs]
                samples[("gpu_foreign_compute_processes", labels)] = float(len(foreign))
                if all("sm_ratio" in p for p in on_it):  # NVML samples per process here: what the others' kernels took
                    samples[("gpu_foreign_sm_ratio", labels)] = foreign_sm_ratio(foreign)
        reading = Reading(
            GPU_SOURCE,
            timestamp,
            True,
            samples,
            error="; ".join(problems) or None,
            error_reason="nvml_error" if problems else None,
            duration_seconds=time.perf_counter() - start,
            meta=meta,
        )
        self._log_state(reading)
        return reading

    def _sm_shares(self, device: _Device) -> dict[int, float] | None:
        """pid -> its mean share of the GPU's SM time over NVML's utilisation samples since the last call (a pid with no
        sample ran no kernel: a context held open computes nothing); None where NVML gives no per-process samples here
        (an old driver, a GPU that does not keep them)."""
        read = getattr(self._nvml, "nvmlDeviceGetProcessUtilization", None)
        if read is None:
            return None
        try:
            samples = self._field("process_utilization", partial(read, device.handle, device.process_samples_seen))
        except self._nvml.NVMLError_NotFound:  # no process ran a kernel since the last call
            return {}
        except self._nvml.NVMLError:
            return None
        if samples is None:  # not supported
            return None
        by_pid: dict[int, list[float]] = {}
        for sample in samples:
            device.process_samples_seen = max(device.process_samples_seen, int(sample.timeStamp))
            by_pid.setdefault(int(sample.pid), []).append(min(100.0, max(0.0, float(sample.smUtil))) / 100)
        return {pid: sum(shares) / len(shares) for pid, shares in by_pid.items()}

    def _in_vllms_tree(self, pid: int, ours: set[int]) -> bool:
        """Whether a process holding the GPU is one of vLLM's or a descendant of one (a helper vLLM started computes for
        it, not against it). Asked again only when NVML's list is read again."""
        known = self._lineage.get(pid)
        if known is None:
            try:
                known = pid in ours or any(parent.pid in ours for parent in psutil.Process(pid).parents())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                known = pid in ours
            self._lineage[pid] = known
        return known

    def _compute_processes(self) -> list[ComputeProcess]:
        """The processes holding memory on the watched GPUs (NVML's pids: the host's, which match the sidecar's only
        where it shares the host's process namespace), read every PROCESS_LIST_SECONDS: who holds a GPU an orphaned
        engine core keeps."""
        if self._processes_at is not None and self.clock() - self._processes_at < PROCESS_LIST_SECONDS:
            return self._processes
        listed: list[ComputeProcess] = []
        for device in self._devices or []:
            try:
                running = self._field("compute_processes", partial(self._nvml.nvmlDeviceGetComputeRunningProcesses, device.handle)) or []
            except self._nvml.NVMLError:
                continue
            shares = self._sm_shares(device)
            for process in running[:MAX_COMPUTE_PROCESSES]:
                used = getattr(process, "usedGpuMemory", None)
                entry = ComputeProcess(gpu=device.index, pid=int(process.pid), used_bytes=float(used) if isinstance(used, int) else None)
                if shares is not None:
                    entry["sm_ratio"] = shares.get(int(process.pid), 0.0)
                listed.append(entry)
        self._processes, self._processes_at = listed, self.clock()
        self._lineage = {}
        return listed

    def _read_all(self) -> tuple[dict[SeriesKey, float], list[str]]:
        samples: dict[SeriesKey, float] = {}
        problems: list[str] = []
        for device in self._devices or []:
            try:
                self._read_device(device, samples)
            except self._nvml.NVMLError as exc:
                problems.append(f"GPU {device.index}: {exc}")
        with self._xid_lock:
            for (index, xid), count in self._xid_counts.items():
                samples[("gpu_xid_errors_total", make_labels({"gpu": str(index), "xid": str(xid)}))] = float(count)
        return samples, problems

    def _field(self, name: str, read: Callable[[], Any]) -> Any:
        """One NVML read; NOT_SUPPORTED (and functions missing from old drivers) means 'skip'."""
        if name in self._unsupported:
            return None
        nvml = self._nvml
        try:
            return read()
        except nvml.NVMLError_NotSupported:
            self._unsupported.add(name)
        except nvml.NVMLError_FunctionNotFound:
            self._unsupported.add(name)
        return None

    def _read_device(self, device: _Device, out: dict[SeriesKey, float]) -> None:
        nvml = self._nvml
        h = device.handle

        def put(name: str, value: float | None, reason: str = "") -> None:
            if value is None:
                return
            labels = device.labels.get((name, reason))
            if labels is None:
                extra = {"reason": reason} if reason else {}
                labels = device.labels[(name, reason)] = make_labels({"gpu": str(device.index), "uuid": device.uuid, **extra})
            out[(name, labels)] = float(value)

        now = time.monotonic()
        if now - device.slow_time >= SLOW_REFRESH_SECONDS:
            memory = self._field("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2))
            limit = self._field("power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
            device.slow = {
                "gpu_memory_used_bytes": None if memory is None else memory.used,
                "gpu_memory_total_bytes": None if memory is None else memory.total,
                "gpu_power_limit_watts": None if limit is None else limit / 1000,
                "gpu_temperature_celsius": self._field("temperature", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
                "gpu_pcie_link_generation_max": self._field("pcie_gen_max", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                "gpu_pcie_link_width_max": self._field("pcie_width_max", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
                "gpu_pcie_replay_errors_total": self._field("pcie_replay", lambda: nvml.nvmlDeviceGetPcieReplayCounter(h)),
            }
            device.slow_time = now
        for name, value in device.slow.items():
            put(name, value)
        util = self._field("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            put("gpu_utilization_ratio", util.gpu / 100)
            put("gpu_memory_activity_ratio", util.memory / 100)
        power = self._field("power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        put("gpu_power_watts", None if power is None else power / 1000)
        sm_clock = self._field("sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        put("gpu_sm_clock_hertz", None if sm_clock is None else sm_clock * 1e6)
        mem_clock = self._field("memory_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
        put("gpu_memory_clock_hertz", None if mem_clock is None else mem_clock * 1e6)
        reasons = self._field("clock_event_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is not None:
            for reason, bit in CLOCK_EVENT_REASONS.items():
                put("gpu_clock_event_active", 1.0 if reasons & bit else 0.0, reason)
        put("gpu_pcie_link_generation", self._field("pcie_gen", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)))
        put("gpu_pcie_link_width", self._field("pcie_width", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h)))
        put("gpu_gpm_supported", 1.0 if device.gpm else 0.0)
        if device.gpm:
            self._read_gpm(device, put)
        else:
            # Without GPM, PCIe throughput comes from a call that blocks ~20 ms per direction.
            tx = self._field("pcie_throughput", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES))
            rx = self._field("pcie_throughput", lambda: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES))
            put("gpu_pcie_tx_bytes_per_second", None if tx is None else tx * 1024)
            put("gpu_pcie_rx_bytes_per_second", None if rx is None else rx * 1024)

    def _read_gpm(self, device: _Device, put: Callable[..., None]) -> None:
        """Tick-to-tick GPM: the previous tick's sample is the start of this window."""
        nvml = self._nvml
        now = time.monotonic()
        previous, current = device.gpm_samples
        if device.gpm_previous_time is not None and now - device.gpm_previous_time < GPM_MIN_INTERVAL_SECONDS:
            return
        nvml.nvmlGpmSampleGet(device.handle, current)
        wanted = [
            (nvml.NVML_GPM_METRIC_SM_UTIL, "gpu_sm_active_ratio", 0.01),
            (nvml.NVML_GPM_METRIC_SM_OCCUPANCY, "gpu_sm_occupancy_ratio", 0.01),
            (nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "gpu_tensor_active_ratio", 0.01),
            (nvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "gpu_dram_bandwidth_utilization_ratio", 0.01),
            (nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "gpu_pcie_tx_bytes_per_second", MIB),  # GPM says MiB/s
            (nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "gpu_pcie_rx_bytes_per_second", MIB),
        ]
        if device.nvlink:  # every NVLink of the GPU together: tensor parallelism's all-reduces
            wanted += [
                (nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "gpu_nvlink_tx_bytes_per_second", MIB),
                (nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "gpu_nvlink_rx_bytes_per_second", MIB),
            ]
        if device.gpm_previous_time is not None:
            request = device.gpm_request
            if request is None:
                request = device.gpm_request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = nvml.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = len(wanted)
                for i, (metric_id, _, _) in enumerate(wanted):
                    request.metrics[i].metricId = metric_id
            request.sample1 = previous
            request.sample2 = current
            nvml.nvmlGpmMetricsGet(request)
            for i, (_, name, scale) in enumerate(wanted):
                metric = request.metrics[i]
                if metric.nvmlReturn == nvml.NVML_SUCCESS:
                    put(name, max(0.0, metric.value * scale))
        device.gpm_samples = [current, previous]
        device.gpm_previous_time = now

    def _log_state(self, reading: Reading) -> None:
        state = reading.error_reason or "ok"
        if state != self._last_state:
            if reading.ok and not reading.error:
                log.info("GPU source: reading %d GPU(s)", len(reading.gpu_meta().get("gpus", [])))
            else:
                log.warning("GPU source: %s [%s]", reading.error, state)
            self._last_state = state


class _Unavailable(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def build(config: Config, clock: Clock, targets: ProcessTargets) -> SourceLoop:
    """NVML (and GPM) on a worker thread every gpu_interval_seconds (NVML blocks), or dcgm-exporter's page where
    gpu_source is dcgm."""
    options = config.options(GpuOptions)
    if options.gpu_source == "dcgm":
        assert options.dcgm_url is not None  # GpuOptions requires it
        dcgm = DcgmSource(options.dcgm_url, config.scrape_timeout_seconds, clock, max_page_bytes=config.max_page_bytes)
        return SourceLoop(GPU_SOURCE, options.gpu_interval_seconds, dcgm.collect, dcgm.close)
    source = GpuSource(options.gpus, targets, options.gpm, clock, gpus_file=options.gpus_file)

    async def close() -> None:
        source.close()

    return SourceLoop(GPU_SOURCE, options.gpu_interval_seconds, partial(asyncio.to_thread, CPU.run, "gpu_collect", source.collect), close)
