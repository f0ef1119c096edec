"""Layer 3 (GPU) from NVIDIA's dcgm-exporter instead of NVML: where the sidecar cannot see the GPUs itself
but the node runs dcgm-exporter (gpu_source: dcgm). Its fields become the GPU source's own readings, so the
GPU signals and conditions work unchanged; the GPUs are the ones dcgm-exporter attributes to this pod.

The profiling fields (DCGM_FI_PROF_*) are what tells "busy" from "computing". dcgm-exporter's default
counters list comments DCGM_FI_PROF_SM_ACTIVE out: add it (and SM_OCCUPANCY, PIPE_TENSOR_ACTIVE,
DRAM_ACTIVE, PCIE_TX/RX_BYTES) to the counters CSV; without it the SM-activity conditions fall back to
util.gpu, as on a GPU without GPM.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ..model import CLOCK_EVENT_REASONS, GPU_SOURCE, GpuEntry, GpuMeta, Reading, SeriesKey, make_labels
from . import http_failure, read_bounded, shortened

log = logging.getLogger(__name__)

# dcgm-exporter field -> (the GPU source's sample, scale to its unit)
FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_activity_ratio", 0.01),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpu_sm_active_ratio", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gpu_sm_occupancy_ratio", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpu_tensor_active_ratio", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpu_dram_bandwidth_utilization_ratio", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpu_pcie_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpu_pcie_rx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gpu_nvlink_tx_bytes_per_second", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gpu_nvlink_rx_bytes_per_second", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_hertz", 1e6),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpu_memory_clock_hertz", 1e6),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gpu_power_limit_watts", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", 1.0),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", 1024 * 1024),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_errors_total", 1.0),
}
MEMORY_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")  # MiB; their sum is the total
CLOCK_EVENTS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")  # the bitmask, new and old name
PROFILING = "DCGM_FI_PROF_"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"


def _blank(value: float) -> bool:
    """DCGM's "no value" sentinels: int32 and int64 blanks (the maximum minus a code) and the fp64 blank."""
    return 2_147_483_632 <= value <= 2_147_483_647 or value >= 9.2e18 or value == 140_737_488_355_328.0


MAX_GPU_INDEX_DIGITS = 4
MAX_LABEL_CHARS = 128  # a UUID or a model name; a 2 MB label would reach every log line and /diagnosis


def dcgm_readings(series: Iterable[tuple[str, dict[str, str], float]]) -> tuple[dict[SeriesKey, float], list[GpuEntry]]:
    """The GPU source's samples, and its meta's GPU list, from dcgm-exporter's series (name, labels, value)."""
    samples: dict[SeriesKey, float] = {}
    gpus: dict[str, GpuEntry] = {}
    memory: dict[str, float] = {}
    for name, labels, raw in series:
        index = labels.get("gpu")
        try:
            value = float(raw)  # the parser may hand a 400-digit integer through as an int
        except OverflowError:
            continue
        # a GPU index is ASCII digits (str.isdigit also takes "²", which int() refuses), of a sane length
        if index is None or not (index.isascii() and index.isdigit() and len(index) <= MAX_GPU_INDEX_DIGITS) or not math.isfinite(value) or _blank(value):
            continue
        gpu = gpus.setdefault(
            index, GpuEntry(gpu=int(index), uuid=labels.get("UUID", "")[:MAX_LABEL_CHARS], name=labels.get("modelName", "")[:MAX_LABEL_CHARS], gpm=False)
        )
        base = {"gpu": index, "uuid": gpu["uuid"]}
        if name.startswith(PROFILING):
            gpu["gpm"] = True  # DCGM's profiling counters are GPM's, read by the host engine
        if name in MEMORY_PARTS:
            memory[index] = memory.get(index, 0.0) + value
        if name in FIELDS:
            sample, scale = FIELDS[name]
            samples[(sample, make_labels(base))] = value * scale
        elif name in CLOCK_EVENTS:
            if not 0 <= value < 2**63 or value != int(value):  # a bitmask, nothing else: -1 or 1e300 would set every reason
                continue
            for reason, bit in CLOCK_EVENT_REASONS.items():
                samples[("gpu_clock_event_active", make_labels({**base, "reason": reason}))] = 1.0 if int(value) & bit else 0.0
    for index, mebibytes in memory.items():
        samples[("gpu_memory_total_bytes", make_labels({"gpu": index, "uuid": gpus[index]["uuid"]}))] = mebibytes * 1024 * 1024
    for index, gpu in gpus.items():
        samples[("gpu_gpm_supported", make_labels({"gpu": index, "uuid": gpu["uuid"]}))] = 1.0 if gpu["gpm"] else 0.0
    # a value that overflows once scaled (a clock of 1e303 MHz, memory parts summing past 1e308) is no reading
    return {key: v for key, v in samples.items() if math.isfinite(v)}, sorted(gpus.values(), key=lambda g: str(g["gpu"]))


class DcgmSource:
    """Scrapes dcgm-exporter's /metrics and keeps the GPUs it attributes to this pod (POD_NAME and
    POD_NAMESPACE from the downward API; every GPU on the page when they are not set)."""

    def __init__(
        self,
        url: str,
        timeout_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
        pod: str | None = None,
        namespace: str | None = None,
        max_page_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.url = url
        self.max_page_bytes = max_page_bytes
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.clock = clock
        self.pod = pod if pod is not None else os.environ.get("POD_NAME")
        self.namespace = namespace if namespace is not None else os.environ.get("POD_NAMESPACE")
        self._session: aiohttp.ClientSession | None = None
        self._last_state: str | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def collect(self) -> Reading:
        start = time.perf_counter()
        timestamp = self.clock()
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=self.timeout)
            async with self._session.get(self.url) as response:
                if response.status != 200:
                    return self._failed(timestamp, start, "http_status", f"dcgm-exporter at {self.url} answered {response.status}")
                body = await read_bounded(response.content, self.max_page_bytes)
                if body is None:
                    return self._failed(
                        timestamp, start, "too_large", f"dcgm-exporter's page at {self.url} is over {self.max_page_bytes} bytes (max_page_bytes)"
                    )
                text = body.decode("utf-8", errors="replace")
        except (aiohttp.ClientError, TimeoutError) as error:
            return self._failed(timestamp, start, "connect", f"cannot read dcgm-exporter at {self.url}: {http_failure(error)}")
        try:
            series = [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith("DCGM_FI_")]
        except ValueError as error:
            return self._failed(timestamp, start, "parse", f"dcgm-exporter at {self.url} sent a page that does not parse: {shortened(error)}")
        mine = [s for s in series if self._ours(s[1])]
        if not mine:
            who = f"pod {self.namespace}/{self.pod}" if self.pod else "any GPU"
            return self._failed(timestamp, start, "no_gpu", f"dcgm-exporter at {self.url} lists no GPU for {who} (its Kubernetes pod mapping must be on)")
        samples, gpus = dcgm_readings(mine)
        meta = GpuMeta(gpus=gpus, selection=f"dcgm-exporter's GPUs of pod {self.pod}" if self.pod else "every GPU dcgm-exporter lists")
        if not any(name == SM_ACTIVE for name, _, _ in mine):
            meta["unsupported"] = [f"{SM_ACTIVE} (commented out in dcgm-exporter's default counters: enable it, and the other DCGM_FI_PROF_ fields)"]
        reading = Reading(GPU_SOURCE, timestamp, True, samples, duration_seconds=time.perf_counter() - start, meta=meta)
        self._log_state("ok", f"GPU source (dcgm-exporter at {self.url}): reading {len(gpus)} GPU(s); " + "; ".join(meta.get("unsupported", [])))
        return reading

    def _ours(self, labels: dict[str, str]) -> bool:
        if not self.pod:
            return True
        return labels.get("pod") == self.pod and (not self.namespace or labels.get("namespace") == self.namespace)

    def _failed(self, timestamp: float, start: float, reason: str, message: str) -> Reading:
        self._log_state(reason, message)
        return Reading(GPU_SOURCE, timestamp, False, error=message, error_reason=reason, duration_seconds=time.perf_counter() - start)

    def _log_state(self, state: str, message: str) -> None:
        if state != self._last_state:
            (log.info if state == "ok" else log.warning)("%s", message)
            self._last_state = state
