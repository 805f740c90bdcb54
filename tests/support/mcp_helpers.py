"""Helpers shared by the MCP adapter tests (configs, processes, clients, arguments)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, TOOLS_LIST_CALL, make_context
from engram_core.trust.hostkeys import load_private_key_file

REPO = Path(__file__).resolve().parents[2]
# ENGRAM_MCP_TEST_COMMAND runs the subprocess tests (stdio_client, start_http_adapter, the CLI)
# against another `engram` executable; adapter_client serves this checkout's adapter in process.
ENGRAM = os.environ.get("ENGRAM_MCP_TEST_COMMAND") or str(Path(sys.executable).with_name("engram"))
PURPOSE = "purpose:engineering-notes"
WORKSPACE = "ws-main"


@dataclass(frozen=True)
class Core:
    address: str
    host_key_path: Path


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def activate(core: Core, tenant: str, workspace: str, tools: list[str] | None = None) -> None:
    """Turn memory on for one scope, as a host maintenance principal (SPEC §12); ``tools``:
    the tools granted besides those already granted (default: all six)."""
    _activation(core, tenant, workspace, tools or [], activated=True)


def deactivate(core: Core, tenant: str, workspace: str, tools: list[str]) -> None:
    """Withdraw the grant of ``tools`` in one scope (the others stay granted)."""
    _activation(core, tenant, workspace, tools, activated=False)


def _activation(core: Core, tenant: str, workspace: str, tools: list[str], *, activated: bool) -> None:
    key = load_private_key_file(core.host_key_path)
    ctx = make_context(
        key,
        call=ADMIN_CALL,
        tenant=tenant,
        workspace=workspace,
        principal="host-operator",
        now_ms=_now_ms(),
        host_principal=True,
        maintenance_scopes=("maintain",),
        memory_enabled=True,
    )
    with grpc.insecure_channel(core.address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        (stub.Activate if activated else stub.Deactivate)(
            admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace, tools=tools),
            metadata=((CONTEXT_METADATA_KEY, ctx),),
            timeout=10,
        )


def write_config(
    path: Path,
    *,
    address: str,
    signing_key: Path,
    memory_enabled: bool = True,
    binding: dict[str, str] | None = None,
    deadline_ms: int | None = None,
    confirmation_timeout_ms: int | None = None,
    core_extra: str = "",
    extra: str = "",
) -> Path:
    """A host TOML; ``core_extra``: more ``[core]`` lines; ``extra``: more sections, verbatim."""
    lines = ["[core]", f'address = "{address}"'] + ([core_extra] if core_extra else [])
    if deadline_ms is not None:
        lines.append(f"deadline_ms = {deadline_ms}")
    lines += [
        "",
        "[host]",
        f'signing_key = "{signing_key}"',
        f"memory_enabled = {str(memory_enabled).lower()}",
    ]
    if confirmation_timeout_ms is not None:
        lines.append(f"confirmation_timeout_ms = {confirmation_timeout_ms}")
    if binding is not None:
        lines += ["", "[binding]"] + [f'{k} = "{v}"' for k, v in binding.items()]
    if extra:
        lines += ["", extra]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def http_token(directory: Path) -> tuple[str, str]:
    """(a bearer token, the ``[http]`` lines that make the adapter require it): a token file only
    its owner reads, beside the config, as `engram init` writes it. An HTTP adapter with a
    ``[binding]`` needs one on every bind (issue 26)."""
    import secrets

    value = secrets.token_urlsafe(32)
    path = directory / f"mcp-{uuid.uuid4().hex[:8]}.token"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return value, f'[http]\ntoken_file = "{path}"'


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def binding_for(tenant: str, *, purpose: str = PURPOSE, principal: str = "agent-alice") -> dict[str, str]:
    return {
        "tenant": tenant,
        "workspace": WORKSPACE,
        "principal": principal,
        "agent_id": "agent-1",
        "session": "sess-1",
        "purpose_ref": purpose,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class HttpAdapter:
    url: str
    process: subprocess.Popen[bytes]
    banner: str = ""  # what the adapter printed on stderr when it started
    headers: dict[str, str] = field(default_factory=dict)  # what a client sends to be served (its token)


def start_http_adapter(
    config: Path, *, host: str = "127.0.0.1", env: dict[str, str] | None = None, connect: str | None = None,
    headers: dict[str, str] | None = None, port: int | None = None,
) -> HttpAdapter:
    """`engram mcp --http HOST:PORT` as a subprocess; ``connect``: the address clients use
    (default ``host``; a wildcard bind is reached on 127.0.0.1); ``headers``: what its clients
    send (kept on the result)."""
    port = port or free_port()
    connect = connect or ("127.0.0.1" if host in ("0.0.0.0", "::") else host)
    process = subprocess.Popen(
        [ENGRAM, "mcp", "--host-config", str(config), "--http", f"{host}:{port}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    deadline = time.monotonic() + 60  # a loaded CI machine: a slow start is not what is tested
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"adapter exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            with socket.create_connection((connect, port), timeout=0.2):
                return HttpAdapter(url=f"http://{connect}:{port}/mcp", process=process, banner=_first_line(process),
                                   headers=dict(headers or {}))
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("adapter did not start listening")


def _first_line(process: subprocess.Popen[bytes], timeout: float = 10.0) -> str:
    """What the adapter wrote on stderr up to the line naming the URL it serves, read as it
    arrives (unbuffered, so it never blocks on a silent process)."""
    import select

    if process.stderr is None:
        return ""
    fd = process.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while b"serving" not in seen or not seen.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        seen += chunk
    return seen.decode(errors="replace")


def stop(adapter: HttpAdapter) -> None:
    adapter.process.terminate()
    try:
        adapter.process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        adapter.process.kill()


# ---- clients -------------------------------------------------------------------


def stdio_client(config: Path, *, mode: str = "auto", elicitation: Any = None) -> Client:
    """The SDK's own client talking to `engram mcp` as a subprocess over stdio: for tests of the
    process itself (its entry point, stdio wire, stderr, exit, environment). Other tests use
    :func:`adapter_client`."""
    params = StdioServerParameters(command=ENGRAM, args=["mcp", "--host-config", str(config)], cwd=str(REPO))
    return Client(params, mode=mode, elicitation_callback=elicitation)


class InProcessAdapter:
    """A transport for the SDK's ``Client``: the real adapter, built from a host config as
    `engram mcp --host-config FILE` builds it for stdio (``load_host_config``, then
    ``adapters.mcp.main.build_adapter``: the same ``ContextSource`` binds tenant, workspace,
    principal, agent, session and purpose from ``[binding]`` and signs every context and
    confirmation grant with the config's host key), served in this process by the SDK's
    ``InMemoryTransport`` (its memory streams, ``Server.run`` as on stdio) against the core on
    loopback gRPC. What only a separate process gives (argv, stdin/stdout bytes, stderr, exit
    code, environment, signals) is not here: those tests use :func:`stdio_client`."""

    def __init__(self, config: Path) -> None:
        self._config = config
        self._adapter: Any = None
        self._transport: Any = None

    async def __aenter__(self) -> Any:
        from mcp.client._memory import InMemoryTransport

        from adapters.mcp.config import load_host_config
        from adapters.mcp.main import build_adapter

        config = load_host_config(self._config)
        # `engram mcp` refuses stdio without a [binding] and an embedded core is a process's own.
        assert config.binding is not None and config.core_address is not None and config.signing_key is not None
        self._adapter = build_adapter(config, config.core_address, config.signing_key)
        self._transport = InMemoryTransport(self._adapter.build())
        try:
            return await self._transport.__aenter__()
        except BaseException:
            await self._adapter.close()
            raise

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._transport.__aexit__(*exc)
        finally:
            await self._adapter.close()  # as `engram mcp` does when its stdin closes


def adapter_client(config: Path, *, mode: str = "auto", elicitation: Any = None) -> Client:
    """The SDK's own client talking to the real adapter in this process (:class:`InProcessAdapter`):
    the same negotiation as over stdio (``server/discover`` first, or ``mode="legacy"``), the
    elicitation callback for confirmations."""
    return Client(InProcessAdapter(config), mode=mode, elicitation_callback=elicitation)


class FreshHeaders(httpx2.Auth):
    """Headers made anew for every HTTP request: what a fronting host does with the signed
    host context, whose nonce the core accepts once, signed for the call the request makes
    (``make`` is given it: a tool's name for tools/call, else "tools/list")."""

    requires_request_body = True

    def __init__(self, make: Callable[[str], dict[str, str]]) -> None:
        self._make = make

    def auth_flow(self, request: httpx2.Request) -> Any:
        request.headers.update(self._make(call_of_request(request.content)))
        yield request


def call_of_request(body: bytes) -> str:
    """The call an MCP HTTP request makes, as a fronting host reads it from the JSON-RPC body."""
    try:
        message = json.loads(body or b"{}")
    except ValueError:
        return TOOLS_LIST_CALL
    if isinstance(message, dict) and message.get("method") == "tools/call":
        name = (message.get("params") or {}).get("name")
        if isinstance(name, str):
            return name
    return TOOLS_LIST_CALL


def http_client(
    url: str,
    *,
    headers: dict[str, str] | Callable[[str], dict[str, str]] | None = None,
    mode: str = "auto",
    elicitation: Any = None,
) -> Client:
    """``headers``: fixed, or a function called for each request with the call it makes (a
    fresh signed context for it)."""
    if callable(headers):
        http = httpx2.AsyncClient(auth=FreshHeaders(headers), timeout=30)
    else:
        http = httpx2.AsyncClient(headers=headers or {}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=elicitation)


async def approve(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"approve": True})


async def decline(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


async def cancel(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="cancel")


def envelope_of(result: types.CallToolResult) -> dict[str, Any]:
    """The envelope, after checking the text copy and isError agree with it (SPEC §3)."""
    env = result.structured_content
    assert isinstance(env, dict)
    assert len(result.content) == 1 and result.content[0].type == "text"
    assert json.loads(result.content[0].text) == env
    assert result.is_error is (not env["ok"])
    assert env["redactionClass"] == "high" and env["auditId"]
    return env


def value_of(result: types.CallToolResult) -> dict[str, Any]:
    env = envelope_of(result)
    assert env["ok"] is True, env
    assert env["output"]["schema_version"] == 1
    return env["output"]["value"]


def error_code(result: types.CallToolResult) -> str:
    env = envelope_of(result)
    assert env["ok"] is False, env
    return env["error"]["code"]


# ---- arguments ---------------------------------------------------------------------


def capture_args(key: str, text: str, *, purpose: str = PURPOSE) -> dict[str, Any]:
    # Each text its own valid time (equal texts the same, so equal content stays equal): records
    # admitted one after another with the same valid time are neighbours in search and come back
    # beside each other's matches (docs/search.md, "Neighbours"), and these tests expect a search
    # for one record's word to return that record alone.
    t = 1764460800000 + int.from_bytes(hashlib.sha256(text.encode()).digest()[:3], "big") * 1000
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": purpose,
            "valid_time": {"t": t},
            "components": [
                {"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["cit1"]}
            ],
            "primary_component_id": "c1",
            "primary_event": {"at": t, "type_ref": "event:decision", "citation_id": "cit1"},
            "citations": [
                {
                    "citation_id": "cit1",
                    "source_ref": "doc:adr-7",
                    "locator": {"scheme": "path", "value": "docs/adr/7.md"},
                    "content_digest": "sha256:" + "a" * 64,
                }
            ],
        },
        "evidence": {
            "evidence_ref": "ev:1",
            "evidence_digest": "sha256:" + "b" * 64,
            "citation_ids": ["cit1"],
        },
    }


def unique(prefix: str) -> str:
    """A fresh idempotency key / distinguishing word (≥ 16 bytes)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def token(prefix: str) -> str:
    """A word no other test writes (one lexical token: letters and digits only)."""
    return f"{prefix}{uuid.uuid4().hex}"


def admin_json(core: Any, rpc: str, request: Any, *, scopes: tuple[str, ...] = ("read",)) -> dict[str, Any]:
    """One AdminService call to ``core`` (a :class:`Core`, or anything with its ``address`` and
    ``host_key_path``) as `engram admin` makes it (``engram_core.cli.admin``'s ``_call``):
    the same request under the same host-key-signed context (``engram_core.cli.channel.
    admin_metadata``; ``scopes`` as the command asks: read for reads), sent from this process
    instead of a new `engram` process; the JSON document the command prints with ``--json``.
    The commands themselves are tested as subprocesses in tests/admin."""
    from engram_core.cli.channel import admin_metadata

    with grpc.insecure_channel(core.address) as channel:
        result = getattr(admin_pb2_grpc.AdminServiceStub(channel), rpc)(
            request, metadata=admin_metadata(str(core.host_key_path), scopes=scopes), timeout=60)
    return json.loads(result.json)


def audit_rows(core: Core, tenant: str = "acme") -> dict[str, list[dict[str, Any]]]:
    """Audit rows of ``tenant``/ws-main by audit id: what `engram admin export audit --tenant T
    --workspace ws-main` writes, read through :func:`admin_json`."""
    value = admin_json(core, "Export", admin_pb2.ExportRequest(tenant=tenant, workspace=WORKSPACE, what="audit",
                                                               from_cursor="", to_cursor=""))
    rows: dict[str, list[dict[str, Any]]] = {}
    for row in value["items"]:
        rows.setdefault(row["audit_id"], []).append(row)
    return rows
