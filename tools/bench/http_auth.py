"""What authentication adds to a tool call over HTTP (issue 29; target: <= 0.5 ms p50 for JWTs).

    .venv/bin/python -m tools.bench.http_auth                     # the layer, then end to end
    .venv/bin/python -m tools.bench.http_auth --no-end-to-end --reps 2000
    .venv/bin/python -m tools.bench.http_auth --out result.json

Two measurements, in one run:

- **layer** (in-process, no network): one HTTP request through the adapter's authentication
  stack as ``adapters/mcp/http_app.py`` assembles it (Starlette's AuthenticationMiddleware with the
  SDK's BearerAuthBackend, AuthContextMiddleware, RequireAuthMiddleware, and for OAuth the scope
  challenge) in front of an endpoint that answers at once, against the same endpoint without
  authentication; for a JWT access token (ES256 and RS256, the JWKS fetched once and cached, the
  caller's binding decision cached as in service) and for a static bearer token: the steady
  state of a session, which sends one token with every call. Also ``verify_token`` alone on a
  token it has not seen (the full signature and claims check a token's first call pays). The difference of the p50s is the cost per tool call. Each request is
  timed twice: wall clock, and the CPU time of the thread that ran it (``time.thread_time``),
  which a shared machine's other processes do not inflate; the CPU figure is the cost itself.
- **end to end**: a real core and two `engram mcp --http` processes over one data directory,
  one with a static token and one an OAuth resource server (its issuer a small metadata + JWKS
  server in this process), and the official SDK client calling engram_memory_get on each, in
  random order per round so that a shared machine slows both alike. Prints both p50/p99 and the
  difference; on a loaded machine that difference is noise-bound (a tool call is milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from tools.bench import machine
from tools.bench.report import print_and_save
from tools.bench.stats import percentile

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "http://127.0.0.1:8765/mcp"
SCOPES = "engram:read engram:write engram:forget"


class Issuer:
    """An issuer's published documents (metadata and JWKS) on a loopback port, for the adapter to fetch."""

    def __init__(self) -> None:
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        keys = [{**json.loads(ECAlgorithm.to_jwk(self.ec.public_key())), "kid": "ec-1", "alg": "ES256", "use": "sig"},
                {**json.loads(RSAAlgorithm.to_jwk(self.rsa.public_key())), "kid": "rsa-1", "alg": "RS256",
                 "use": "sig"}]
        documents: dict[str, bytes] = {}
        self.fetches = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler) -> None:  # noqa: N802, N805
                body = documents.get(handler.path)
                self.fetches += handler.path == "/jwks"
                handler.send_response(200 if body else 404)
                handler.send_header("content-type", "application/json")
                handler.end_headers()
                handler.wfile.write(body or b"{}")

            def log_message(handler, *args: Any) -> None:  # noqa: N805
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        documents["/.well-known/oauth-authorization-server"] = json.dumps(
            {"issuer": self.url, "jwks_uri": self.url + "/jwks"}).encode()
        documents["/jwks"] = json.dumps({"keys": keys}).encode()
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def token(self, alg: str, *, resource: str, subject: str = "ada", ttl_s: int = 3600) -> str:
        now = int(time.time())
        claims = {"iss": self.url, "sub": subject, "aud": resource, "iat": now, "exp": now + ttl_s,
                  "jti": uuid.uuid4().hex, "scope": SCOPES, "client_id": "bench-client", "engram_tenant": "bench"}
        key, kid = (self.ec, "ec-1") if alg == "ES256" else (self.rsa, "rsa-1")
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid, "typ": "at+jwt"})

    def close(self) -> None:
        self._server.shutdown()


def bundle_for(directory: Path, issuer: str, *, tenant: str = "bench", workspace: str = "main") -> Path:
    bundle = directory / "policies"
    shutil.copytree(REPO / "policies", bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["binding"]["issuers"] = {issuer: {
        "tenant": tenant, "workspace": workspace, "purpose_ref": "purpose:bench"}}
    (bundle / "data.json").write_text(json.dumps(data))
    return bundle


def _summary(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in samples_s)
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 4), "p99_ms": round(percentile(ms, 99), 4),
            "mean_ms": round(statistics.fmean(ms), 4)}


# ---- layer ------------------------------------------------------------------------------------

async def _layer(reps: int, directory: Path) -> dict[str, Any]:
    from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
    from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
    from starlette.middleware.authentication import AuthenticationMiddleware

    from adapters.mcp.config import token_digest
    from adapters.mcp.http_app import AuthorizationServerDown, ScopeChallenge, exact_url
    from adapters.mcp.http_security import DigestTokenVerifier
    from adapters.mcp.oauth.caller_binding import CallerBindings
    from adapters.mcp.oauth.resource_server import build_resource_server, policy_engine
    from adapters.mcp.oauth.settings import OAuthSettings

    issuer = Issuer()
    try:
        settings = OAuthSettings(issuer=issuer.url, resource=RESOURCE, policies=bundle_for(directory, issuer.url))
        engine = policy_engine(settings)
        callers = CallerBindings(engine, cache_s=settings.binding_cache_s)
        rs = build_resource_server(settings, served_url=RESOURCE, callers=callers)

        async def endpoint(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        def stacked(verifier: Any, *, oauth: bool) -> Any:
            app: Any = endpoint
            if oauth:
                app = ScopeChallenge(app, callers=callers, resource_metadata_url=RESOURCE)
            app = RequireAuthMiddleware(app, [], None)
            app = AuthContextMiddleware(app)
            app = AuthenticationMiddleware(app, backend=BearerAuthBackend(
                verifier, resource_server_url=exact_url(RESOURCE) if oauth else None))
            return AuthorizationServerDown(app)

        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "engram_memory_get", "arguments": {"record_id": "mem_" + "a" * 52,
                                                       "purpose_ref": "purpose:bench"}}}).encode()

        async def request(app: Any, token: str | None) -> int:
            headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1:8765")]
            if token is not None:
                headers.append((b"authorization", b"Bearer " + token.encode()))
            scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "query_string": b"",
                     "scheme": "http", "server": ("127.0.0.1", 8765), "client": ("127.0.0.1", 1), "root_path": ""}
            sent = False
            status = 0

            async def receive() -> dict[str, Any]:
                nonlocal sent
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]

            await app(scope, receive, send)
            return status

        static = "bench-static-token-" + uuid.uuid4().hex
        paths = {
            "none": (endpoint, None),
            "static_token": (stacked(DigestTokenVerifier(frozenset({token_digest(static)})), oauth=False), static),
            "jwt_es256": (stacked(rs.verifier, oauth=True), issuer.token("ES256", resource=RESOURCE)),
            "jwt_rs256": (stacked(rs.verifier, oauth=True), issuer.token("RS256", resource=RESOURCE)),
        }
        for app, token in paths.values():  # warm: fetch the JWKS, decide and cache the binding
            assert await request(app, token) == 200
        samples: dict[str, list[float]] = {name: [] for name in paths}
        cpu: dict[str, list[float]] = {name: [] for name in paths}
        verify: dict[str, list[float]] = {"jwt_es256": [], "jwt_rs256": []}
        verify_cpu: dict[str, list[float]] = {"jwt_es256": [], "jwt_rs256": []}
        names = list(paths)
        for _ in range(reps):
            random.shuffle(names)
            for name in names:
                app, token = paths[name]
                started, started_cpu = time.perf_counter(), time.thread_time()
                status = await request(app, token)
                samples[name].append(time.perf_counter() - started)
                cpu[name].append(time.thread_time() - started_cpu)
                assert status == 200, (name, status)
                if name in verify:
                    fresh = issuer.token(name[-5:].upper(), resource=RESOURCE)  # never seen: no cached verification
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    assert await rs.verifier.verify_token(fresh) is not None
                    verify[name].append(time.perf_counter() - started)
                    verify_cpu[name].append(time.thread_time() - started_cpu)
        wall = {name: _summary(s) for name, s in samples.items()}
        on_cpu = {name: _summary(s) for name, s in cpu.items()}
        return {
            "requests_wall": wall,
            "requests_cpu": on_cpu,
            "verify_first_use_wall": {name: _summary(s) for name, s in verify.items()},
            "verify_first_use_cpu": {name: _summary(s) for name, s in verify_cpu.items()},
            "added_p50_ms_wall": {n: round(wall[n]["p50_ms"] - wall["none"]["p50_ms"], 4) for n in wall if n != "none"},
            "added_p50_ms_cpu": {n: round(on_cpu[n]["p50_ms"] - on_cpu["none"]["p50_ms"], 4)
                                 for n in on_cpu if n != "none"},
            "jwks_fetches": issuer.fetches,
        }
    finally:
        issuer.close()


# ---- end to end -------------------------------------------------------------------------------

async def _end_to_end(rounds: int, directory: Path) -> dict[str, Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from engram_core.app.composition import start_core
    from tests.support.mcp_helpers import (  # the test suite's own process helpers
        Core,
        activate,
        capture_args,
        free_port,
        start_http_adapter,
        stop,
        write_config,
    )

    issuer = Issuer()
    running = start_core(directory / "core", semantic=False)
    adapters = []
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "bench", "main")
        token_file = directory / "static.token"
        static = "bench-static-" + uuid.uuid4().hex
        token_file.write_text(static)
        token_file.chmod(0o600)
        binding = {"tenant": "bench", "workspace": "main", "principal": "user:ada", "agent_id": "bench-client",
                   "session": "bench", "purpose_ref": "purpose:bench"}
        static_config = write_config(directory / "static.toml", address=core.address, signing_key=core.host_key_path,
                                     binding=binding, extra=f'[http]\ntoken_file = "{token_file}"')
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        oauth_config = write_config(directory / "oauth.toml", address=core.address, signing_key=core.host_key_path,
                                    extra=f'[http.oauth]\nissuer = "{issuer.url}"\n'
                                          f'policies = "{bundle_for(directory, issuer.url)}"')
        adapters.append(start_http_adapter(static_config))
        adapters.append(start_http_adapter(oauth_config, port=port))
        clients = {
            "static_token": Client(streamable_http_client(adapters[0].url, http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {static}"}, timeout=60))),
            "jwt_es256": Client(streamable_http_client(url, http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {issuer.token('ES256', resource=url)}"}, timeout=60))),
        }
        samples: dict[str, list[float]] = {name: [] for name in clients}
        async with clients["static_token"] as first, clients["jwt_es256"] as second:
            opened = {"static_token": first, "jwt_es256": second}
            captured = (await first.call_tool("engram_memory_capture", capture_args(
                "bench-capture-" + uuid.uuid4().hex, "The bench keeps one note.", purpose="purpose:bench"))
                        ).structured_content["output"]["value"]
            admitted = (await first.call_tool("engram_memory_request_admission", {
                "candidate_id": captured["candidate_id"], "idempotency_key": "bench-admit-" + uuid.uuid4().hex})
                        ).structured_content["output"]["value"]
            arguments = {"record_id": admitted["outcome"]["record_id"], "purpose_ref": "purpose:bench"}
            names = list(opened)
            for i in range(rounds + 20):
                random.shuffle(names)
                for name in names:
                    started = time.perf_counter()
                    result = await opened[name].call_tool("engram_memory_get", arguments)
                    elapsed = time.perf_counter() - started
                    if not (result.structured_content or {}).get("ok"):
                        raise RuntimeError(f"{name}: {result.structured_content}")
                    if i >= 20:  # the first rounds warm both paths
                        samples[name].append(elapsed)
        out = {name: _summary(s) for name, s in samples.items()}
        return {"get": out, "added_p50_ms": round(out["jwt_es256"]["p50_ms"] - out["static_token"]["p50_ms"], 4)}
    finally:
        for adapter in adapters:
            stop(adapter)
        running.stop()
        issuer.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.http_auth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3000, help="layer: requests per path (default 3000)")
    p.add_argument("--rounds", type=int, default=300, help="end to end: gets per adapter (default 300)")
    p.add_argument("--no-end-to-end", action="store_true", help="the layer only (no core, no adapters)")
    p.add_argument("--out", default=None, help="write the result as JSON here too")
    a = p.parse_args(argv)
    result: dict[str, Any] = {"machine": machine.facts(), "loadavg_before": machine.loadavg(),
                              "note": "the machine may be shared: see loadavg"}
    with tempfile.TemporaryDirectory(prefix="engram-http-auth-") as tmp:
        result["layer"] = asyncio.run(_layer(a.reps, Path(tmp) / "layer"))
        if not a.no_end_to_end:
            (Path(tmp) / "e2e").mkdir()
            result["end_to_end"] = asyncio.run(_end_to_end(a.rounds, Path(tmp) / "e2e"))
    result["loadavg_after"] = machine.loadavg()
    print_and_save(result, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
