"""/metrics under scrapers, against the framework's floor on this machine: the sidecar replaying the
demo capture (`serve --demo`: a tick, ingest and render on the pipeline thread as in a live run) and a
bare aiohttp server returning the same page. Per burst, 50 scrapers open their connections at one moment
and make 20 requests each; a burst's p99 is its slowest first requests, one sample of the cycle, so
bursts repeat across the sidecar's tick. Also one scraper back to back for a while. Prints a table;
enforces nothing. Needs no vLLM (on the H200: `PYTHONPATH=exporter:. python3 -m bench.scrape_bursts`).

    .venv/bin/python -m bench.scrape_bursts [--bursts 20] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from bench.sidecar_overhead import percentile, scrape_latencies

# What serving the sidecar's page costs with nothing of the sidecar behind it: aiohttp with one handler
# returning the bytes, and asyncio's own protocol writing them (the machine's and the client's share)
FLOOR_SERVERS = {
    "bare_aiohttp": """
import sys
from aiohttp import web
body = open(sys.argv[1], "rb").read()
async def metrics(_): return web.Response(body=body, content_type="text/plain")
app = web.Application()
app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
""",
    "bare_asyncio_protocol": """
import asyncio, sys
body = open(sys.argv[1], "rb").read()
response = b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body
class Metrics(asyncio.Protocol):
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data): self.transport.write(response)  # one request per packet: the scraper waits for each answer
async def main():
    await asyncio.get_running_loop().create_server(Metrics, "127.0.0.1", int(sys.argv[2]))
    await asyncio.Event().wait()
asyncio.run(main())
""",
}
SIDECAR_PORT, FLOOR_PORT = 9410, 9411


def start_floor(name: str, page: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", FLOOR_SERVERS[name], str(page), str(port)])


def wait_listening(url: str, seconds: float = 30) -> bytes:
    """The page at `url` once it answers; RuntimeError after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bytes(response.read())
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


def burst_p99(url: str) -> float:
    """p99 (s) of one burst: 50 scrapers opening their connections at one moment, 20 requests each."""
    return percentile(asyncio.run(scrape_latencies(url, 50, 20)), 0.99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bursts", type=int, default=20, help="bursts of 50 new connections per server")
    parser.add_argument("--seconds", type=float, default=10.0, help="one scraper back to back this long per server")
    args = parser.parse_args()
    sidecar_command = [sys.executable, "-m", "vllm_triage.cli", "serve", "--demo", "--listen", f"127.0.0.1:{SIDECAR_PORT}", "--log-level", "warning"]
    with tempfile.TemporaryDirectory() as tmp:
        sidecar = subprocess.Popen(sidecar_command, stdout=subprocess.DEVNULL)
        servers = {"sidecar (demo)": (SIDECAR_PORT, sidecar)}
        try:
            page = Path(tmp) / "page.txt"
            page.write_bytes(wait_listening(f"http://127.0.0.1:{SIDECAR_PORT}/metrics"))
            size = page.stat().st_size
            servers["bare aiohttp, same page"] = (FLOOR_PORT, start_floor("bare_aiohttp", page, FLOOR_PORT))
            wait_listening(f"http://127.0.0.1:{FLOOR_PORT}/metrics")
            time.sleep(5)  # the demo's windows fill
            one = {
                name: asyncio.run(scrape_latencies(f"http://127.0.0.1:{port}/metrics", 1, 0, for_seconds=args.seconds)) for name, (port, _) in servers.items()
            }
            bursts: dict[str, list[float]] = {name: [] for name in servers}
            for _ in range(args.bursts):  # interleaved: both servers see the same moments of the machine
                for name, (port, _) in servers.items():
                    bursts[name].append(burst_p99(f"http://127.0.0.1:{port}/metrics"))
                    time.sleep(0.11)  # bursts fall on every phase of the tick
        finally:
            for _, process in servers.values():
                process.terminate()
                process.wait(timeout=10)
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} cores; python {platform.python_version()}; /metrics {size} bytes")
    for name in servers:
        ms = sorted(value * 1000 for value in bursts[name])
        print(
            f"{name}: 1 scraper back to back ({len(one[name])} requests) p50 {statistics.median(one[name]) * 1000:.3f} ms, "
            f"p99 {percentile(one[name], 0.99) * 1000:.3f} ms, p99.9 {percentile(one[name], 0.999) * 1000:.3f} ms; "
            f"50 new connections, p99 of each of {len(ms)} bursts: median {statistics.median(ms):.1f} ms, {ms[0]:.1f}-{ms[-1]:.1f} ms"
        )


if __name__ == "__main__":
    main()
