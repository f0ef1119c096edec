"""Memory under churn: a vLLM page whose model_name label changes on every scrape (short names, then
long ones near max_label_value_length) while slow clients hold half-open connections to the sidecar.
Samples the sidecar's RSS over time; the goal is a flat line after warm-up, bounded by configuration
(the store's window, interned labels by bytes, max_connections). Prints a table; nothing is enforced.

    .venv/bin/python -m bench.soak [--seconds 300] [--name-length 8 1000] [--engines 1] [--series 0] [--scrape-interval 0.5] [--slow-clients 200]

`--name-length 0` keeps the page's model name (the same series at every scrape, as a real server's): the sidecar's
memory over time without churn, the baseline the churning runs are read against.

The fake vLLM is an aiohttp server on loopback in this process; the sidecar runs the vllm source at a
0.5 s scrape interval by default (10x the default), so label sets churn ten times as fast as a real one would;
the store then keeps ten times the pages of the default 5 s (`--scrape-interval 5`: the default's memory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import socket
import time
from pathlib import Path

import psutil
from aiohttp import web

from bench.many_engines import engines_page
from harness.components import start_sidecar
from harness.vllm_server import free_port

CAPTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm-0.32.0-cpu-kv-saturated.metrics.txt"


def padded(page: str, engines: int, series: int) -> str:
    """The page with request_success_total series of made-up finished_reason values added, spread over the engines, up
    to `series` vllm: series: a label exploding as far as max_series lets it (the worst page the limits admit)."""
    have = sum(1 for line in page.splitlines() if line.startswith("vllm:") and "_created" not in line.split("{", 1)[0])
    extra = [f'vllm:request_success_total{{engine="{i % engines}",finished_reason="r{i}",model_name="tiny"}} {i}' for i in range(max(0, series - have))]
    return page + "\n".join(extra) + "\n"


async def churning_vllm(port: int, name_length: int, engines: int, series: int) -> web.AppRunner:
    """vLLM's real page (repeated once per data-parallel engine, padded to `series`), its model_name different on every request
    (the same at every request with `name_length` 0)."""
    page = padded(engines_page(engines), engines, series)
    count = {"n": 0}

    async def metrics(_: web.Request) -> web.Response:
        count["n"] += 1
        if not name_length:
            return web.Response(text=page)
        name = f"{count['n']:0{name_length}d}"[-name_length:]
        return web.Response(text=page.replace('model_name="tiny"', f'model_name="{name}"'))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def soak(name_length: int, engines: int, series: int, scrape_interval: float, seconds: float, slow_clients: int, tmp: Path) -> list[tuple[float, float]]:
    port = free_port()
    vllm = await churning_vllm(port, name_length, engines, series)
    config = f"sources: [vllm]\nscrape_interval_seconds: {scrape_interval}\nlog_level: warning\nhttp_header_timeout_seconds: 5\n"
    sidecar = await asyncio.to_thread(start_sidecar, tmp, f"http://127.0.0.1:{port}", config)
    listen = int(sidecar.url.rsplit(":", 1)[1])
    process = psutil.Process(sidecar.process.pid)
    samples: list[tuple[float, float]] = []
    held: list[socket.socket] = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            for client in held:  # slow clients: half a request line, reopened as the sidecar drops them
                client.close()
            held = []
            for _ in range(slow_clients):
                with contextlib.suppress(OSError):
                    client = socket.create_connection(("127.0.0.1", listen), timeout=1)
                    client.sendall(b"GET /metr")
                    held.append(client)
            samples.append((time.monotonic() - started, process.memory_info().rss / 1e6))
            await asyncio.sleep(10)
    finally:
        for client in held:
            client.close()
        sidecar.process.terminate()
        sidecar.process.wait(timeout=30)
        await vllm.cleanup()
    return samples


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--name-length", type=int, nargs="+", default=[8, 1000], help="model_name lengths, one run each (0: the same name at every scrape)")
    parser.add_argument("--engines", type=int, default=1, help="data-parallel engines on the page (the sidecar's max_engines is 32)")
    parser.add_argument("--series", type=int, default=0, help="pad the page to this many vllm: series (max_series: 15000)")
    parser.add_argument("--scrape-interval", type=float, default=0.5, help="the sidecar's scrape_interval_seconds")
    parser.add_argument("--slow-clients", type=int, default=200)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores; python {platform.python_version()}")
    for length in args.name_length:
        with tempfile.TemporaryDirectory() as tmp:
            samples = asyncio.run(soak(length, args.engines, args.series, args.scrape_interval, args.seconds, args.slow_clients, Path(tmp)))
        line = " ".join(f"{t:.0f}s:{rss:.0f}" for t, rss in samples)
        warm = [rss for t, rss in samples if t >= 60]
        spread = f"after 60 s: {min(warm):.0f}-{max(warm):.0f} MB" if warm else ""
        page = f"{args.engines} engine(s), {args.series or 'real'} series"
        names = (
            f"model_name of {length} chars, new every {args.scrape_interval} s scrape"
            if length
            else f"the same model_name, scraped every {args.scrape_interval} s"
        )
        what = f"{page}, {names}, {args.slow_clients} slow clients"
        print(f"{what}: RSS MB {line}  {spread}", flush=True)


if __name__ == "__main__":
    main()
