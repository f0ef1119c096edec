"""The sidecar's image, built and run for real: a Docker engine started for the test, a Debian base made
locally with mmdebstrap (no image registry is reachable here; the Dockerfile's BASE argument takes it in
place of python:3.12-slim), the image built from the repository's Dockerfile and run as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness import vllm_server
from harness.components import REPO, get

pytestmark = pytest.mark.integration
BASE = "vllm-triage-test-base:bookworm"
IMAGE = "vllm-triage:test"


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private dockerd (its own socket, state and exec roots), stopped by pid at the end."""
    if not shutil.which("dockerd") or not shutil.which("docker") or not shutil.which("mmdebstrap"):
        pytest.skip("no Docker engine or mmdebstrap here (make docker-tools installs Debian's docker.io and mmdebstrap)")
    root = tmp_path_factory.mktemp("docker")
    socket = root / "docker.sock"
    log = open(root / "dockerd.log", "wb")
    daemon = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"), "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{socket}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
    deadline = time.monotonic() + 30
    while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode != 0:
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            pytest.skip(f"no Docker engine could start here: {(root / 'dockerd.log').read_text()[-500:]}")
        time.sleep(0.5)
    try:
        yield env
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def run(env: dict[str, str], *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"docker {' '.join(args)}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result


@pytest.fixture(scope="module")
def image(docker: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    base = tmp_path_factory.mktemp("base") / "base.tar"
    # The machine's extra CA certificates go into the base (an egress proxy may re-sign TLS), as its trust store.
    hooks = []
    if Path("/usr/local/share/ca-certificates").is_dir():
        hooks = [
            "--customize-hook=sync-in /usr/local/share/ca-certificates /usr/local/share/ca-certificates",
            '--customize-hook=chroot "$1" update-ca-certificates',
            '--customize-hook=printf "[global]\\ncert = /etc/ssl/certs/ca-certificates.crt\\n" > "$1/etc/pip.conf"',
        ]
    packages = "python3,python3-venv,python3-pip,ca-certificates,libcap2-bin"
    made = subprocess.run(["mmdebstrap", "--variant=apt", f"--include={packages}", *hooks, "bookworm", str(base)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no Debian mirror reachable to make a base image: {made.stderr[-500:]}")
    run(docker, "import", str(base), BASE)
    run(docker, "build", "--quiet", "--build-arg", f"BASE={BASE}", "-t", IMAGE, str(REPO))
    return IMAGE


def test_the_image_serves_as_uid_10001_on_a_read_only_root_and_reports_without_curl(docker, image):
    port = vllm_server.free_port()
    run(docker, "run", "-d", "--name", "sidecar", "--read-only", "--tmpfs", "/tmp", "-p", f"127.0.0.1:{port}:10290", image, "serve", "--demo")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, body = get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                if status == 200 and b"vllm_triage_condition_active" in body:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, run(docker, "logs", "sidecar", check=False).stderr
            time.sleep(1)
        assert run(docker, "exec", "sidecar", "id", "-u").stdout.strip() == "10001"
        assert run(docker, "exec", "sidecar", "touch", "/opt/x", check=False).returncode != 0  # the root filesystem is read-only
        report = run(docker, "exec", "sidecar", "vllm-triage", "report").stdout
        assert "vllm-triage diagnosis of the bundled demo capture" in report and "vLLM version: 0.26.0" in report
        health = run(docker, "inspect", "--format", "{{json .Config.Healthcheck.Test}}", "sidecar").stdout
        assert "healthz" in health
    finally:
        run(docker, "rm", "-f", "sidecar", check=False)


def test_py_spy_samples_a_process_in_a_shared_pid_namespace_only_with_sys_ptrace(docker, image):
    """The pod's shareProcessNamespace + SYS_PTRACE, as compose does it: --pid container:<vllm>."""
    target = "import time\ndef engine_core_loop():\n    while True:\n        time.sleep(0.001)\nengine_core_loop()\n"
    run(docker, "run", "-d", "--name", "target", "--entrypoint", "python3", image, "-c", target)
    try:
        time.sleep(1)
        granted = run(docker, "run", "--rm", "--pid", "container:target", "--cap-add", "SYS_PTRACE", "--entrypoint", "py-spy", image, "dump", "--pid", "1")
        assert "engine_core_loop" in granted.stdout
        refused = run(docker, "run", "--rm", "--pid", "container:target", "--entrypoint", "py-spy", image, "dump", "--pid", "1", check=False)
        assert refused.returncode != 0 and "operation not permitted" in (refused.stdout + refused.stderr).lower()
    finally:
        run(docker, "rm", "-f", "target", check=False)


# The compose stack with images made here: vLLM's CPU build from the venv `make vllm-env` made (mounted
# into the local Debian base, the same release as this machine), Prometheus from Debian's package, the
# sidecar's image; Grafana (no image can be had here) stays in its profile and is not started.
PROMETHEUS_IMAGE = "vllm-triage-test-prometheus:bookworm"
VLLM_RUNTIME_IMAGE = "vllm-triage-test-vllm-runtime:bookworm"  # the base and libnuma, which vLLM's CPU kernels link


def compose_override(folder: Path) -> Path:
    python, model = vllm_server.paths()
    venv = python.parent.parent
    home = Path(Path(venv / "pyvenv.cfg").read_text().split("home = ")[1].split("\n")[0]).parent  # the Python the venv was made with
    override = {
        "services": {
            "vllm": {
                "image": VLLM_RUNTIME_IMAGE,
                "entrypoint": [str(python), "-m", "vllm.entrypoints.openai.api_server"],
                "command": ["--model=/models/tiny", "--served-model-name=tiny", "--host=0.0.0.0", "--port=8000", "--max-model-len=1024", "--enforce-eager"],
                "volumes": [f"{venv}:{venv}:ro", f"{home}:{home}:ro", f"{model}:/models/tiny:ro"],
                "environment": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
                "healthcheck": {"start_period": "300s"},
            },
            "vllm-triage": {"image": IMAGE},
            "prometheus": {"image": PROMETHEUS_IMAGE, "entrypoint": ["/usr/bin/prometheus"]},
        }
    }
    path = folder / "docker-compose.test.yml"
    path.write_text(yaml.safe_dump(override))
    return path


def test_the_compose_stack_comes_up_and_prometheus_scrapes_both_jobs_with_the_rules(docker, image, tmp_path):
    if not shutil.which("docker-compose"):
        pytest.skip("no docker-compose here (make compose-tools installs Debian's)")
    for name, package in ((PROMETHEUS_IMAGE, "prometheus"), (VLLM_RUNTIME_IMAGE, "libnuma1")):
        recipe = tmp_path / package
        recipe.mkdir()
        install = f"apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {package} && rm -rf /var/lib/apt/lists/*"
        (recipe / "Dockerfile").write_text(f"FROM {BASE}\nRUN {install}\n")
        run(docker, "build", "--quiet", "-t", name, str(recipe))
    files = ["-f", str(REPO / "docker-compose.yml"), "-f", str(REPO / "docker-compose.cpu.yml"), "-f", str(compose_override(tmp_path))]
    compose = ["docker-compose", "--project-name", "vllmtriagetest", "--project-directory", str(REPO), *files]
    env = {**docker, "COMPOSE_HTTP_TIMEOUT": "300"}
    up = subprocess.run([*compose, "up", "-d", "vllm", "vllm-triage", "prometheus"], env=env, capture_output=True, text=True, timeout=600)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        ports = subprocess.run([*compose, "port", "prometheus", "9090"], env=env, capture_output=True, text=True).stdout.strip()
        prometheus = f"http://127.0.0.1:{ports.rsplit(':', 1)[1]}"
        deadline = time.monotonic() + 420
        health: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                targets = json.loads(get(prometheus + "/api/v1/targets", timeout=5)[1])["data"]["activeTargets"]
                health = {t["labels"]["job"]: t["health"] for t in targets}
            except (OSError, ValueError, KeyError):
                health = {}
            if health.get("vllm") == "up" and health.get("vllm-triage") == "up":
                break
            if run(docker, "inspect", "-f", "{{.State.Running}}", "vllmtriagetest_vllm_1", check=False).stdout.strip() != "true":
                break  # vLLM exited: its log below says why
            time.sleep(5)
        logs = subprocess.run([*compose, "logs", "--tail=30"], env=env, capture_output=True, text=True).stdout[-4000:]
        assert health.get("vllm") == "up" and health.get("vllm-triage") == "up", f"{health}\n{logs}"
        groups = json.loads(get(prometheus + "/api/v1/rules", timeout=5)[1])["data"]["groups"]
        alerts = {rule["name"] for group in groups for rule in group["rules"] if rule["type"] == "alerting"}
        assert {"VllmTriageKvCacheSaturated", "VllmTargetDown", "VllmTriageDown"} <= alerts
        # the sidecar sees vLLM's processes through the shared PID namespace (pid: service:vllm)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            query = urllib.parse.quote('vllm_triage_source_up{source="process"}')
            result = json.loads(get(f"{prometheus}/api/v1/query?query={query}", timeout=5)[1])["data"]["result"]
            if result and result[0]["value"][1] == "1":
                break
            time.sleep(5)
        assert result and result[0]["value"][1] == "1", result
        running = run(docker, "ps", "--format", "{{.Names}}").stdout.split()
        assert "vllmtriagetest_vllm_1" in running and not [name for name in running if "grafana" in name]  # its profile is off
    finally:
        subprocess.run([*compose, "down", "--volumes", "--timeout", "20"], env=env, capture_output=True, timeout=300)
