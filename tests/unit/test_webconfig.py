"""TLS and basic auth on the listener from an exporter-toolkit web-config file, against a real sidecar
process, a certificate made with openssl and a bcrypt hash."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from vllm_triage.webconfig import FAILURES_MAX, WebConfig

from harness.components import BIN, start_sidecar
from harness.vllm_server import free_port

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()


def certificate(folder: Path) -> Path:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(folder / "server.key"), "-out", str(folder / "server.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    return folder / "server.crt"


def fetch(url: str, ca: Path, user: str | None = None, password: str = "") -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if user is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=str(ca))) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def start_tls_sidecar(tmp_path: Path, web: str, extra: str = "") -> tuple[subprocess.Popen, str, Path]:
    """A demo sidecar behind the web config `web` (started by hand: start_sidecar waits on plain-HTTP /readyz)."""
    ca = certificate(tmp_path)
    (tmp_path / "web.yml").write_text(web)
    (tmp_path / "sidecar.yaml").write_text(f"web_config_file: {tmp_path / 'web.yml'}\n{extra}")
    port = free_port()
    command = [str(BIN / "vllm-triage"), "serve", "--demo", "--config", str(tmp_path / "sidecar.yaml"), "--listen", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, stdout=open(tmp_path / "sidecar.log", "wb"), stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if fetch(url + "/healthz", ca)[0] == 200:  # open without credentials: a probe needs no secret
                return process, url, ca
        except OSError:
            assert time.monotonic() < deadline, (tmp_path / "sidecar.log").read_text()
            time.sleep(0.3)


def stopped_cleanly(process: subprocess.Popen, log: Path) -> None:
    """SIGTERM, and a clean exit within 30 s; a sidecar still there after that fails the test with where its threads
    wait (py-spy dump) and its log, then is killed."""
    process.terminate()
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        dump = subprocess.run([str(BIN / "py-spy"), "dump", "--pid", str(process.pid)], capture_output=True, text=True, timeout=60)
        process.kill()
        process.wait(timeout=30)
        pytest.fail(f"the sidecar did not exit within 30 s of SIGTERM; its threads:\n{dump.stdout}{dump.stderr}\nits log:\n{log.read_text()[-4000:]}")
    assert code == 0, log.read_text()[-4000:]


TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS12\n"


def test_tls_and_basic_auth_from_an_exporter_toolkit_web_config(tmp_path):
    process, url, ca = start_tls_sidecar(tmp_path, f"{TLS}basic_auth_users:\n  prometheus: '{HASH}'\n")
    port = int(url.rsplit(":", 1)[1])
    try:
        assert fetch(url + "/metrics", ca)[0] == 401
        assert fetch(url + "/metrics", ca, "prometheus", "wrong")[0] == 401
        assert fetch(url + "/diagnosis", ca, "someone", "s3cret")[0] == 401
        assert fetch(url + "/metrics", ca, "prometheus", "x" * 100)[0] == 401  # over bcrypt's 72 bytes: wrong, not a 500
        assert fetch(url + "/metrics", ca, "someone", "x" * 100)[0] == 401
        status, body = fetch(url + "/metrics", ca, "prometheus", "s3cret")
        assert status == 200 and b"vllm_triage_build_info" in body
        # the probes bring no password: a standalone sidecar's readiness probe on /readyz was refused 401 for good
        assert [fetch(url + path, ca)[0] for path in ("/healthz", "/readyz")] == [200, 200]
        with pytest.raises(OSError):  # plain HTTP on the TLS port: no answer
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
    finally:
        stopped_cleanly(process, tmp_path / "sidecar.log")


def test_sighup_reloads_the_web_config_and_the_sidecar_keeps_serving(tmp_path):
    """Prometheus' and Alertmanager's habit: SIGHUP re-reads the configuration; it must not stop the sidecar."""
    process, url, ca = start_tls_sidecar(tmp_path, f"{TLS}basic_auth_users:\n  prometheus: '{HASH}'\n")
    try:
        rotated = bcrypt.hashpw(b"rotated", bcrypt.gensalt(rounds=10)).decode()
        (tmp_path / "web.yml").write_text(f"{TLS}basic_auth_users:\n  prometheus: '{rotated}'\n")
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while fetch(url + "/metrics", ca, "prometheus", "rotated")[0] != 200:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "sidecar.log").read_text()
            time.sleep(0.2)
        assert fetch(url + "/metrics", ca, "prometheus", "s3cret")[0] == 401
        assert "SIGHUP: re-reading" in (tmp_path / "sidecar.log").read_text()
        assert process.poll() is None
    finally:
        stopped_cleanly(process, tmp_path / "sidecar.log")


def test_an_aborted_tls_handshake_gives_its_slot_back_at_once_and_probes_pass_over_the_cap(tmp_path):
    """The review's burst: connects that send part of a ClientHello and abort (RST). Each slot must come back when its
    connection dies, not at the 15 s handshake deadline; and with every slot held, the kubelet's TLS probe still passes."""
    process, url, ca = start_tls_sidecar(tmp_path, TLS, "max_connections: 8\nengine_liveness_endpoint: true\n")
    port = int(url.rsplit(":", 1)[1])
    try:
        for _ in range(3):
            for _ in range(8):
                client = socket.create_connection(("127.0.0.1", port), timeout=5)
                client.sendall(b"\x16\x03\x01\x00\xc8\x01")  # the start of a ClientHello, never finished
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # RST
            time.sleep(0.5)
            assert fetch(url + "/metrics", ca)[0] == 200, (tmp_path / "sidecar.log").read_text()
        held = []
        for _ in range(12):  # every slot held by handshakes that never finish, and more
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(b"\x16\x03\x01\x00\xc8\x01")
            held.append(client)
        time.sleep(0.3)
        assert [fetch(url + "/engine-liveness", ca)[0] for _ in range(5)] == [200] * 5
        for client in held:
            client.close()
    finally:
        stopped_cleanly(process, tmp_path / "sidecar.log")


def test_connections_that_never_finish_a_tls_handshake_give_their_slots_back(tmp_path):
    """A port scan, a TCP load-balancer probe, plain HTTP on the TLS port: each opens a connection and leaves before
    (or instead of) a handshake. Far more of them than the listener's cap must not leave it answering 503 for good."""
    process, url, ca = start_tls_sidecar(tmp_path, TLS, "max_connections: 8\nhttp_header_timeout_seconds: 3\n")
    port = int(url.rsplit(":", 1)[1])
    try:
        for _ in range(40):  # connect and leave at once
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        for _ in range(20):  # plain HTTP to the TLS port
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
        deadline = time.monotonic() + 10  # the aborted handshakes are torn down on the sidecar's loop meanwhile
        while (status := fetch(url + "/healthz", ca)[0]) != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == 200
        assert fetch(url + "/metrics", ca)[0] == 200
    finally:
        stopped_cleanly(process, tmp_path / "sidecar.log")


@pytest.mark.parametrize(
    ("web", "names"),
    [
        ("tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file"),
        ("tls_server_config:\n  cert_file: nowhere.crt\n  key_file: nowhere.key\n", "cannot load"),
        ("basic_auth_users:\n  prometheus: plaintext\n", "basic_auth_users.prometheus"),
        ("http_server_config:\n  http2: true\n", "http_server_config"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n", "client_ca_file"),
    ],
)
def test_a_wrong_web_config_stops_startup_naming_the_key(tmp_path, web, names):
    certificate(tmp_path)
    (tmp_path / "web.yml").write_text(web)
    result = subprocess.run(
        [sys.executable, "-m", "vllm_triage.cli", "serve", "--demo", "--web-config-file", str(tmp_path / "web.yml"), "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and names in result.stderr, result.stderr


def test_without_a_web_config_the_sidecar_still_serves_plain_http(tmp_path):
    sidecar = start_sidecar(tmp_path, "http://127.0.0.1:9", "", "--demo")
    try:
        assert b"vllm_triage_build_info" in urllib.request.urlopen(sidecar.url + "/metrics", timeout=10).read()
    finally:
        sidecar.process.terminate()
        sidecar.process.wait(timeout=30)


def test_a_rotated_certificate_and_new_users_apply_without_a_restart(tmp_path):
    """A cert-manager rotation or a Secret update swaps the files under the same names: the next handshakes present
    the new certificate and the next requests know the new users, as exporter-toolkit re-reads them. A broken file
    is said in the log and the running settings are kept."""
    process, url, served = start_tls_sidecar(tmp_path, TLS)
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes(served.read_bytes())  # the served file is about to be replaced
    try:
        assert fetch(url + "/metrics", old_ca)[0] == 200
        rotated = tmp_path / "rotated"
        rotated.mkdir()
        new_ca = certificate(rotated)
        (tmp_path / "server.crt").write_bytes((rotated / "server.crt").read_bytes())
        (tmp_path / "server.key").write_bytes((rotated / "server.key").read_bytes())
        (tmp_path / "web.yml").write_text(f"{TLS}basic_auth_users:\n  prometheus: '{HASH}'\n")

        def presents_the_new_certificate() -> bool:
            try:
                return fetch(url + "/metrics", new_ca)[0] == 401  # the new certificate, and the new user list
            except OSError:
                return False

        deadline = time.monotonic() + 20  # the files are looked at every 5 s
        while not presents_the_new_certificate():
            assert time.monotonic() < deadline, (tmp_path / "sidecar.log").read_text()
            time.sleep(0.5)
        assert fetch(url + "/metrics", new_ca, "prometheus", "s3cret")[0] == 200
        with pytest.raises(OSError):
            fetch(url + "/metrics", old_ca)
        (tmp_path / "web.yml").write_text("tls_server_config: [not, a, mapping]\n")
        time.sleep(7)
        assert fetch(url + "/metrics", new_ca, "prometheus", "s3cret")[0] == 200  # the running settings are kept
        assert "web config changed but is invalid" in (tmp_path / "sidecar.log").read_text()
    finally:
        stopped_cleanly(process, tmp_path / "sidecar.log")


def test_a_guesser_cannot_lock_out_the_right_password_and_is_slowed_on_a_lane_of_its_own(tmp_path):
    """Right after a start (nothing verified yet) a guesser shares Prometheus' user and address (a mesh proxy: every
    client is 127.0.0.1): its guesses stay 401, and Prometheus' right password from that address passes, never 429.
    Once a key has failed FAILURES_MAX times its checks run paced on their own lane: a right password from elsewhere is
    checked while the guesser's backlog still waits, and a burst from 100 rotating addresses refuses no right password."""
    config = WebConfig(ssl_context=None, users={"prometheus": HASH.encode()})

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    async def scenario() -> None:
        guesses = [await config.check(header("prometheus", f"guess{i}"), "127.0.0.1") for i in range(FAILURES_MAX + 3)]
        assert guesses == [401] * (FAILURES_MAX + 3)
        assert await config.check(header("prometheus", "s3cret"), "127.0.0.1") == 200  # checked, not refused
        config._verified.clear()  # as after a restart
        for i in range(FAILURES_MAX):
            await config.check(header("prometheus", f"again{i}"), "127.0.0.1")
        backlog = [asyncio.ensure_future(config.check(header("prometheus", f"more{i}"), "127.0.0.1")) for i in range(20)]
        await asyncio.sleep(0)
        assert await config.check(header("prometheus", "s3cret"), "10.0.0.9") == 200  # its own lane: not behind them
        assert sum(not task.done() for task in backlog) >= 10  # paced at SUSPECT_CHECK_SECONDS each
        assert set(await asyncio.gather(*backlog)) == {401}
        config._verified.clear()
        rotating = [asyncio.ensure_future(config.check(header("prometheus", f"rot{i}"), f"10.1.0.{i % 100}")) for i in range(200)]
        await asyncio.sleep(0)
        assert await config.check(header("prometheus", "s3cret"), "127.0.0.1") == 200
        assert set(await asyncio.gather(*rotating)) == {401}

    asyncio.run(scenario())


def test_a_guessed_at_address_still_scrapes_with_the_right_password_over_tls(tmp_path):
    process, url, ca = start_tls_sidecar(tmp_path, f"{TLS}basic_auth_users:\n  prometheus: '{HASH}'\n")
    try:
        statuses = [fetch(url + "/metrics", ca, "prometheus", f"guess{i}")[0] for i in range(FAILURES_MAX + 2)]
        assert statuses == [401] * (FAILURES_MAX + 2)
        assert fetch(url + "/metrics", ca, "prometheus", "s3cret")[0] == 200  # never verified before: checked, and passes
        assert fetch(url + "/healthz", ca)[0] == 200
    finally:
        stopped_cleanly(process, tmp_path / "sidecar.log")
