"""Real components shared by the tests, the scenario suite and the benchmarks: the sidecar as a subprocess,
client load as a subprocess (killed to stop, as a client would), a real Prometheus, and the short settings
the integration tests judge with."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from . import vllm_server

REPO = Path(__file__).resolve().parents[1]
# Short windows and frequent samples (a config file, as a user would write one) so that detect-and-clear
# cycles fit in CI; each test adds the per-condition durations it needs.
FAST_CADENCE = """
window_seconds: 10
scrape_interval_seconds: 1
tick_seconds: 1
process_interval_seconds: 2
gil_interval_seconds: 10
gil_window_seconds: 3
"""
# `for` / `clear_for` of seconds instead of minutes, so that a test sees verdicts come and go.
FAST_CONDITIONS = """conditions:
  vllm_unreachable: {for_seconds: 3, clear_for_seconds: 3}
  kv_cache_saturated: {for_seconds: 3, clear_for_seconds: 5}
  queue_backlog: {for_seconds: 3, clear_for_seconds: 5}
  preemption_storm: {for_seconds: 3, clear_for_seconds: 5}
  client_underload: {for_seconds: 5, clear_for_seconds: 5}
  kv_fragmentation_suspected: {for_seconds: 3, clear_for_seconds: 5}
  ttft_high: {for_seconds: 3, clear_for_seconds: 5}
"""
BIN = Path(sys.executable).parent


def get(url: str, timeout: float = 15.0) -> tuple[int, bytes]:
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

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.5, shows: str | None = None) -> float:
        """Seconds until predicate() holds; fails with the sidecar's view if it never does: every condition's state,
        and the evidence, missing inputs and processes behind the condition named by `shows`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if predicate():
                return time.monotonic() - started
            time.sleep(interval)
        diagnosis = self.diagnosis()
        states = {c["condition"]: c["state"] for c in diagnosis["conditions"]}
        detail = ""
        if shows is not None:
            judged = next(c for c in diagnosis["conditions"] if c["condition"] == shows)
            evidence = [e["text"] for e in judged["evidence"]]
            processes = diagnosis["discovery"]["processes"]
            detail = f"; {shows}'s evidence: {evidence}, missing: {judged['missing_inputs']}; processes: {processes}"
        pytest.fail(f"{what}: not seen within {timeout:.0f} s; conditions: {states}{detail}")


# The chart's sidecar user (uid 10001) with no capability at all, as Pod Security "restricted" runs it. Its Python is the
# system's (the venv's interpreter lives under root's home, which another user cannot enter), with the venv's packages.
UNPRIVILEGED = ("setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all")
SYSTEM_PYTHON = "/usr/bin/python3"


# What `serve` with the vllm and process sources imports (its modules found in the venv are copied for the other user).
SERVE_IMPORTS = "import vllm_triage.cli, vllm_triage.daemon, vllm_triage.server, vllm_triage.sources.process, vllm_triage.sources.vllm"


def unprivileged_sidecar_command(home: Path) -> list[str]:
    """`vllm-triage` as uid 10001 without capabilities; fails the test where that cannot run here. The package and the
    libraries it imports are copied under `home` (readable by everyone): the checkout and its venv may lie in a folder
    only root may enter."""
    site = next((BIN.parent / "lib").glob("python3.*/site-packages"))
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')"], capture_output=True, text=True)
    if version.stdout.strip() != site.parent.name:
        pytest.fail(f"{SYSTEM_PYTHON} is {version.stdout.strip() or version.stderr.strip()}, the venv's packages are for {site.parent.name}")
    listing = f"{SERVE_IMPORTS}; import sys; print('\\n'.join(sorted({{m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)}})))"
    files = subprocess.run([str(BIN / "python"), "-c", listing], capture_output=True, text=True, check=True).stdout.split()
    tops = {Path(f).relative_to(site).parts[0] for f in files if Path(f).is_relative_to(site)}
    copied = home / "site"
    for top in tops:
        (shutil.copytree if (site / top).is_dir() else shutil.copy2)(site / top, copied / top)
    shutil.copytree(REPO / "exporter" / "vllm_triage", copied / "vllm_triage", dirs_exist_ok=True)
    for path in [copied, *copied.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return ["env", f"PYTHONPATH={copied}", *UNPRIVILEGED, SYSTEM_PYTHON, "-c", "import sys; from vllm_triage.cli import main; sys.exit(main())"]


def start_sidecar(tmp_path: Path, vllm_url: str, config_text: str, *extra: str, unprivileged: bool = False, port: int | None = None) -> Sidecar:
    """The sidecar on `config_text` (on `port`, else a free one); `unprivileged`: as uid 10001 with no capability (its
    config where that user reads)."""
    home = Path(tempfile.mkdtemp(prefix="vllm-triage-")) if unprivileged else tmp_path
    home.chmod(0o755)
    config = home / "sidecar.yaml"
    config.write_text(config_text)
    config.chmod(0o644)
    port = port or vllm_server.free_port()
    log_path = tmp_path / "sidecar.log"
    log = open(log_path, "ab")
    command = unprivileged_sidecar_command(home) if unprivileged else [str(BIN / "vllm-triage")]
    process = subprocess.Popen(
        [*command, "serve", "--config", str(config), "--vllm-url", vllm_url, "--listen", f"127.0.0.1:{port}", *extra],
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
        """Clients go away: connections close and vLLM aborts their requests. Reaping took over 10 s once,
        and over 60 s once, beside two busy vLLMs on 2 cores: a SIGKILL lands when the process leaves the
        kernel. The wait is for the machine, not the behaviour under test: past it the run goes on, saying so."""
        self.process.kill()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            try:
                state = Path(f"/proc/{self.process.pid}/status").read_text().partition("State:")[2].split("\n", 1)[0].strip()
                wchan = Path(f"/proc/{self.process.pid}/wchan").read_text() or "?"
            except OSError:  # gone meanwhile
                state, wchan = "gone", "?"
            print(f"load pid {self.process.pid} not reaped 60 s after SIGKILL (state {state}, in {wchan}): going on", flush=True)


def start_load(url: str, clients: int, prompt_words: int, max_tokens: int, seconds: float = 600, shared_prefix_words: int = 0) -> Load:
    command = [
        sys.executable, "-m", "harness.load", "--url", url, "--model", vllm_server.MODEL_NAME,
        "--clients", str(clients), "--seconds", str(seconds),
        "--prompt-words", str(prompt_words), "--max-tokens", str(max_tokens), "--shared-prefix-words", str(shared_prefix_words),
    ]  # fmt: skip
    return Load(subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        status, body = get(f"{self.url}/api/v1/{path}?{query}", timeout=30)
        assert status == 200, body
        return json.loads(body)["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")["result"]

    def stop(self) -> None:
        """A clean shutdown first (it writes its head block); on a loaded 2-core CI machine that once took over 20 s, and
        the test's verdicts were already read: past a minute it is killed. The wait is for the machine."""
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=60)


def start_prometheus(tmp_path: Path, jobs: dict[str, list[tuple[str, dict[str, str]]]], rule_file: Path, alertmanager: str | None = None) -> Prometheus:
    """A real Prometheus (Debian's package) on loopback, scraping every second; with `alertmanager`
    (host:port) it sends its alerts there, resending each second."""
    config: dict = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target], "labels": labels} for target, labels in targets]} for job, targets in jobs.items()
        ],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    port = vllm_server.free_port()
    command = ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
    if alertmanager:
        command.append("--rules.alert.resend-delay=1s")
    process = _started(command, tmp_path / "prometheus.log", f"http://127.0.0.1:{port}", "Prometheus")
    return Prometheus(process, f"http://127.0.0.1:{port}")


def start_alertmanager(tmp_path: Path, config: dict) -> tuple[subprocess.Popen[bytes], str]:
    """A real Alertmanager (Debian's prometheus-alertmanager) on loopback, alone (no cluster); (process, host:port)."""
    path = tmp_path / "alertmanager.yml"
    path.write_text(json.dumps(config))
    port = vllm_server.free_port()
    command = [
        "prometheus-alertmanager",
        f"--config.file={path}",
        f"--storage.path={tmp_path / 'alertmanager'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    return _started(command, tmp_path / "alertmanager.log", f"http://127.0.0.1:{port}", "Alertmanager"), f"127.0.0.1:{port}"


def _started(command: list[str], log_path: Path, url: str, what: str) -> subprocess.Popen[bytes]:
    """Start a Prometheus-project server and wait for its /-/ready."""
    process = subprocess.Popen(command, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if get(f"{url}/-/ready", timeout=1)[0] == 200:
                return process
        except OSError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"{what} not ready: {log_path.read_text()[-2000:]}")
