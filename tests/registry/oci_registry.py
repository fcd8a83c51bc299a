"""A real registry on loopback for the registry tests, and a counting proxy in front of it.

``RegistryServer`` runs Debian's ``docker-registry`` (the CNCF distribution registry, which
.ci/run installs with apt-get) with a minimal config: filesystem storage in a temporary folder,
http on 127.0.0.1 and a free port, deletes enabled. ``CountingProxy`` is a threaded http.server
that forwards every request to it and counts what it answers: the bytes of each successful GET
body by kind (manifests, blobs), and every request as (method, path, status). It can also stand in
for what the registry is not configured to do: answer failures (``fail_next``: 429, 503, a
dropped connection) and require authentication (``require``: Basic, or Bearer tokens from a
token endpoint it serves itself, with the scopes a registry's challenges name).

    server = RegistryServer(tmp).start();  proxy = CountingProxy(server.host).start()
    ... push/pull against proxy.host ...;  proxy.blob_bytes, proxy.requests
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BINARY = "/usr/bin/docker-registry"
CONFIG = """version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def registry_binary() -> str | None:
    """The registry program, or None where it is not installed."""
    return BINARY if os.access(BINARY, os.X_OK) else shutil.which("docker-registry")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RegistryServer:
    """``docker-registry serve`` on 127.0.0.1, storing under ``folder/storage``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.storage = self.folder / "storage"
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RegistryServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "config.yml"
        config.write_text(CONFIG.format(root=self.storage, port=self.port))
        self.log = open(self.folder / "registry.log", "wb")
        self.process = subprocess.Popen([registry_binary(), "serve", str(config)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.folder / "registry.log").read_text()
                raise RuntimeError(f"docker-registry exited: {log}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/v2/")
                if conn.getresponse().status == 200:
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("docker-registry did not answer on /v2/ within 15 s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.log.close()
            self.process = None

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (the filesystem driver's layout)."""
        hexd = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"errors": [{"code": code, "message": message}]}).encode()


def _kind(path: str) -> str:
    for kind in ("blobs", "manifests", "referrers", "uploads"):
        if f"/{kind}/" in path:
            return "uploads" if "/blobs/uploads/" in path else kind
    return "other"


def _needed_scopes(method: str, path: str) -> list[str]:
    """The token scopes a registry asks for this request (as distribution's challenges do)."""
    parts = urllib.parse.urlsplit(path)
    rest = parts.path.removeprefix("/v2/")
    for marker in ("/manifests/", "/blobs/", "/referrers/", "/tags/"):
        if marker in rest:
            repo = rest.split(marker, 1)[0]
            break
    else:
        return []
    scopes = [f"repository:{repo}:{'pull' if method in ('GET', 'HEAD') else 'pull,push'}"]
    source = urllib.parse.parse_qs(parts.query).get("from")
    if source:
        scopes.append(f"repository:{source[0]}:pull")
    return scopes


class _QuietServer(ThreadingHTTPServer):
    """A client closing its kept-alive connection is no error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request, client_address):
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class CountingProxy:
    """A forwarding proxy to ``upstream`` (HOST:PORT) on a free loopback port."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.lock = threading.Lock()
        self.reset()
        self.auth: str | None = None      # None, "basic" or "bearer"
        self.users: dict[str, str] = {}
        self.tokens: dict[str, set[str]] = {}   # token -> scopes granted
        # the OCI 1.1 referrers API, which docker-registry 2.8 lacks: played here when True
        self.referrers = False
        self._referrers: dict[str, list[dict]] = {}   # subject digest -> referrer descriptors
        self.token_requests: list[dict] = []
        self._faults: list[list] = []       # [count, status or "drop", path substring, method]
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):   # quiet
                pass

            def _any(self):
                proxy._handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

        self.server = _QuietServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> CountingProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- what the tests set and read

    def reset(self) -> None:
        with self.lock:
            self.requests: list[tuple[str, str, int]] = []
            self.bytes = {"blobs": 0, "manifests": 0, "referrers": 0}

    @property
    def blob_bytes(self) -> int:
        return self.bytes["blobs"]

    def served_bytes(self) -> int:
        """Bytes of every successful GET body of a manifest or a blob."""
        return self.bytes["blobs"] + self.bytes["manifests"]

    def requested(self, kind: str, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.requests if _kind(p) == kind and method in (None, m)]

    def fail_next(self, count: int, status, path_contains: str = "/v2/",
                  method: str | None = None) -> None:
        """Answer the next ``count`` requests (of ``method``, when given) whose path contains
        ``path_contains`` with ``status`` (an HTTP status, or "drop" to close the connection
        without an answer)."""
        self._faults.append([count, status, path_contains, method])

    def require(self, auth: str | None, users: dict[str, str] | None = None) -> None:
        """Require authentication: "basic", "bearer" (tokens from /token), or None."""
        self.auth, self.users, self.tokens = auth, dict(users or {}), {}

    # ---- forwarding

    def _fault(self, method: str, path: str):
        with self.lock:
            for f in self._faults:
                if f[0] > 0 and f[2] in path and f[3] in (None, method):
                    f[0] -= 1
                    return f[1]
        return None

    def _basic_ok(self, header: str) -> bool:
        if not header.startswith("Basic "):
            return False
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return self.users.get(user) == password and user in self.users

    def _reply(self, h, status: int, body: bytes = b"", headers=()) -> None:
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _token_endpoint(self, h) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(h.path).query)
        self.token_requests.append(query)
        if self.users and not self._basic_ok(h.headers.get("Authorization", "")):
            return self._reply(h, 401, b'{"details":"bad credentials"}')
        token = secrets.token_hex(8)
        self.tokens[token] = set()
        for scope in query.get("scope", []):
            _, repo, actions = scope.split(":")
            self.tokens[token].update(f"repository:{repo}:{a}" for a in actions.split(","))
        self._reply(h, 200, json.dumps({"token": token}).encode(),
                    [("Content-Type", "application/json")])

    def _authorized(self, h) -> bool:
        header = h.headers.get("Authorization", "")
        needed = _needed_scopes(h.command, h.path)
        if self.auth == "basic":
            if self._basic_ok(header):
                return True
            challenge = 'Basic realm="mlpack-test"'
        else:
            granted = self.tokens.get(header.removeprefix("Bearer ").strip(), None) \
                if header.startswith("Bearer ") else None
            if granted is not None and all(
                    f"repository:{s.split(':')[1]}:{a}" in granted
                    for s in needed for a in s.split(":")[2].split(",")):
                return True
            challenge = (f'Bearer realm="http://{self.host}/token",service="mlpack-test"'
                         + (f',scope="{" ".join(needed)}"' if needed else ""))
        self._reply(h, 401, _error_body("UNAUTHORIZED", "authentication required"),
                    [("WWW-Authenticate", challenge), ("Content-Type", "application/json")])
        with self.lock:
            self.requests.append((h.command, h.path, 401))
        return False

    def _note_referrer(self, body: bytes, digest: str) -> str | None:
        """Record a manifest with a ``subject`` as its subject's referrer; the subject's digest."""
        doc = json.loads(body)
        subject = (doc.get("subject") or {}).get("digest")
        if subject:
            desc = {"mediaType": doc.get("mediaType"), "digest": digest, "size": len(body),
                    "artifactType": doc.get("artifactType")}
            with self.lock:
                if desc not in self._referrers.setdefault(subject, []):
                    self._referrers[subject].append(desc)
        return subject

    def _answer_referrers(self, h) -> None:
        parts = urllib.parse.urlsplit(h.path)
        subject = parts.path.rsplit("/", 1)[1]
        wanted = urllib.parse.parse_qs(parts.query).get("artifactType")
        found = [d for d in self._referrers.get(subject, [])
                 if not wanted or d["artifactType"] in wanted]
        index = "application/vnd.oci.image.index.v1+json"
        body = json.dumps({"schemaVersion": 2, "mediaType": index, "manifests": found}).encode()
        with self.lock:
            self.requests.append((h.command, h.path, 200))
            self.bytes["referrers"] += len(body)
        self._reply(h, 200, body, [("Content-Type", index)])

    def _handle(self, h) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if h.path.startswith("/token"):
            return self._token_endpoint(h)
        if self.auth and not self._authorized(h):
            return
        if self.referrers and h.command == "GET" and "/referrers/" in h.path:
            return self._answer_referrers(h)
        fault = self._fault(h.command, h.path)
        if fault == "drop":
            with self.lock:
                self.requests.append((h.command, h.path, 0))
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None:
            with self.lock:
                self.requests.append((h.command, h.path, fault))
            return self._reply(h, fault, _error_body("UNAVAILABLE", "injected"),
                               [("Retry-After", "0")] if fault == 429 else [])
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP | {"authorization"}}
        conn = http.client.HTTPConnection(*self.upstream.split(":"), timeout=60)
        conn.request(h.command, h.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        with self.lock:
            self.requests.append((h.command, h.path, resp.status))
            kind = _kind(h.path)
            if h.command == "GET" and 200 <= resp.status < 300 and kind in self.bytes:
                self.bytes[kind] += len(data)
        h.send_response(resp.status)
        if self.referrers and h.command == "PUT" and _kind(h.path) == "manifests" \
                and resp.status == 201:
            subject = self._note_referrer(body, resp.getheader("Docker-Content-Digest"))
            if subject:
                h.send_header("OCI-Subject", subject)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                h.send_header(k, v)
        h.send_header("Content-Length", resp.getheader("Content-Length", str(len(data)))
                      if h.command == "HEAD" else str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)


__all__ = ["RegistryServer", "CountingProxy", "registry_binary", "free_port"]
