"""GPU source error paths that real hardware will not produce on demand (a field NOT_SUPPORTED,
a GPU lost mid-run, the library missing). A minimal stand-in for pynvml replaces the module;
everything the happy path reads is proven on the H200 (tests/gpu, tests/data/gpu-h200-*)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from vllm_triage.model import ProcessTargets
from vllm_triage.sources.gpu import GpuSource, parse_visible_devices


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


class GpuLost(NVMLError):
    pass


class NotFound(NVMLError):
    pass


def fake_nvml(lost: set[int] | None = None, unsupported: set[str] = frozenset(), count: int = 2) -> types.ModuleType:
    lost = lost if lost is not None else set()
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVMLError_NotSupported = NotSupported
    m.NVMLError_NotFound = NotFound
    m.NVMLError_FunctionNotFound = type("FunctionNotFound", (NVMLError,), {})
    m.nvmlMemory_v2 = 2
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 1, 2
    m.nvmlEventTypeXidCriticalError = 8

    def guard(name, index):
        if index in lost:
            raise GpuLost("GPU is lost")
        if name in unsupported:
            raise NotSupported("Not Supported")

    m.nvmlInit = lambda: None
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}"
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlGpmQueryDeviceSupport = lambda h: SimpleNamespace(isSupportedDevice=0)

    def reading(name, value):
        def call(h, *args, **kwargs):
            guard(name, h)
            return value

        return call

    m.nvmlDeviceGetUtilizationRates = reading("utilization", SimpleNamespace(gpu=50, memory=20))
    m.nvmlDeviceGetMemoryInfo = reading("memory", SimpleNamespace(used=10, total=100))
    m.nvmlDeviceGetPowerUsage = reading("power", 300000)
    m.nvmlDeviceGetEnforcedPowerLimit = reading("power_limit", 700000)
    m.nvmlDeviceGetTemperature = reading("temperature", 40)
    m.nvmlDeviceGetClockInfo = reading("clock", 1500)
    m.nvmlDeviceGetCurrentClocksEventReasons = reading("clock_event_reasons", 0x4)
    m.nvmlDeviceGetCurrPcieLinkGeneration = reading("pcie", 5)
    m.nvmlDeviceGetMaxPcieLinkGeneration = reading("pcie", 5)
    m.nvmlDeviceGetCurrPcieLinkWidth = reading("pcie", 16)
    m.nvmlDeviceGetMaxPcieLinkWidth = reading("pcie", 16)
    m.nvmlDeviceGetPcieReplayCounter = reading("pcie_replay", 0)
    m.nvmlDeviceGetPcieThroughput = reading("pcie_throughput", 1000)
    m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
    m.nvmlDeviceGetComputeRunningProcesses = reading("processes", [SimpleNamespace(pid=4242, usedGpuMemory=70 * 2**30)])

    def no_events():
        raise NVMLError("events not supported")

    m.nvmlEventSetCreate = no_events
    return m


@pytest.fixture
def nvml(monkeypatch):
    def install(**kwargs):
        module = fake_nvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def series(reading, name):
    return {dict(labels)["gpu"]: value for (n, labels), value in reading.samples.items() if n == name}


def test_unsupported_field_is_skipped_not_an_error(nvml):
    nvml(unsupported={"power", "pcie_replay"})
    source = GpuSource()
    reading = source.collect()
    assert reading.ok and reading.error is None
    assert series(reading, "gpu_power_watts") == {}
    assert series(reading, "gpu_utilization_ratio") == {"0": 0.5, "1": 0.5}
    assert "power" in reading.meta["unsupported"]
    assert series(reading, "gpu_gpm_supported") == {"0": 0.0, "1": 0.0}  # no GPM: says so
    assert series(reading, "gpu_pcie_tx_bytes_per_second") == {"0": 1024000.0, "1": 1024000.0}  # the NVML fallback
    assert reading.meta["compute_processes"][0] == {"gpu": 0, "pid": 4242, "used_bytes": 70 * 2**30}  # who holds each GPU's memory


def test_a_program_started_by_vllm_is_vllms_and_another_is_foreign_on_real_processes(nvml):
    """NVML lists three processes on GPU 0: vLLM's engine core, a process it started, and an unrelated program. Only
    the last is another program (gpu_shared's control: work inside vLLM's own tree gives no verdict)."""
    vllm = subprocess.Popen(["bash", "-c", "sleep 30 & exec sleep 30"])  # the engine core, with a child of its own
    other = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while not (children := psutil.Process(vllm.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        helper = children[0].pid
        module = nvml(count=1)
        listed = [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in (vllm.pid, helper, other.pid)]
        module.nvmlDeviceGetComputeRunningProcesses = lambda handle: listed
        asked = []

        def samples(handle, since):  # NVML's per-process utilisation: the samples newer than `since` (us)
            asked.append(since)
            if since:
                raise NotFound("Not Found")  # no process ran a kernel since
            return [SimpleNamespace(pid=other.pid, timeStamp=t, smUtil=sm) for t, sm in ((1_000, 40), (2_000, 50))]

        module.nvmlDeviceGetProcessUtilization = samples
        source = GpuSource(targets=ProcessTargets([("engine_core", vllm.pid)]))
        reading = source.collect()
        assert series(reading, "gpu_foreign_compute_processes") == {"0": 1.0}
        assert reading.meta["foreign_pids"] == [other.pid]
        shares = {p["pid"]: p.get("sm_ratio") for p in reading.meta["compute_processes"]}
        assert shares == {vllm.pid: 0.0, helper: 0.0, other.pid: 0.45}  # NVML kept samples of the other program only
        assert series(reading, "gpu_foreign_sm_ratio") == {"0": 0.45}
        source._processes_at = None  # the list is read again (every 10 s)
        again = source.collect()
        assert asked == [0, 2_000] and again.meta["compute_processes"][2]["sm_ratio"] == 0.0  # no kernel since: not carried over
        assert series(again, "gpu_foreign_sm_ratio") == {"0": 0.0}  # a context held open computes nothing

        module.nvmlDeviceGetProcessUtilization = lambda handle, since: (_ for _ in ()).throw(NotSupported("Not Supported"))
        blind = GpuSource(targets=ProcessTargets([("engine_core", vllm.pid)]))
        reading = blind.collect()  # no per-process samples on this GPU: who holds it is known, what it computes is not
        assert series(reading, "gpu_foreign_compute_processes") == {"0": 1.0} and "gpu_foreign_sm_ratio" not in {n for n, _ in reading.samples}
        assert all("sm_ratio" not in p for p in reading.meta["compute_processes"])
    finally:
        for process in (vllm, other):
            process.kill()
            process.wait()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_nvlink_is_read_only_where_a_link_is_up(nvml):
    """The lent H200 (one GPU of a VM) answered not supported for every NVLink's state while GPM read its NVLink
    throughput as 0: such a GPU says nvlink false and gets no NVLink series (absent: no link; 0: an idle one)."""
    module = nvml()
    module.NVML_FEATURE_ENABLED, module.NVML_NVLINK_MAX_LINKS = 1, 18

    def state(handle, link):
        if handle == 0:
            raise NotSupported("Not Supported")
        return 1 if link == 3 else 0

    module.nvmlDeviceGetNvLinkState = state
    reading = GpuSource().collect()
    assert [(g["gpu"], g["nvlink"]) for g in reading.meta["gpus"]] == [(0, False), (1, True)]
    assert not [name for name, _ in reading.samples if "nvlink" in name]  # no GPM on the fake: nothing read, nothing made up


def test_a_lost_gpu_is_reported_and_the_others_still_read(nvml):
    module = nvml()
    source = GpuSource()
    assert source.collect().ok

    def utilization(handle):
        if handle == 1:
            raise GpuLost("GPU is lost")
        return SimpleNamespace(gpu=90, memory=1)

    module.nvmlDeviceGetUtilizationRates = utilization
    reading = source.collect()
    assert reading.ok and reading.error_reason == "nvml_error"
    assert "GPU 1" in (reading.error or "") and "lost" in (reading.error or "")
    assert series(reading, "gpu_utilization_ratio") == {"0": 0.9}


def test_missing_library_is_one_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    reading = GpuSource().collect()
    assert not reading.ok and reading.error_reason == "no_library"
    assert "nvidia-ml-py" in (reading.error or "")


def test_nvml_that_cannot_start_is_asked_again_after_a_growing_wait_and_a_late_driver_is_picked_up(nvml):
    """A host without a driver keeps reporting it at every collection, but loads the library ever more rarely; a
    driver that comes up later (a GPU operator installing it) is found within a minute."""
    module = nvml()
    attempts = []

    def no_driver():
        attempts.append(now[0])
        raise NVMLError("Driver Not Loaded")

    module.nvmlInit = no_driver
    now = [0.0]
    source = GpuSource(clock=lambda: now[0])
    for second in range(0, 200):
        now[0] = float(second)
        reading = source.collect()
        assert not reading.ok and reading.error_reason == "no_driver" and "Driver Not Loaded" in (reading.error or "")
    assert attempts == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 63.0, 123.0, 183.0]  # then once a minute

    module.nvmlInit = lambda: None  # the driver is there now
    for second in range(200, 244):
        now[0] = float(second)
        reading = source.collect()
        assert reading.ok == (second >= 243)
    assert reading.ok and series(reading, "gpu_utilization_ratio") == {"0": 0.5, "1": 0.5}


def test_selection_by_config_index_or_uuid(nvml):
    nvml(count=4)
    reading = GpuSource(selection=["2", "GPU-fake-3"]).collect()
    assert set(series(reading, "gpu_utilization_ratio")) == {"2", "3"}
    assert reading.meta["selection"] == "config"


def test_visible_devices_parsing():
    assert parse_visible_devices("0,2") == ["0", "2"]
    assert parse_visible_devices("all") is None
    assert parse_visible_devices("none") == []
    assert parse_visible_devices("GPU-abc, GPU-def") == ["GPU-abc", "GPU-def"]


def test_selection_follows_the_vllm_process_cuda_visible_devices(nvml):
    """A real process with CUDA_VISIBLE_DEVICES set, read through /proc as in a shared PID namespace."""
    import os
    import subprocess

    nvml(count=4)
    worker = subprocess.Popen(["sleep", "30"], env={**os.environ, "CUDA_VISIBLE_DEVICES": "1,3"})
    try:
        deadline = time.time() + 5
        while psutil.Process(worker.pid).cmdline()[:1] != ["sleep"] and time.time() < deadline:
            time.sleep(0.01)  # until exec: the forked child still carries its parent's environment
        reading = GpuSource(targets=ProcessTargets([("worker", worker.pid)])).collect()
    finally:
        worker.kill()
    assert set(series(reading, "gpu_utilization_ratio")) == {"1", "3"}
    assert reading.meta["selection"] == f"CUDA_VISIBLE_DEVICES=1,3 of vLLM pid {worker.pid}"


def test_selection_from_the_file_vllms_container_writes(nvml, tmp_path):
    nvml(count=4)
    listed = tmp_path / "gpus"
    listed.write_text("GPU-fake-1\nGPU-fake-3\n")  # as nvidia-smi --query-gpu=uuid --format=csv,noheader prints them
    reading = GpuSource(gpus_file=str(listed)).collect()
    assert set(series(reading, "gpu_utilization_ratio")) == {"1", "3"}
    assert reading.meta["selection"] == f"{listed}, written by vLLM's container"


def test_a_sidecar_started_before_vllm_narrows_to_vllms_gpus_once_they_are_known(nvml, tmp_path):
    """A native sidecar starts before vLLM's container: first every GPU, provisionally; then vLLM's."""
    nvml(count=4)
    clock = {"t": 1000.0}
    listed = tmp_path / "gpus"
    source = GpuSource(gpus_file=str(listed), clock=lambda: clock["t"])
    first = source.collect()
    assert set(series(first, "gpu_utilization_ratio")) == {"0", "1", "2", "3"}
    assert first.meta["selection"].startswith("all visible GPUs")
    listed.write_text("GPU-fake-2\n")
    clock["t"] += 10
    assert set(series(source.collect(), "gpu_utilization_ratio")) == {"0", "1", "2", "3"}  # not looked again yet
    clock["t"] += 25
    later = source.collect()
    assert set(series(later, "gpu_utilization_ratio")) == {"2"}
    assert later.meta["selection"].endswith("written by vLLM's container")
    listed.unlink()
    clock["t"] += 60
    assert set(series(source.collect(), "gpu_utilization_ratio")) == {"2"}  # a decided choice stays


def test_what_nvmls_start_frees_goes_back_to_the_system():
    """libnvidia-ml's start mallocs and frees megabytes; glibc keeps freed heap pages beneath a block still held, and
    Python never asks malloc for them again, so the sidecar would carry them for its whole life (about 10 MB on an H100).
    Here the stand-in's nvmlInit leaves 32 MB freed that way, in a fresh interpreter."""
    script = textwrap.dedent(
        """
        import sys
        import psutil
        sys.path.insert(0, sys.argv[1])
        import test_gpu_source_errors as here
        module = here.fake_nvml(count=1)
        kept = []
        def init():
            scratch = [bytes(4000) + bytes([i % 256]) for i in range(8000)]
            kept.extend(bytes(4000) for _ in range(10))
            del scratch
        module.nvmlInit = init
        sys.modules["pynvml"] = module
        from vllm_triage.sources.gpu import GpuSource
        before = psutil.Process().memory_info().rss
        assert GpuSource().collect().ok
        print((psutil.Process().memory_info().rss - before) / 2**20)
        """
    )
    grown_mb = float(subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent)], capture_output=True, text=True, check=True).stdout)
    assert grown_mb < 8, f"the sidecar kept {grown_mb:.0f} MB that NVML's start had freed"
