"""An OPA-REST-compatible test server over the embedded engine.

Answers ``POST /v1/data/<path>`` like OPA's Data API (``result``,
``decision_id``, ``provenance.bundles.<name>.revision``) so the REST backend
can be tested without an ``opa`` binary. ``mode`` lets a test make it misbehave.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opa_bindings.engine import OpaError, OpaUndefinedError

from engram_core.policy.bundle import build_engine, read_bundle


class OpaRestTestServer:
    """Serve a bundle directory on 127.0.0.1:<ephemeral>; ``mode`` is normal|no_result|slow|error."""

    def __init__(self, bundle_dir: Path, *, mode: str = "normal", delay_s: float = 1.0) -> None:
        bundle = read_bundle(bundle_dir)
        self.revision = bundle.revision
        self.engine = build_engine(bundle)
        self.mode = mode
        self.delay_s = delay_s
        server = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?", 1)[0]
                if path == "/v1/query":  # OPA's Query API: an ad-hoc query over the same engine
                    self._send(*server.query(request.get("query", ""), request.get("input")))
                    return
                prefix = "/v1/data/"
                if not path.startswith(prefix):
                    self._send(404, {"code": "not_found"})
                    return
                self._send(*server.answer(path[len(prefix):], request.get("input")))

            def _send(self, status: int, body: dict[str, Any]) -> None:
                blob = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def answer(self, path: str, input: Any) -> tuple[int, dict[str, Any]]:
        if self.mode == "slow":
            time.sleep(self.delay_s)
        if self.mode == "error":
            return 500, {"code": "internal_error", "message": "boom"}
        body: dict[str, Any] = {
            "decision_id": str(uuid.uuid4()),
            "provenance": {"version": "test", "bundles": {"engram": {"revision": self.revision}}},
        }
        if self.mode == "no_result":
            return 200, body
        try:
            body["result"] = self.engine.eval_document(path.strip("/").replace("/", "."), input)
        except OpaUndefinedError:
            pass  # OPA answers 200 without "result" for an undefined document
        except OpaError as exc:
            return 500, {"code": "internal_error", "message": str(exc)}
        return 200, body

    def query(self, query: str, input: Any) -> tuple[int, dict[str, Any]]:
        try:
            return 200, {"result": self.engine.eval_query(query, input)}
        except OpaError as exc:  # OPA answers a query that does not compile with 400
            return 400, {"code": "rego_type_error" if "undefined function" in exc.message else "invalid_parameter",
                         "message": str(exc)}

    def __enter__(self) -> OpaRestTestServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self.engine.close()
