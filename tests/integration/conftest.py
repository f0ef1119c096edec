"""Real components for the integration tests: a vLLM (CPU build) with the tiny local model, the
sidecar as a subprocess, and client load as a subprocess (killed to stop, as a client would)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from . import vllm_server

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_server.VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    started = time.monotonic()
    server = vllm_server.start(log)
    print(f"vLLM ready in {time.monotonic() - started:.0f} s at {server.url}")
    yield server
    server.stop()


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@dataclass
class Sidecar:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def metrics(self) -> dict[str, list]:
        status, body = get(self.url + "/metrics")
        assert status == 200
        return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}

    def active(self) -> dict[str, float]:
        return {s.labels["condition"]: s.value for s in self.metrics()["vllm_triage_condition_active"]}

    def diagnosis(self) -> dict:
        status, body = get(self.url + "/diagnosis")
        assert status == 200, body
        return json.loads(body)

    def condition(self, name: str) -> dict:
        return next(c for c in self.diagnosis()["conditions"] if c["condition"] == name)

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.5) -> float:
        """Seconds until predicate() holds; fails with the sidecar's view if it never does."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():
                return time.monotonic() - started
            time.sleep(interval)
        states = {c["condition"]: c["state"] for c in self.diagnosis()["conditions"]}
        pytest.fail(f"{what}: not seen within {timeout:.0f} s; conditions: {states}")


def start_sidecar(tmp_path: Path, vllm_url: str, config_text: str) -> Sidecar:
    config = tmp_path / "sidecar.yaml"
    config.write_text(config_text)
    port = vllm_server.free_port()
    log_path = tmp_path / "sidecar.log"
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [str(BIN / "vllm-triage"), "serve", "--config", str(config), "--vllm-url", vllm_url, "--listen", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    sidecar = Sidecar(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if get(sidecar.url + "/readyz", timeout=1)[0] == 200:
                return sidecar
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"sidecar not ready within 30 s: {log_path.read_text()}")


@dataclass
class Load:
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """Clients go away: connections close and vLLM aborts their requests."""
        self.process.kill()
        self.process.wait(timeout=10)


def start_load(url: str, clients: int, prompt_words: int, max_tokens: int, seconds: float = 600) -> Load:
    command = [
        sys.executable, "-m", "tests.integration.load", "--url", url, "--model", vllm_server.MODEL_NAME,
        "--clients", str(clients), "--seconds", str(seconds),
        "--prompt-words", str(prompt_words), "--max-tokens", str(max_tokens),
    ]  # fmt: skip
    return Load(subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
