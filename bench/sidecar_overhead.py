"""Sidecar overhead against a real vLLM (CPU build): CPU as a share of one core, RSS, and
/metrics latency with 1 and 50 concurrent scrapers. Prints a table; nothing is enforced.

    make bench        # or: .venv/bin/python -m bench.sidecar_overhead [--seconds 60] [--beside SECONDS]

The sidecar runs at its default cadence (scrape and evaluate every tick_seconds) while 8 clients keep vLLM
busy, scraped every 15 s as Prometheus would while its CPU is measured. Scrapers run in this process on the same machine, so latency includes their client cost;
it is measured with vLLM busy (all cores contended on a small machine) and again once it is idle.
--beside SECONDS runs a second sidecar beside it that reads and judges every SECONDS, measured in the same window
(what the default cadence saves or costs against another, on the same load at the same time).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import psutil
from vllm_triage.config_loader import load as load_config

from harness import vllm_server
from harness.cadence import every
from harness.components import start_load, start_sidecar


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Connection:
    """One scraper's kept-alive HTTP/1.1 connection, as a plain asyncio stream, opened again when the server
    closes it (an HTTP/1.0 server such as prometheus_client's does after each response). The measuring
    client must cost far less than what it measures: with aiohttp's client, most of a 50-connection burst's
    latency was the client's own (30 ms against 5-9 ms on the 2-core machine)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.request = f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept-Encoding: identity\r\n\r\n".encode()
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self) -> bytes:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        writer.write(self.request)
        status, *lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}
        if status.split()[1] != "200":
            raise RuntimeError(f"{self.host}:{self.port}: {status}")
        body = await reader.readexactly(int(headers["content-length"]))  # both exporters measured send one
        if status.startswith("HTTP/1.0") or headers.get("connection", "").lower() == "close":
            self.close()
        return body

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


async def scrape_latencies(
    url: str, scrapers: int, requests_each: int, connected: bool = False, pause_seconds: float = 0.0, for_seconds: float = 0.0
) -> list[float]:
    """Latencies of `scrapers` clients scraping at once, `requests_each` requests each over one kept-alive
    connection. Their first requests open all connections at the same moment (the slowest requests of the
    run); with `connected` that first request is not timed: what a scraper that keeps its connection sees.
    Back to back, 300 requests of one scraper last a fraction of a second: one moment of the sidecar's tick
    cycle (a tick computing, or not). `for_seconds` goes on back to back for that long instead, over many
    ticks, so the tail counts the ticks as often as they occur; with `pause_seconds` between requests they
    sample the cycle too, but each then also pays both processes' wake-up from idle."""
    latencies: list[float] = []

    async def scraper() -> None:
        connection = _Connection(url)
        number, end = 0, time.monotonic() + for_seconds
        try:
            while (time.monotonic() < end) if for_seconds else number < requests_each + connected:
                started = time.perf_counter()
                await connection.get()
                if number or not connected:
                    latencies.append(time.perf_counter() - started)
                number += 1
                await asyncio.sleep(pause_seconds)
        finally:
            connection.close()

    # The measuring process's own full collection would pause every scraper at once: in the bench's process
    # one (30-40 ms) fell in a burst and was read as the server's latency. Collected before, not during.
    gc.collect()
    gc.disable()
    try:
        await asyncio.gather(*(scraper() for _ in range(scrapers)))
    finally:
        gc.enable()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="CPU measurement window")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="a Prometheus scrape this often during the CPU window")
    parser.add_argument("--beside", type=float, help="also a sidecar reading and judging every this many seconds, measured in the same window")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = vllm_server.start(Path(tmp) / "vllm.log")
        load = start_load(server.url, clients=8, prompt_words=100, max_tokens=200)
        sidecar = start_sidecar(Path(tmp), server.url, "log_level: warning\n")
        other = None
        if args.beside:
            (Path(tmp) / "beside").mkdir()
            flags = "".join(f"{key}: {value}\n" for key, value in every(args.beside).items())
            other = start_sidecar(Path(tmp) / "beside", server.url, "log_level: warning\n" + flags)
        try:
            processes = [psutil.Process(s.process.pid) for s in (sidecar, other) if s is not None]
            time.sleep(10)  # a few windows' worth of state
            cpu_before, wall_before = [p.cpu_times() for p in processes], time.monotonic()
            scrapers = [threading.Thread(target=prometheus_like_scrapes, args=(other.url + "/metrics", args.seconds, args.scrape_interval))] if other else []
            for scraper in scrapers:
                scraper.start()
            scrapes = prometheus_like_scrapes(sidecar.url + "/metrics", args.seconds, args.scrape_interval)
            for scraper in scrapers:
                scraper.join()
            wall = time.monotonic() - wall_before
            cpu, *beside_cpu = [(a.user + a.system - b.user - b.system) / wall for a, b in zip([p.cpu_times() for p in processes], cpu_before, strict=True)]
            rss, *beside_rss = [p.memory_info().rss for p in processes]
            if other is not None:
                other.process.terminate()
                other.process.wait(timeout=10)
            latencies = {
                "1 scraper, vLLM busy": asyncio.run(scrape_latencies(sidecar.url + "/metrics", 1, 0, for_seconds=20)),
                "50 scrapers, vLLM busy": asyncio.run(scrape_latencies(sidecar.url + "/metrics", 50, 20)),
            }
            load.stop()
            time.sleep(15)  # vLLM drains: the CPU is the sidecar's and the scrapers'
            latencies["1 scraper, vLLM idle"] = asyncio.run(scrape_latencies(sidecar.url + "/metrics", 1, 0, for_seconds=20))
            latencies["50 scrapers, vLLM idle"] = asyncio.run(scrape_latencies(sidecar.url + "/metrics", 50, 20))
            size = len(asyncio.run(fetch(sidecar.url + "/metrics")))
        finally:
            load.stop()
            for started in (sidecar, other):
                if started is not None and started.process.poll() is None:
                    started.process.terminate()
                    started.process.wait(timeout=10)
            server.stop()
    cores = psutil.cpu_count()
    tick = load_config(env={}).tick_seconds
    print(f"machine: {platform.machine()}, {cores} cores, {platform.processor() or 'cpu'}; python {platform.python_version()}")
    print(
        f"sidecar CPU over {args.seconds:.0f} s (scrape+evaluate every {tick:g} s, vLLM under 8 clients, scraped every "
        f"{args.scrape_interval:g} s as Prometheus would: {len(scrapes)} scrapes, slowest {max(scrapes) * 1000:.2f} ms): {cpu * 100:.2f} % of one core"
    )
    print(f"sidecar RSS: {rss / 1e6:.1f} MB; /metrics body {size} bytes")
    if beside_cpu:
        percent, share, megabytes = beside_cpu[0] * 100, beside_cpu[0] / cpu, beside_rss[0] / 1e6
        print(f"beside it in the same window, every cadence at {args.beside:g} s: {percent:.2f} % of one core ({share:.2f}x), RSS {megabytes:.1f} MB")
    for name, values in latencies.items():
        print(f"/metrics latency, {name} ({len(values)} requests): p50 {statistics.median(values) * 1000:.2f} ms, p99 {percentile(values, 0.99) * 1000:.2f} ms")


def prometheus_like_scrapes(url: str, seconds: float, interval: float) -> list[float]:
    """Scrape as Prometheus does (OpenMetrics preferred, gzip) every `interval` for `seconds`; latencies."""
    headers = {"Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3", "Accept-Encoding": "gzip"}
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            response.read()
        latencies.append(time.perf_counter() - started)
        time.sleep(max(0.0, min(interval, end - time.monotonic())))
    return latencies


async def fetch(url: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.get(url, headers={"Accept-Encoding": "identity"}) as response:
        return await response.read()


if __name__ == "__main__":
    sys.exit(main())
