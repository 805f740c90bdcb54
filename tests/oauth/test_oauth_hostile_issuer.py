"""The resource server against a hostile or slow identity provider (issue 57, holes 3-5).

The provider here is a real HTTP server on loopback that misbehaves on purpose: it answers every
introspection (and counts them), serves 64 MiB documents (chunked, or with the length declared up
front) and counts the bytes it managed to send before the adapter hung up, and drips documents a
byte a second. The adapter side is the real assembly (``build_resource_server``, its httpx2 client
and verifier) in-process, and, for the timing of the 503, real ``engram mcp --http`` processes.

- made-up opaque tokens cost at most the introspection budget, a person already signed in keeps
  working through the flood, and a dead token repeated is asked about once;
- a 64 MiB key set, metadata document or introspection answer is abandoned after about 1 MiB;
- a key set, metadata or introspection answer dripped a byte a second is a 503 within seconds for
  the first caller and for a second one arriving while the first waits (clients give up at ~16 s);
- the deadlines that bound those waits are the configured ones (``fetch_deadline_s``,
  ``check_deadline_s``): the adapters here run with 1 s and 1.5 s instead of the default 5 s and
  8 s, so the 503 comes before either default could have ended the wait, and the verifier ends a
  check at its own deadline while a fetch would still be allowed to go on.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import httpx2
import pytest

from adapters.mcp.oauth.caller_binding import CallerBindings
from adapters.mcp.oauth.fetch import MAX_DOCUMENT_BYTES, fetch_json
from adapters.mcp.oauth.introspection import BURST_S
from adapters.mcp.oauth.jwks import JwksCache
from adapters.mcp.oauth.resource_server import ResourceServer, build_resource_server, policy_engine
from adapters.mcp.oauth.settings import DEFAULT_FETCH_DEADLINE_S, parse_oauth
from adapters.mcp.oauth.verifier import AuthorizationServerUnavailable, OAuthTokenVerifier
from engram_core.app.composition import start_core
from tests.support.idp_support import SCOPES, binding_bundle, new_key
from tests.support.mcp_helpers import HttpAdapter, free_port, start_http_adapter, stop, write_config

pytestmark = pytest.mark.anyio
RESOURCE = "http://127.0.0.1:9/mcp"  # the in-process resource server is never reached over HTTP
SECRET_ENV = "ENGRAM_TEST_HOSTILE_INTROSPECTION_SECRET"
HUGE_BYTES = 64 * 1024 * 1024
CHUNK = 64 * 1024
DRIP_BODY = json.dumps({"keys": [], "active": False, "pad": " " * 40}).encode()  # ~70 s at a byte a second
CLIENT_GIVES_UP_S = 16.0
# The adapters' deadlines here, short so a test does not wait out the defaults (5 s, 8 s).
FETCH_S = 1.0
CHECK_S = 1.5
# The check deadline and a loaded machine's slack: still before the default fetch deadline, so an
# adapter that ignored the configured ones would be late.
PROMPT_503_S = CHECK_S + 3.0
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}


class HostileIssuer(ThreadingHTTPServer):
    """An issuer at ``base``. Paths holding ``huge`` answer 64 MiB chunked, ``declared`` 64 MiB
    with Content-Length, ``drip`` a byte a second; introspection of a token starting with one of
    those words does the same; a token in ``active`` is active, any other inactive."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.base = f"http://127.0.0.1:{self.server_port}"
        self.introspections = 0
        self.active: dict[str, dict] = {}
        self.sent: dict[str, int] = {}  # what a huge or dripped answer got out before the connection ended
        self.ended = threading.Condition()
        self.stopping = threading.Event()

    def record(self, what: str, sent: int) -> None:
        with self.ended:
            self.sent[what] = self.sent.get(what, 0) + sent
            self.ended.notify_all()

    def wait_for(self, what: str, answers: int = 1, timeout: float = 60.0) -> int:
        """Bytes sent in the ``answers`` answers of kind ``what``, once they have all ended."""
        with self.ended:
            assert self.ended.wait_for(lambda: self.sent.get(f"{what}#count", 0) >= answers, timeout=timeout)
            return self.sent.get(what, 0)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HostileIssuer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path
        kind = next((k for k in ("huge", "declared", "drip") if k in path), None)
        if kind is not None:
            return self._misbehave(kind, "metadata" if "/.well-known/" in path else "jwks")
        if "/.well-known/" in path:
            return self._json({"issuer": self.server.base, "jwks_uri": self.server.base + "/jwks",
                               "introspection_endpoint": self.server.base + "/introspect"})
        return self._json({"keys": []}, status=404)

    def do_POST(self) -> None:
        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode())
        token = form.get("token", [""])[0]
        with self.server.ended:
            self.server.introspections += 1
        kind = next((k for k in ("huge", "declared", "drip") if token.startswith(k)), None)
        if kind is not None:
            return self._misbehave(kind, "introspection")
        claims = self.server.active.get(token)
        self._json({"active": True, **claims} if claims else {"active": False})

    def _json(self, document: dict, status: int = 200) -> None:
        raw = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _misbehave(self, kind: str, what: str) -> None:
        # A small send buffer: what the server counts as sent is close to what the adapter took.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if kind == "huge":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(DRIP_BODY) if kind == "drip" else HUGE_BYTES))
        self.end_headers()
        sent = 0
        try:
            if kind == "drip":
                for byte in DRIP_BODY:
                    if self.server.stopping.wait(1.0):
                        break
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    sent += 1
            else:
                block = b'{"keys": [' + b" " * (CHUNK - 10)
                while sent < HUGE_BYTES:
                    payload = block if sent == 0 else b" " * CHUNK
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload) if kind == "huge" else payload)
                    sent += len(payload)
        except OSError:
            pass  # the adapter hung up: what was sent so far is the point
        finally:
            self.close_connection = True
            self.server.record(what, sent)
            self.server.record(f"{what}#count", 1)


@contextmanager
def _serving() -> Iterator[HostileIssuer]:
    server = HostileIssuer()
    # shutdown() waits for the serve loop's next poll: 0.5 s by default, each test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def issuer() -> Iterator[HostileIssuer]:
    with _serving() as server:
        yield server


def _resource_server(monkeypatch: pytest.MonkeyPatch, table: dict) -> ResourceServer:
    """The adapter's own assembly, from an ``[http.oauth]`` table as the host TOML gives it."""
    monkeypatch.setenv(SECRET_ENV, "hostile-test-secret")
    settings = parse_oauth(table, Path("."))
    callers = CallerBindings(policy_engine(settings), cache_s=0)
    return build_resource_server(settings, served_url=RESOURCE, callers=callers)


def _introspecting(issuer: HostileIssuer, **extra: object) -> dict:
    return {"issuer": issuer.base, "introspection_endpoint": issuer.base + "/introspect",
            "introspection_client_id": "engram-mcp", "introspection_secret_env": SECRET_ENV, **extra}


def _jwt(issuer: str, audience: str) -> str:
    now = int(time.time())
    return new_key("k-" + uuid.uuid4().hex[:8]).sign({
        "iss": issuer, "aud": audience, "sub": "alice", "iat": now, "exp": now + 300, "scope": SCOPES,
        "client_id": "mcp-client", "engram_tenant": "acme"})


async def test_made_up_opaque_tokens_cost_at_most_the_introspection_budget(issuer, monkeypatch) -> None:
    rs = _resource_server(monkeypatch, _introspecting(issuer, introspection_cache_s=0,
                                                      introspection_budget_per_s=1))
    good = "good-" + uuid.uuid4().hex
    issuer.active[good] = {"aud": RESOURCE, "sub": "alice", "scope": SCOPES, "client_id": "c",
                           "exp": int(time.time()) + 300}
    try:
        assert (await rs.verifier.verify_token(good)) is not None
        assert issuer.introspections == 1
        started, unavailable = time.monotonic(), 0
        for _ in range(60):
            try:
                assert await rs.verifier.verify_token(uuid.uuid4().hex) is None
            except AuthorizationServerUnavailable:
                unavailable += 1  # the retriable 503: over the budget, the issuer is not asked
        allowed = BURST_S * 1 + (time.monotonic() - started) * 1 + 1
        assert issuer.introspections - 1 <= allowed < 60
        assert unavailable >= 60 - allowed
        # The person already signed in is still asked about (introspection_cache_s = 0), outside the budget.
        before = issuer.introspections
        accepted = await rs.verifier.verify_token(good)
        assert accepted is not None and accepted.subject == "alice" and issuer.introspections == before + 1
    finally:
        await rs.http.aclose()


async def test_a_dead_token_repeated_is_introspected_once(issuer, monkeypatch) -> None:
    rs = _resource_server(monkeypatch, _introspecting(issuer, introspection_cache_s=0))
    dead = uuid.uuid4().hex
    try:
        for _ in range(5):
            assert await rs.verifier.verify_token(dead) is None
        assert issuer.introspections == 1
    finally:
        await rs.http.aclose()


@pytest.mark.parametrize("case", ["jwks chunked", "jwks declared", "metadata", "introspection"])
async def test_a_huge_document_is_abandoned_after_about_the_limit(issuer, monkeypatch, case: str) -> None:
    what, answers = case.split(" ")[0], 1
    if case == "metadata":  # each of the three candidate metadata URLs of this issuer answers 64 MiB
        table, token, answers = {"issuer": issuer.base + "/huge"}, _jwt(issuer.base + "/huge", RESOURCE), 3
    elif case == "introspection":
        table, token = _introspecting(issuer), "huge-" + uuid.uuid4().hex
    else:
        path = "/jwks/huge" if case == "jwks chunked" else "/jwks/declared"
        table, token = {"issuer": issuer.base, "jwks_uri": issuer.base + path}, _jwt(issuer.base, RESOURCE)
    rs = _resource_server(monkeypatch, table)
    try:
        with pytest.raises(AuthorizationServerUnavailable):
            await rs.verifier.verify_token(token)
    finally:
        await rs.http.aclose()
    sent = issuer.wait_for(what, answers)
    if case == "jwks declared":  # refused on its Content-Length, before reading: the socket buffers at most
        assert sent < MAX_DOCUMENT_BYTES, sent
    # Read whole, 64 MiB would have gone out each time; what the kernel's socket buffers hold on
    # loopback (a few MiB) is all that passes beyond the 1 MiB the adapter reads.
    assert sent < answers * (MAX_DOCUMENT_BYTES + 12 * 1024 * 1024) < answers * HUGE_BYTES, sent


@pytest.mark.parametrize("case", ["jwks", "metadata", "introspection"])
async def test_the_configured_fetch_deadline_ends_a_dripped_fetch(issuer, monkeypatch, case: str) -> None:
    """Each of the adapter's three fetches (key set, discovery, introspection) ends at
    ``fetch_deadline_s``, well inside a check deadline that would otherwise have ended it."""
    fetch_s, check_s = 0.25, 5.0
    deadlines = {"fetch_deadline_s": fetch_s, "check_deadline_s": check_s}
    if case == "introspection":
        table, token = _introspecting(issuer, **deadlines), "drip-" + uuid.uuid4().hex
    elif case == "metadata":
        table, token = {"issuer": issuer.base + "/drip", **deadlines}, _jwt(issuer.base + "/drip", RESOURCE)
    else:
        table = {"issuer": issuer.base, "jwks_uri": issuer.base + "/jwks/drip", **deadlines}
        token = _jwt(issuer.base, RESOURCE)
    rs = _resource_server(monkeypatch, table)
    try:
        started = time.monotonic()
        with pytest.raises(AuthorizationServerUnavailable, match=f"within {fetch_s:g} s"):
            await rs.verifier.verify_token(token)
        assert time.monotonic() - started < fetch_s + 2.0 < check_s
    finally:
        await rs.http.aclose()


async def test_the_check_deadline_ends_a_check_whatever_its_fetch_may_take(issuer) -> None:
    """The verifier's own deadline, not the fetch's, ends a check that waits longer than it: here
    a key-set fetch allowed 30 s against a key set dripped a byte a second."""
    async with httpx2.AsyncClient() as http:
        async def dripped_key_set() -> dict:
            return await fetch_json(http, issuer.base + "/jwks/drip", deadline_s=30.0)

        verifier = OAuthTokenVerifier(issuer=issuer.base, resource=RESOURCE, algorithms=("ES256",), clock_skew_s=0,
                                      jwks=JwksCache(dripped_key_set, max_age_s=300), check_deadline_s=0.25)
        started = time.monotonic()
        with pytest.raises(AuthorizationServerUnavailable, match="within 0.25 s"):
            await verifier.verify_token(_jwt(issuer.base, RESOURCE))
        assert time.monotonic() - started < 2.5


# End to end: real adapters, real HTTP callers, the 503 and how soon it comes.


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    running = start_core(tmp_path_factory.mktemp("hostile-core"))
    try:
        yield running.address, Path(running.host_key_path)
    finally:
        running.stop()


def _two_callers(url: str, token: str) -> list[tuple[int, float, str]]:
    """Two requests with ``token``: the second half a fetch deadline after the first, while the first waits.
    (status, seconds until the answer, Retry-After) of each; a hang shows as the client giving up."""

    def call(delay: float) -> tuple[int, float, str]:
        time.sleep(delay)
        started = time.monotonic()
        try:
            response = httpx2.post(url, json=PING, headers={**ACCEPT, "Authorization": f"Bearer {token}"},
                                   timeout=CLIENT_GIVES_UP_S)
        except httpx2.TimeoutException:
            return 0, time.monotonic() - started, ""
        return response.status_code, time.monotonic() - started, response.headers.get("retry-after", "")

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(call, [0.0, FETCH_S / 2]))


@pytest.fixture(scope="module")
def slow_adapters(core: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[[str], tuple[str, str]]]:
    """``engram mcp --http`` processes in front of one dripping issuer, started when first asked
    for, as (URL, issuer): ``discovery``'s issuer drips its metadata (a JWT: the metadata case) and
    its introspection endpoint, configured, drips its answers (an opaque token: the introspection
    case); ``keys``' configured key set drips (a JWT: the jwks case). Two adapter starts for the
    three cases instead of three: each start is ~2 s of imports."""
    directory = tmp_path_factory.mktemp("slow-adapters")
    started: dict[str, tuple[HttpAdapter, str]] = {}
    with _serving() as issuer:
        def adapter(kind: str) -> tuple[str, str]:
            if kind not in started:
                name = issuer.base + ("/drip" if kind == "discovery" else "")
                lines = [f'issuer = "{name}"', f'policies = "{binding_bundle(directory / kind, name)}"',
                         f"fetch_deadline_s = {FETCH_S}", f"check_deadline_s = {CHECK_S}"]
                if kind == "keys":
                    lines.append(f'jwks_uri = "{issuer.base}/jwks/drip"')
                else:
                    lines += [f'introspection_endpoint = "{issuer.base}/introspect"',
                              'introspection_client_id = "engram-mcp"', f'introspection_secret_env = "{SECRET_ENV}"']
                config = write_config(directory / f"{kind}.toml", address=core[0], signing_key=core[1],
                                      extra="[http.oauth]\n" + "\n".join(lines))
                port = free_port()
                started[kind] = (start_http_adapter(config, port=port, env={SECRET_ENV: "hostile-test-secret"}),
                                 name)
            running, name = started[kind]
            return running.url, name

        try:
            yield adapter
        finally:
            for running, _ in started.values():
                stop(running)


@pytest.mark.parametrize("case", ["jwks", "metadata", "introspection"])
def test_a_slow_issuer_is_a_prompt_503_for_the_first_and_a_waiting_caller(slow_adapters, case: str) -> None:
    url, name = slow_adapters("keys" if case == "jwks" else "discovery")
    token = "drip-" + uuid.uuid4().hex if case == "introspection" else _jwt(name, url)
    assert PROMPT_503_S < DEFAULT_FETCH_DEADLINE_S
    for status, seconds, retry_after in _two_callers(url, token):
        assert (status, retry_after) == (503, "5") and seconds < PROMPT_503_S, (status, seconds)
