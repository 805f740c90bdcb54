"""`engram mcp --http` over HTTPS (`[http] tls_cert/tls_key`): a bearer token that crosses a
network is not sent in the clear. Real adapter process, throwaway PKI, the SDK's client."""

from __future__ import annotations

import secrets
import ssl

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from engram_core.contract.schemas import TOOL_NAMES
from tests.support.mcp_helpers import binding_for, start_http_adapter, stop, write_config
from tests.support.serve_support import admin

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_https_with_a_bearer_token(tls_core, pki, tmp_path):
    done_activate = admin(
        tls_core, "activate", "--tenant", "acme", "--workspace", "ws-main", tls=("--tls-ca", str(pki["ca"].cert)))
    assert done_activate.returncode == 0, done_activate.stderr
    secret = secrets.token_urlsafe(32)
    server = pki["server"]
    config = write_config(
        tmp_path / "https.toml", address=tls_core.address, signing_key=tls_core.host_key, binding=binding_for("acme"),
        core_extra=f'tls_ca = "{pki["ca"].cert}"',
        extra=f'[http]\ntoken_env = "ENGRAM_TEST_HTTPS_TOKENS"\ntls_cert = "{server.cert}"\ntls_key = "{server.key}"',
    )
    adapter = start_http_adapter(config, host="0.0.0.0", env={"ENGRAM_TEST_HTTPS_TOKENS": secret})
    try:
        url = adapter.url.replace("http://", "https://")
        assert "serving streamable HTTP on https://0.0.0.0:" in adapter.banner
        trust = ssl.create_default_context(cafile=str(pki["ca"].cert))
        headers = {"Authorization": f"Bearer {secret}"}
        transport = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, verify=trust,
                                                                                timeout=30))
        async with Client(transport) as client:
            assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
        async with httpx2.AsyncClient(timeout=10) as plain:  # plaintext HTTP to the TLS port gets nothing
            with pytest.raises(httpx2.HTTPError):
                await plain.post(adapter.url, json={}, headers=headers)
    finally:
        stop(adapter)
