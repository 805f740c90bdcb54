"""Who may reach `engram mcp --http` (docs/security.md, "MCP over HTTP reached by a web
page or another host"): attacks over real HTTP against a real adapter process.

- DNS rebinding: a browser tricked by a rebinding page sends a foreign ``Host`` and the
  page's ``Origin``; both are refused on every bind address, including a loopback alias
  such as 127.0.0.2 that the SDK does not protect by itself.
- Another host: a bind other hosts can reach refuses to start without bearer tokens;
  with tokens, a request without one or with a wrong one is 401.
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess

import httpx2 as httpx
import pytest

from engram_core.contract.schemas import TOOL_NAMES
from tests.support.mcp_helpers import (
    ENGRAM,
    REPO,
    approve,
    bearer,
    binding_for,
    capture_args,
    free_port,
    http_client,
    http_token,
    start_http_adapter,
    stop,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio

LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "attacker", "version": "1"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _post(url: str, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(url, json=body, headers={**ACCEPT, **headers}, timeout=10)


@pytest.fixture(scope="module")
def alias_bound(core, tmp_path_factory):
    """The adapter on 127.0.0.2, a loopback alias the SDK leaves unprotected by default. Its
    token is sent with the rebinding requests too: Host/Origin validation holds on its own,
    should a token ever reach a page."""
    directory = tmp_path_factory.mktemp("http-sec")
    secret, http = http_token(directory)
    config = write_config(
        directory / "acme.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding=binding_for("acme"),
        extra=http,
    )
    adapter = start_http_adapter(config, host="127.0.0.2", headers=bearer(secret))
    yield adapter
    stop(adapter)


def test_start_line_names_the_url(alias_bound):
    assert f"serving streamable HTTP on {alias_bound.url}" in alias_bound.banner


@pytest.mark.parametrize("body", [INITIALIZE, LIST_TOOLS], ids=["initialize", "tools-list"])
def test_rebinding_page_is_refused(alias_bound, body):
    authority = alias_bound.url.split("/")[2]
    # What a DNS-rebinding page makes the browser send: its own name in Host and Origin.
    foreign = _post(alias_bound.url, body, Host=f"evil.example:{authority.split(':')[1]}",
                    Origin="http://evil.example", **alias_bound.headers)
    assert foreign.status_code == 421, foreign.text
    assert "tools" not in foreign.text
    # The right Host, but a request issued by a web page elsewhere.
    web = _post(alias_bound.url, body, Origin="https://evil.example", **alias_bound.headers)
    assert web.status_code == 403, web.text
    assert "tools" not in web.text


async def test_the_bind_address_itself_still_works(alias_bound):
    async with http_client(alias_bound.url, headers=alias_bound.headers) as client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
    # A plain non-browser request (no Origin) with the right Host and the token is served; without it, 401.
    assert _post(alias_bound.url, INITIALIZE, **alias_bound.headers).status_code == 200
    assert _post(alias_bound.url, INITIALIZE).status_code == 401


def _refused_start(config, listen: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [ENGRAM, "mcp", "--host-config", str(config), "--http", listen],
            cwd=REPO, capture_output=True, text=True, timeout=30,
        )
    except subprocess.TimeoutExpired as exc:  # it started serving: the defence is missing
        raise AssertionError(f"adapter on {listen} started without authentication") from exc


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "mcp.example.com"])
def test_reachable_bind_without_auth_refuses_to_start(core, tmp_path, host):
    config = write_config(tmp_path / "open.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme"))
    done = _refused_start(config, f"{host}:{free_port()}")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bearer tokens" in lines[0] and host in lines[0], done.stderr


def test_token_env_that_is_empty_refuses_to_start(core, tmp_path):
    config = write_config(tmp_path / "empty.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme"), extra='[http]\ntoken_env = "ENGRAM_TEST_NO_SUCH_TOKENS"')
    done = _refused_start(config, f"0.0.0.0:{free_port()}")
    assert done.returncode == 2 and "ENGRAM_TEST_NO_SUCH_TOKENS" in done.stderr


@pytest.fixture(scope="module")
def secret() -> str:
    return secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def wildcard_with_tokens(core, tmp_path_factory, secret):
    """Bound to every interface, bearer tokens from the environment."""
    config = write_config(
        tmp_path_factory.mktemp("http-auth") / "acme.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding=binding_for("acme"),
        extra='[http]\ntoken_env = "ENGRAM_TEST_MCP_TOKENS"',
    )
    adapter = start_http_adapter(config, host="0.0.0.0",
                                 env={"ENGRAM_TEST_MCP_TOKENS": f"{secrets.token_urlsafe(24)} {secret}"})
    yield adapter
    stop(adapter)


def test_without_or_with_a_wrong_token_is_401(wildcard_with_tokens, secret):
    url = wildcard_with_tokens.url
    for headers in ({}, {"Authorization": "Bearer " + secrets.token_urlsafe(32)},
                    {"Authorization": "Bearer " + secret[:-1]}, {"Authorization": secret},
                    {"Authorization": "Basic " + secret}):
        for body in (INITIALIZE, LIST_TOOLS):
            reply = _post(url, body, **headers)
            assert reply.status_code == 401, (headers, reply.text)
            assert "tools" not in reply.text
    # Rebinding protection still applies to an authenticated request.
    port = url.split("/")[2].split(":")[1]
    assert _post(url, INITIALIZE, Authorization=f"Bearer {secret}", Host=f"evil.example:{port}").status_code == 421


async def test_the_right_token_works_and_is_never_printed(wildcard_with_tokens, secret):
    word = token("kestrel")
    auth = {"Authorization": f"Bearer {secret}"}
    async with http_client(wildcard_with_tokens.url, headers=auth, elicitation=approve) as client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
        cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("k"), f"Note {word}")))
        assert cap["candidate_id"]
    assert "bearer token required" in wildcard_with_tokens.banner
    assert secret not in wildcard_with_tokens.banner


async def test_digest_file_tokens_guard_a_loopback_bind_too(core, tmp_path):
    secret = secrets.token_urlsafe(32)
    digests = tmp_path / "tokens.sha256"
    digests.write_text(f"# agent-alice\n{hashlib.sha256(secret.encode()).hexdigest()}\n")
    config = write_config(tmp_path / "acme.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme"), extra=f'[http]\ntoken_digests_file = "{digests}"')
    adapter = start_http_adapter(config)
    try:
        assert _post(adapter.url, INITIALIZE).status_code == 401
        async with http_client(adapter.url, headers={"Authorization": f"Bearer {secret}"}) as client:
            assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
    finally:
        stop(adapter)
