"""TLS and basic auth on the sidecar's listener, from a web-config file in the Prometheus exporter-toolkit
format (the file node_exporter, dcgm-exporter's peers and Prometheus itself take with --web.config.file),
so one file serves every exporter of a cluster:

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to the file
      key_file: server.key
      client_auth_type: NoClientCert # or RequireAndVerifyClientCert (with client_ca_file), ...
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

/healthz and /engine-liveness stay open (a probe brings no secret; they tell little); every other path asks for a user.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .config_loader import read_yaml_mapping
from .options import ConfigError

TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version")
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
OPEN_PATHS = ("/healthz", "/readyz", "/engine-liveness")  # probes: the kubelet brings no password


# Every password is checked: a lockout that refuses without a check would refuse Prometheus' right password too
# whenever a guesser shares its user name and address (every client is 127.0.0.1 behind a mesh proxy or a
# port-forward). Guessing is slowed instead. A (user, address) with FAILURES_MAX failures within FAILURE_WINDOW_SECONDS
# is checked on a lane of its own, paced to one check per SUSPECT_CHECK_SECONDS, so a guesser's backlog never delays
# the checks of anyone else: clean keys, and every new start's first scrape, run on the first lane. Both lanes queue at
# most what the connection cap lets in. Verified credentials (Prometheus every scrape) are cached and need no check.
_BCRYPT = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")
_BCRYPT_SUSPECT = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt-suspect")
FAILURES_MAX = 10
FAILURE_WINDOW_SECONDS = 60.0
SUSPECT_CHECK_SECONDS = 0.25  # ~50 ms of bcrypt and the rest idle: a guesser gets 4 checks a second and a fifth of a core
KEYS_TRACKED_MAX = 4096  # failing (user, address) keys remembered; the oldest are forgotten first


def _check(password: bytes, hashed: bytes) -> bool:
    """bcrypt's check; a password it refuses (over 72 bytes: bcrypt 5 raises) is a wrong one, not a server error."""
    import bcrypt  # only where users are configured: most sidecars never load it

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:
        return False


def _paced_check(password: bytes, hashed: bytes) -> bool:
    started = time.monotonic()
    result = _check(password, hashed)
    time.sleep(max(0.0, SUSPECT_CHECK_SECONDS - (time.monotonic() - started)))
    return result


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None
    users: dict[str, bytes]  # name -> bcrypt hash
    file: str | None = None  # the web config file, re-read by refresh()
    files: tuple[Path, ...] = ()  # the files it names (certificate, key, client CA)
    _fingerprint: bytes = b""
    _verified: set[tuple[str, bytes]] = field(default_factory=set)  # bcrypt costs ~50 ms: a scrape every 15 s would pay it each time
    _failures: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (user, address) -> its recent failures (monotonic)

    def refresh(self) -> str | None:
        """Re-read the web config and the files it names when any changed, as exporter-toolkit does: a rotated
        certificate serves the next handshakes, changed users the next requests. What was done or refused, for
        the log (the listener cannot turn TLS on or off in place); None when nothing changed."""
        if self.file is None:
            return None
        fingerprint = _fingerprint(self.file, self.files)
        if fingerprint == self._fingerprint:
            return None
        self._fingerprint = fingerprint
        try:
            fresh = load_web_config(self.file)
        except ConfigError as error:
            return f"web config changed but is invalid; the running one is kept: {error}"
        if (fresh.ssl_context is None) != (self.ssl_context is None):
            return f"web config {self.file} turns TLS {'on' if fresh.ssl_context else 'off'}: that needs a restart; the listener is kept as it is"
        if self.ssl_context is not None and fresh.ssl_context is not None:
            cert, key, *ca = fresh.files
            self.ssl_context.load_cert_chain(cert, key)  # the same context: the listener's next handshakes use it
            for ca_file in ca:
                self.ssl_context.load_verify_locations(ca_file)
            self.ssl_context.verify_mode = fresh.ssl_context.verify_mode
            self.ssl_context.minimum_version, self.ssl_context.maximum_version = fresh.ssl_context.minimum_version, fresh.ssl_context.maximum_version
        # credentials verified against a hash that did not change stay verified: Prometheus needs no new check after an edit
        self._verified = {(user, digest) for user, digest in self._verified if fresh.users.get(user) == self.users.get(user)}
        self.users, self.files = fresh.users, fresh.files
        self._fingerprint = _fingerprint(self.file, self.files)
        return f"web config {self.file} changed: applied (certificate, users)"

    async def check(self, header: str | None, client: str = "") -> int:
        """200 when the request may pass, 401 for no or wrong credentials. A password that verifies always passes: a
        (user, address) that keeps failing is only checked more slowly, on a lane of its own."""
        if not self.users:
            return 200
        if not header or not header.startswith("Basic "):
            return 401
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return 401
        hashed = self.users.get(user)
        digest = hashlib.sha256(password.encode()).digest()
        if hashed is not None and (user, digest) in self._verified:
            return 200
        now = time.monotonic()
        key = (user, client)
        recent = [t for t in self._failures.get(key, []) if now - t < FAILURE_WINDOW_SECONDS]
        lane, check = (_BCRYPT_SUSPECT, _paced_check) if len(recent) >= FAILURES_MAX else (_BCRYPT, _check)
        # An unknown user costs a bcrypt check too (as exporter-toolkit does): the answer's time does not tell which
        # user names exist. Never the default executor, which parses vLLM's page.
        reference = hashed or self.users[next(iter(self.users))]
        known = await asyncio.get_running_loop().run_in_executor(lane, check, password.encode(), reference)
        if known and hashed is not None:
            self._verified.add((user, digest))
            self._failures.pop(key, None)
            return 200
        self._failures.pop(key, None)  # re-inserted last: the dict's order is the forgetting order
        self._failures[key] = [*recent, now][-FAILURES_MAX:]
        while len(self._failures) > KEYS_TRACKED_MAX:
            del self._failures[next(iter(self._failures))]
        return 401

    def middleware(self) -> Callable[[web.Request, Callable[[web.Request], Awaitable[web.StreamResponse]]], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def basic_auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
            if request.path in OPEN_PATHS:
                return await handler(request)
            if await self.check(request.headers.get("Authorization"), request.remote or "") == 200:
                return await handler(request)
            return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="vllm-triage"'})

        return basic_auth


def _bad(path: Path, key: str, problem: str) -> ConfigError:
    return ConfigError(f"web config {path}: {key}: {problem}")


def load_web_config(file: str) -> WebConfig:
    path = Path(file)
    document = read_yaml_mapping(file, "web config file")
    unknown = sorted(set(document) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise _bad(path, unknown[0], "not supported here (tls_server_config and basic_auth_users are)")
    raw = document.get("tls_server_config")
    files = tuple(path.parent / str(raw[k]) for k in ("cert_file", "key_file", "client_ca_file") if isinstance(raw, dict) and raw.get(k))
    web = WebConfig(_tls(path, raw), _users(path, document.get("basic_auth_users")), file, files)
    web._fingerprint = _fingerprint(file, files)
    return web


def _fingerprint(file: str, files: tuple[Path, ...]) -> bytes:
    """What the web config's files hold now (a ConfigMap or Secret update swaps them under the same names)."""
    digest = hashlib.sha256()
    for name in (Path(file), *files):
        try:
            digest.update(name.read_bytes())
        except OSError as error:
            digest.update(str(error).encode())
    return digest.digest()


def _tls(path: Path, raw: Any) -> ssl.SSLContext | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad(path, "tls_server_config", "expected a mapping")
    unknown = sorted(set(raw) - set(TLS_KEYS))
    if unknown:
        raise _bad(path, f"tls_server_config.{unknown[0]}", f"not supported here (supported: {', '.join(TLS_KEYS)})")
    for required in ("cert_file", "key_file"):
        if not raw.get(required):
            raise _bad(path, f"tls_server_config.{required}", "required")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert, key = (path.parent / str(raw["cert_file"]), path.parent / str(raw["key_file"]))
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise _bad(path, "tls_server_config.cert_file/key_file", f"cannot load {cert} with {key}: {error}") from None
    mode = str(raw.get("client_auth_type", "NoClientCert"))
    if mode not in CLIENT_AUTH:
        raise _bad(path, "tls_server_config.client_auth_type", f"{mode!r}; expected one of {', '.join(CLIENT_AUTH)}")
    context.verify_mode = CLIENT_AUTH[mode]
    if raw.get("client_ca_file"):
        try:
            context.load_verify_locations(path.parent / str(raw["client_ca_file"]))
        except (OSError, ssl.SSLError) as error:
            raise _bad(path, "tls_server_config.client_ca_file", str(error)) from None
    elif mode in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert"):
        raise _bad(path, "tls_server_config.client_ca_file", f"required with client_auth_type {mode}")
    for version_key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if version_key in raw:
            if raw[version_key] not in VERSIONS:
                raise _bad(path, f"tls_server_config.{version_key}", f"{raw[version_key]!r}; expected one of {', '.join(VERSIONS)}")
            setattr(context, attribute, VERSIONS[raw[version_key]])
    return context


def _users(path: Path, raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _bad(path, "basic_auth_users", "expected a mapping of user name to bcrypt hash")
    users = {}
    for user, hashed in raw.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")):
            raise _bad(path, f"basic_auth_users.{user}", "expected a bcrypt hash ($2y$..., e.g. from htpasswd -nB), never a plain password")
        users[str(user)] = text.encode()
    return users
