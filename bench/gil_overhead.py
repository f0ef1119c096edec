"""What py-spy GIL sampling costs vLLM: A/B pairs of vLLM throughput (generated tokens/s) with the
sidecar's GIL source off and on, against the real vLLM (CPU build). Prints a table; enforces nothing.

    .venv/bin/python -m bench.gil_overhead [--pairs 3] [--seconds 60] [--gil-interval S] [--blocking]
    .venv/bin/python -m bench.gil_overhead --pairs 6 --seconds 30 --gil-interval 5   # windows back to back

Each run starts a fresh sidecar (sources vllm,process, plus gil when on) and drives 8 clients for
`--seconds`; runs alternate off/on/on/off... so that drift in the machine's speed cancels out.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from vllm_triage.config import OPTIONS_BY_KEY

from harness import vllm_server
from harness.components import start_sidecar
from harness.load import run_load


def one_run(server: vllm_server.VllmServer, tmp: Path, gil: bool, seconds: float, gil_interval: float, window: float, rate: int, blocking: bool) -> float:
    sources = "vllm,process,gil" if gil else "vllm,process"
    config = (
        f"sources: {sources}\ngil_interval_seconds: {gil_interval}\ngil_window_seconds: {window}\ngil_rate: {rate}\n"
        f"gil_nonblocking: {str(not blocking).lower()}\nlog_level: warning\n"
    )
    folder = tmp / f"run-{'on' if gil else 'off'}-{len(list(tmp.iterdir()))}"
    folder.mkdir()
    sidecar = start_sidecar(folder, server.url, config)
    try:
        result = asyncio.run(run_load(server.url, vllm_server.MODEL_NAME, 8, seconds, 100, 200))
    finally:
        sidecar.process.terminate()
        sidecar.process.wait(timeout=10)
    return result.generated_tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    default_interval = OPTIONS_BY_KEY["gil_interval_seconds"].default
    parser.add_argument("--gil-interval", type=float, default=default_interval, help="the sidecar's gil_interval_seconds (default: its default)")
    parser.add_argument("--gil-window", type=float, default=OPTIONS_BY_KEY["gil_window_seconds"].default)
    parser.add_argument("--gil-rate", type=int, default=OPTIONS_BY_KEY["gil_rate"].default)
    parser.add_argument("--blocking", action="store_true", help="py-spy's blocking mode (gil_nonblocking: false) instead of the default")
    args = parser.parse_args()
    results: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        server = vllm_server.start(Path(tmp) / "vllm.log")
        try:
            asyncio.run(run_load(server.url, vllm_server.MODEL_NAME, 8, 15, 100, 200))  # warm-up
            for pair in range(args.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                for gil in order:
                    tokens = one_run(server, Path(tmp), gil, args.seconds, args.gil_interval, args.gil_window, args.gil_rate, args.blocking)
                    results[gil].append(tokens)
                    print(f"pair {pair + 1} GIL sampling {'on ' if gil else 'off'}: {tokens:.0f} generated tokens/s", flush=True)
        finally:
            server.stop()
    off, on = statistics.mean(results[False]), statistics.mean(results[True])
    ratios = sorted(b / a for a, b in zip(results[False], results[True], strict=True))
    print(
        f"GIL sampling every {args.gil_interval:g} s ({args.gil_window:g} s windows at {args.gil_rate} Hz, {'blocking' if args.blocking else 'nonblocking'}): "
        f"throughput on/off = {on / off:.3f} ({(1 - on / off) * 100:+.1f} % cost); per pair {', '.join(f'{r:.3f}' for r in ratios)}; "
        f"off {[round(x) for x in results[False]]}, on {[round(x) for x in results[True]]}"
    )
    # Windows are spaced out, so the cost scales with the share of time a window is open: measure it
    # with back-to-back windows (--gil-interval 5 --gil-window 5), then scale to the default duty.
    print(f"duty (both roles, one window each per interval): {min(1.0, 2 * args.gil_window / args.gil_interval):.3f}")


if __name__ == "__main__":
    main()
