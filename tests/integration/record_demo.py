"""Records the bundled demo capture from a real vLLM (CPU build) driven through four phases:
idle, client underload, KV-cache saturation, recovery. Reproduce with

    make vllm-env && .venv/bin/python -m tests.integration.record_demo exporter/vllm_triage/data/demo.jsonl.gz
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from vllm_triage.capture import CaptureWriter
from vllm_triage.cli import observe
from vllm_triage.config import load

from . import vllm_server
from .load import run_load

PHASES = (  # name, seconds, clients, prompt words, max tokens
    ("idle", 45, 0, 0, 0),
    ("underload", 180, 2, 50, 100),
    ("kv_saturation", 180, 64, 200, 500),
    ("recovery", 150, 0, 0, 0),  # long enough for every condition to clear with default durations
)


async def drive(url: str) -> None:
    for name, seconds, clients, words, tokens in PHASES:
        print(f"{time.strftime('%H:%M:%S')} phase {name} ({seconds} s, {clients} clients)", flush=True)
        if clients:
            await run_load(url, vllm_server.MODEL_NAME, clients, seconds, words, tokens)
        else:
            await asyncio.sleep(seconds)


async def record(out: Path, url: str) -> None:
    config = load(env={}, flags={"vllm_url": url, "scrape_interval_seconds": "2"})
    total = sum(p[1] for p in PHASES) + 30  # in-flight requests finish after a phase ends
    description = {"vllm_url": "http://127.0.0.1:8000", "phases": [p[:3] for p in PHASES], "created": time.time()}
    with CaptureWriter(out, description) as writer:
        await asyncio.gather(observe(config, total, writer), drive(url))


def main() -> None:
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        server = vllm_server.start(Path(tmp) / "vllm.log")
        try:
            asyncio.run(record(out, server.url))
        finally:
            server.stop()
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
