"""The sidecar's image, built and run for real: a Docker engine started for the test, a Debian base made
locally with mmdebstrap (no image registry is reachable here; the Dockerfile's BASE argument takes it in
place of python:3.12-slim), the image built from the repository's Dockerfile and run as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.components import REPO, get
from tests.support.vllm_server import free_port

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
    port = free_port()
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
