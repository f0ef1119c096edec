"""Starts and stops a real vLLM (CPU build) serving the tiny local model, for tests and recordings.

The venv and the model come from `make vllm-env` (paths in VLLM_TRIAGE_VLLM_PYTHON and
VLLM_TRIAGE_TINY_MODEL, set by the Makefile). Startup takes ~25-40 s on 2 cores.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from aiohttp import web

DEFAULT_HOME = Path.home() / ".cache" / "vllm-triage"
MODEL_NAME = "tiny"
MAX_NUM_SEQS = 16
T = TypeVar("T")
KV_BLOCKS = 40  # x block size 128 = 5120 tokens: 48+ clients of 200+300 tokens saturate it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the server and its EngineCore/Worker children (one process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)

    def kill(self) -> None:
        """Kill it the way the OOM killer would: no goodbye."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            # it goes at once, unless in an uninterruptible read or write: then when that ends (CI's disk stalled 10 s+)
            self.process.wait(timeout=60)


def paths() -> tuple[Path, Path]:
    python = Path(os.environ.get("VLLM_TRIAGE_VLLM_PYTHON", DEFAULT_HOME / "vllm-venv" / "bin" / "python"))
    model = Path(os.environ.get("VLLM_TRIAGE_TINY_MODEL", DEFAULT_HOME / "tiny-llama"))
    return python, model


def start(
    log_path: Path,
    port: int | None = None,
    startup_timeout: float = 300.0,
    niceness: int = 10,
    max_num_seqs: int = MAX_NUM_SEQS,
    tensor_parallel_size: int = 1,
    load_delay_seconds: float = 0.0,
) -> VllmServer:
    """A real vLLM serving the tiny model; `load_delay_seconds`: its API server process waits that long before it loads
    (a model downloading or compiling): a vLLM process that runs and does not answer yet."""
    python, model = paths()
    if not python.exists() or not (model / "config.json").exists():
        raise RuntimeError(f"vLLM venv or tiny model missing ({python}, {model}): run `make vllm-env` first")
    port = port or free_port()
    # the module stays the 4th word of the command line, where a process is told to be vLLM's API server
    delayed = (
        "import runpy, sys, time; module = sys.argv.pop(1); time.sleep(float(sys.argv.pop(1))); runpy.run_module(module, run_name='__main__', alter_sys=True)"
    )
    module = "vllm.entrypoints.openai.api_server"
    launch = ["-c", delayed, module, str(load_delay_seconds)] if load_delay_seconds else ["-m", module]
    command = [
        str(python), *launch,
        "--model", str(model), "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "1024", "--max-num-seqs", str(max_num_seqs),
        "--num-gpu-blocks-override", str(KV_BLOCKS), "--enforce-eager", "--tensor-parallel-size", str(tensor_parallel_size),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    if tensor_parallel_size > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # its automatic binding gives each rank a NUMA node: one here
    log = open(log_path, "wb")
    # In a pod the sidecar's own CPU request guarantees it a share; on a 2-core test machine vLLM's busy
    # threads would starve everything else (a sleeping process woke up to 3 s late, and a sidecar /metrics
    # request timed out after 15 s in CI). A lower priority in the same session (autogroup) stands in for
    # that guarantee: the same sleeper then wakes within 1 ms. Own process group, so stop() reaches all.
    command = ["nice", "-n", str(niceness), *command]  # the scenario suite runs it at 0, as users do
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
    server = VllmServer(process, port, log_path)
    try:
        wait_healthy(server.url, process, log_path, startup_timeout)
    except RuntimeError:
        server.stop()
        raise
    return server


def wait_healthy(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    """Until vLLM's /health answers 200; RuntimeError with the log's end if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM exited with {process.returncode} during startup: {log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vLLM did not become healthy within {timeout:.0f} s: {log_path.read_text()[-3000:]}")


async def serving(app: web.Application, body: Callable[[str], Awaitable[T]]) -> T:
    """`body(url)` while `app` serves on a free loopback port: the fake servers the unit tests talk to."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        return await body(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
