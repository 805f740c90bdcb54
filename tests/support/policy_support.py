"""Helpers for the policy-author tests: bundle copies and edits, signing keys, a real HTTP
bundle server and a real decision-log collector, and ``engram serve`` in a subprocess.
(Named uniquely: pytest imports test helpers by basename.)"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from engram_core.api import host_pb2, host_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
ENGRAM = str(Path(sys.executable).with_name("engram"))


# --- bundles ---


def copy_bundle(tmp: Path, name: str = "policies", *, revision: str | None = None) -> Path:
    target = tmp / name
    shutil.copytree(POLICIES, target)
    if revision is not None:
        set_revision(target, revision)
    return target


def set_revision(bundle: Path, revision: str) -> None:
    (bundle / ".manifest").write_text(json.dumps({"revision": revision, "roots": ["engram"]}))


MULTI_COMPONENT_RULE = '''
deny contains lib.reason("TOO_MANY_COMPONENTS", "Captures of more than one component are refused.") if {
	input.components.count > 1
}
'''


def add_capture_rule(bundle: Path, rule: str = MULTI_COMPONENT_RULE) -> None:
    path = bundle / "engram" / "capture" / "capture.rego"
    path.write_text(path.read_text() + rule)


def write_keys(tmp: Path, kind: str = "rsa") -> tuple[Path, Path]:
    """A signing key pair as PEM files (private, public)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if kind == "rsa" else \
        ec.generate_private_key(ec.SECP256R1())
    private = tmp / f"bundle-{kind}.key"
    public = tmp / f"bundle-{kind}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def engram(*argv: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an author runs it."""
    done = subprocess.run([ENGRAM, *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "ENGRAM_SEMANTIC": "off"})
    if check and done.returncode != 0:
        raise AssertionError(f"engram {' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done


class _Server(ThreadingHTTPServer):
    """A test HTTP server that does not print a traceback when a client hangs up early (a core
    closing a pull's connection on stop); anything else is still reported."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


# --- an OPA-compatible bundle server ---


@dataclass
class BundleServer:
    """Serves one bundle archive at ``url`` with an ETag (``304`` to a matching
    ``If-None-Match``), as OPA's bundle service API; ``publish`` swaps it mid-run; ``fail``
    makes the next N requests answer 500."""

    archive: bytes = b""
    requests: list[dict[str, str]] = field(default_factory=list)
    failures_left: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                with server._lock:
                    server.requests.append({"path": self.path, "if_none_match": self.headers.get("If-None-Match", "")})
                    failing = server.failures_left > 0
                    server.failures_left -= 1 if failing else 0
                    blob = server.archive
                etag = '"' + hashlib.sha256(blob).hexdigest()[:32] + '"'
                if failing or not blob or self.path != "/bundles/engram.tar.gz":
                    self.send_response(500 if failing or not blob else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/gzip")
                    self.send_header("ETag", etag)
                    self.send_header("Content-Length", str(len(blob)))
                    self.end_headers()
                    self.wfile.write(blob)

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/bundles/engram.tar.gz"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def publish(self, archive: bytes) -> None:
        with self._lock:
            self.archive = archive

    def fail(self, n: int) -> None:
        with self._lock:
            self.failures_left = n

    def __enter__(self) -> BundleServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# --- an OPA-format decision-log collector ---


@dataclass
class LogCollector:
    """Receives ``POST /logs`` with a gzipped JSON array of events (OPA's decision-log
    upload API); ``status`` is what it answers (the first ``fail_first`` answer 500)."""

    fail_first: int = 0
    batches: list[list[dict[str, Any]]] = field(default_factory=list)
    bodies: list[int] = field(default_factory=list)  # uncompressed sizes
    refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with collector._lock:
                    if collector.refused < collector.fail_first:
                        collector.refused += 1
                        status = 500
                    else:
                        assert self.headers.get("Content-Encoding") == "gzip"
                        raw = gzip.decompress(body)
                        collector.bodies.append(len(raw))
                        collector.batches.append(json.loads(raw))
                        status = 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/logs"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for batch in self.batches for e in batch]

    def __enter__(self) -> LogCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


# --- engram serve in a subprocess ---


@dataclass
class Served:
    proc: subprocess.Popen[str]
    address: str
    data_dir: Path
    log_path: Path
    opened: str

    def health(self) -> host_pb2.HealthResponse:
        with grpc.insecure_channel(self.address) as ch:
            return host_pb2_grpc.HostServiceStub(ch).Health(host_pb2.HealthRequest(), timeout=5)

    def wait_for_revision(self, revision: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            try:
                seen = self.health()
                if seen.policy_revision == revision and seen.status == "SERVING":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"core {self.address} never served revision {revision} (last health: {seen}); "
                             f"log: {self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return self.log_path.read_text()

    def json_events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == name:
                out.append(doc)
        return out

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def serve(data_dir: Path, *extra: str, log_name: str | None = None) -> Served:
    """``engram serve --log-format json`` on ``data_dir`` (port 0), stderr kept in a file."""
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / (log_name or f"{data_dir.name}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([ENGRAM, "serve", "--data", str(data_dir), "--listen", "127.0.0.1:0",
                                 "--log-format", "json", *extra],
                                stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
                                env={**os.environ, "ENGRAM_SEMANTIC": "off", "PYTHONFAULTHANDLER": "1"})
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if "listening on" not in first:
        proc.kill()
        raise AssertionError(f"engram serve did not start: {first!r} {log_path.read_text()[-3000:]}")
    opened = proc.stdout.readline()
    address = first.split("listening on ", 1)[1].split()[0]
    return Served(proc=proc, address=address, data_dir=data_dir, log_path=log_path, opened=opened)
