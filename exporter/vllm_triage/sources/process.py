"""Layer 3 (host): find the vLLM processes visible to the sidecar and read their command line.

In Kubernetes the sidecar sees vLLM's processes only when the pod shares its process namespace;
when it does not, this source reports an empty list and discovery falls back to defaults.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import psutil

from ..model import PROCESS_SOURCE, Reading

log = logging.getLogger(__name__)

# Command-line flags that other layers use; value is how to read it.
FLAGS: dict[str, Callable[[str], Any]] = {
    "--max-num-seqs": int,
    "--max-num-batched-tokens": int,
    "--tensor-parallel-size": int,
    "-tp": int,
    "--data-parallel-size": int,
    "--api-server-count": int,
    "--port": int,
    "--block-size": int,
    "--max-model-len": int,
    "--served-model-name": str,
    "--model": str,
    "--gpu-memory-utilization": float,
}
BOOLEAN_FLAGS = ("--enable-prefix-caching", "--no-enable-prefix-caching", "--enforce-eager", "--async-scheduling")


def parse_vllm_args(cmdline: list[str]) -> dict[str, Any]:
    """The flags above from a vLLM command line, keyed without dashes (`max_num_seqs`)."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(cmdline):
        token = cmdline[i]
        flag, _, inline = token.partition("=")
        if flag in FLAGS:
            raw = inline if inline else (cmdline[i + 1] if i + 1 < len(cmdline) else None)
            if not inline:
                i += 1
            if raw is not None:
                key = "tensor_parallel_size" if flag == "-tp" else flag.lstrip("-").replace("-", "_")
                try:
                    args[key] = FLAGS[flag](raw)
                except ValueError:
                    pass
        elif flag in BOOLEAN_FLAGS:
            args[flag.lstrip("-").replace("-", "_")] = True
        i += 1
    # `vllm serve MODEL` puts the model positionally.
    if "serve" in cmdline and "model" not in args:
        position = cmdline.index("serve") + 1
        if position < len(cmdline) and not cmdline[position].startswith("-"):
            args["model"] = cmdline[position]
    return args


def role_of(cmdline: list[str], title_prefix: str) -> str | None:
    """api_server | engine_core | worker, or None for a process that is not vLLM's."""
    if not cmdline:
        return None
    first = cmdline[0]
    if first.startswith(f"{title_prefix}::EngineCore"):
        return "engine_core"
    if first.startswith(f"{title_prefix}::Worker"):
        return "worker"
    if first.startswith(f"{title_prefix}::APIServer"):
        return "api_server"
    head = cmdline[:4]
    if any(token.startswith("vllm.entrypoints") for token in head):
        return "api_server"  # python -m vllm.entrypoints.openai.api_server
    for token, following in itertools.pairwise(head):
        if token.rsplit("/", 1)[-1] == "vllm" and following == "serve":
            return "api_server"  # the `vllm serve` console script
    return None


class ProcessSource:
    """Lists vLLM's processes (psutil, run in a thread by the daemon)."""

    def __init__(self, port: int | None, title_prefix: str = "VLLM", clock: Callable[[], float] = time.time) -> None:
        self.port = port
        self.title_prefix = title_prefix
        self.clock = clock
        self._last_count: int | None = None

    def collect(self) -> Reading:
        start = time.perf_counter()
        timestamp = self.clock()
        processes: list[dict[str, Any]] = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmdline = proc.info["cmdline"] or []
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            role = role_of(cmdline, self.title_prefix)
            if role is None:
                continue
            entry: dict[str, Any] = {"pid": proc.info["pid"], "role": role, "title": " ".join(cmdline)[:200]}
            if role == "api_server":
                entry["args"] = parse_vllm_args(cmdline)
            processes.append(entry)
        servers = [p for p in processes if p["role"] == "api_server"]
        # Several vLLMs on one host: the one listening on the port we scrape is ours.
        matching = [p for p in servers if p["args"].get("port", 8000) == self.port] if self.port else servers
        meta: dict[str, Any] = {"processes": [{k: p[k] for k in ("pid", "role")} for p in processes]}
        if matching:
            meta["api_server_args"] = matching[0]["args"]
            meta["api_server_pid"] = matching[0]["pid"]
        if len(processes) != self._last_count:
            log.info("process source: %d vLLM process(es) visible%s", len(processes), "" if processes else " (no shared process namespace?)")
            self._last_count = len(processes)
        return Reading(PROCESS_SOURCE, timestamp, True, duration_seconds=time.perf_counter() - start, meta=meta)
