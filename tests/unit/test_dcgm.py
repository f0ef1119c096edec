"""The GPU layer from dcgm-exporter (gpu_source: dcgm): a page in the format dcgm-exporter's documentation
gives (tests/data/dcgm-exporter-h200.metrics.txt: two H200s of one node, GPU 0 mapped to pod llm/vllm-0,
GPU 1 to another pod), served over HTTP, read into the GPU source's readings and judged by the same
conditions."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from aiohttp import web
from vllm_triage.config_loader import load
from vllm_triage.options import ConfigError
from vllm_triage.pipeline import Pipeline
from vllm_triage.sources.dcgm import DcgmSource

from harness.vllm_server import free_port

from .pages import Counters, page, reading

PAGE = (Path(__file__).resolve().parents[1] / "data" / "dcgm-exporter-h200.metrics.txt").read_text()
WITHOUT_SM_ACTIVE = "".join(line + "\n" for line in PAGE.splitlines() if "DCGM_FI_PROF_SM_ACTIVE" not in line)


def collect(
    pages: list[str], pod: str | None = "vllm-0", namespace: str | None = "llm", max_page_bytes: int = 8 * 1024 * 1024, piece_bytes: int | None = None
) -> list:
    """Serve each page in turn from a real HTTP server and collect it with DcgmSource; with `piece_bytes`, the page is
    written and flushed in pieces of that size, a moment apart (as Go's net/http flushes dcgm-exporter's page)."""

    async def body() -> list:
        served = iter(pages)

        async def metrics(request: web.Request) -> web.StreamResponse:
            text = next(served)
            if piece_bytes is None:
                return web.Response(text=text, content_type="text/plain")
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            data = text.encode()
            for offset in range(0, len(data), piece_bytes):
                await response.write(data[offset : offset + piece_bytes])
                await asyncio.sleep(0.002)
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        clock = iter(range(0, 1000, 2)).__next__
        source = DcgmSource(f"http://127.0.0.1:{port}/metrics", clock=clock, pod=pod, namespace=namespace, max_page_bytes=max_page_bytes)
        try:
            return [await source.collect() for _ in pages]
        finally:
            await source.close()
            await runner.cleanup()

    return asyncio.run(body())


def values(reading) -> dict[str, float]:
    return {name + ("/" + dict(labels)["reason"] if name == "gpu_clock_event_active" else ""): v for (name, labels), v in reading.samples.items()}


def test_the_pods_gpu_is_read_in_the_gpu_sources_units():
    (r,) = collect([PAGE])
    assert r.ok, r.error
    got = values(r)
    assert {dict(labels)["gpu"] for _, labels in r.samples} == {"0"}  # GPU 1 belongs to research/finetune-3
    assert got["gpu_utilization_ratio"] == 0.98 and got["gpu_sm_active_ratio"] == 0.112
    assert got["gpu_sm_clock_hertz"] == 1980e6 and got["gpu_pcie_rx_bytes_per_second"] == 2202345918
    assert got["gpu_memory_used_bytes"] == 77245 * 2**20 and got["gpu_memory_total_bytes"] == (77245 + 65011 + 551) * 2**20
    assert got["gpu_clock_event_active/sw_thermal_slowdown"] == 1.0 and got["gpu_clock_event_active/gpu_idle"] == 0.0
    assert "gpu_memory_temperature_celsius" not in got  # DCGM's blank (9223372036854775794) is no reading
    assert r.meta["gpus"] == [{"gpu": 0, "uuid": "GPU-76276492-0af5-efea-92e7-e81a7e3875e9", "name": "NVIDIA H200", "gpm": True}]


def test_dcgm_readings_give_the_same_gpu_verdicts_as_nvml():
    """util.gpu 0.98 with SMs at 0.11 for a minute: gpu_busy_not_computing, as from NVML's GPM."""
    config = load(env={}, flags={"gpu_source": "dcgm", "dcgm_url": "http://127.0.0.1:9400/metrics"})
    config = dataclasses.replace(config, conditions={k: dataclasses.replace(s, for_seconds=0.0) for k, s in config.conditions.items()})
    readings = collect([PAGE] * 20)
    pipeline = Pipeline(config, readings)
    c = Counters()
    for r in readings:
        c.generation_tokens += 64
        pipeline.feed(dataclasses.replace(r, timestamp=float(r.timestamp)))
        pipeline.feed(reading(float(r.timestamp), page(4, 0, 0.3, c)))
    snapshot = pipeline.evaluate(38.0)
    busy = next(v for v in snapshot.verdicts if v.condition == "gpu_busy_not_computing")
    assert busy.state == "active", [e.text for e in busy.evidence]
    assert snapshot.discovery.gpu_peak["model"] == "H200"  # modelName gives the peaks efficiency is measured against


def test_without_sm_active_it_says_what_to_enable():
    (r,) = collect([WITHOUT_SM_ACTIVE])
    assert r.ok and "gpu_sm_active_ratio" not in values(r)
    assert "commented out in dcgm-exporter's default counters" in r.meta["unsupported"][0]


def test_no_gpu_for_this_pod_or_no_exporter_is_a_clear_error():
    (r,) = collect([PAGE], pod="other-pod")
    assert not r.ok and r.error_reason == "no_gpu" and "pod llm/other-pod" in (r.error or "") and "mapping" in (r.error or "")
    (every,) = collect([PAGE], pod="", namespace="")  # no downward API: every GPU the page lists
    assert {dict(labels)["gpu"] for _, labels in every.samples} == {"0", "1"}

    async def unreachable():
        source = DcgmSource(f"http://127.0.0.1:{free_port()}/metrics", pod="vllm-0")
        try:
            return await source.collect()
        finally:
            await source.close()

    down = asyncio.run(unreachable())
    assert not down.ok and down.error_reason == "connect" and "cannot read dcgm-exporter" in (down.error or "")


def test_gpu_source_dcgm_needs_its_url():
    try:
        load(env={}, flags={"gpu_source": "dcgm"})
    except ConfigError as error:
        assert "dcgm_url" in str(error)
    else:
        raise AssertionError("gpu_source: dcgm without dcgm_url was accepted")


def test_a_hostile_page_is_refused_or_cleaned_not_crashed_on():
    nan = PAGE.replace(" 0.112\n", " NaN\n")  # GPU 0's SM activity
    assert nan != PAGE
    cleaned, garbled = collect([nan, 'DCGM_FI_DEV_GPU_UTIL{gpu="0" 5\n'])
    assert cleaned.ok and "gpu_sm_active_ratio" not in values(cleaned)  # NaN is no reading
    assert not garbled.ok and garbled.error_reason == "parse"

    (big,) = collect([PAGE * 100], max_page_bytes=100_000)
    assert not big.ok and big.error_reason == "too_large" and "max_page_bytes" in (big.error or "")

    # a 2 MB label on a line that does not parse: the parser quotes the line; the error (log, /diagnosis) does not carry it
    (huge,) = collect([PAGE + 'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="' + "x" * 2_000_000 + '" 5\n'], max_page_bytes=4_000_000)
    assert not huge.ok and huge.error_reason == "parse" and len(huge.error or "") < 600, len(huge.error or "")


def test_a_page_that_arrives_in_pieces_is_read_whole():
    """dcgm-exporter (Go's net/http) flushes its page every 4 KiB: the source reads every piece, for a node's page and
    for one of 64 GPUs."""
    (r,) = collect([PAGE], piece_bytes=4096)
    assert r.ok and values(r)["gpu_sm_active_ratio"] == 0.112, r.error
    lines = [line for line in PAGE.splitlines() if line.startswith("DCGM_FI_") and 'gpu="1"' in line]
    many = PAGE + "".join(line.replace('gpu="1"', f'gpu="{g}"').replace("GPU-", f"GPU-{g:02d}") + "\n" for g in range(2, 64) for line in lines)
    assert len(many.encode()) > 100_000
    (r,) = collect([many], piece_bytes=4096)
    assert r.ok, r.error
    (r,) = collect([many], piece_bytes=4096, max_page_bytes=50_000)  # and the bound still holds over the pieces
    assert not r.ok and r.error_reason == "too_large"


def test_hostile_gpu_labels_and_bitmasks_are_skipped_not_raised():
    """A GPU label that str.isdigit takes but int() refuses ("²"), and clock-event bitmasks of -1 and 1e300: the
    source reads what it can and sets no reason it was not told."""
    weird = PAGE.replace('gpu="0"', 'gpu="²"', 1)
    (r,) = collect([weird], pod=None, namespace=None)
    assert r.ok and all(dict(labels)["gpu"] != "²" for _, labels in r.samples)
    for mask in ("-1", "1e300"):
        (r,) = collect([PAGE.replace('pod="vllm-0"} 32', f'pod="vllm-0"}} {mask}')])
        assert r.ok, r.error
        assert not any(v for k, v in values(r).items() if k.startswith("gpu_clock_event_active/")), values(r)
