"""The MCP adapter reaches a core that demands mutual TLS through `[core] tls_*` in its host
TOML (docs/mcp-clients.md); without them it gets nothing from that core."""

from __future__ import annotations

import subprocess

import pytest
from mcp.shared.exceptions import MCPError

from engram_core.contract.schemas import TOOL_NAMES
from tests.support.mcp_helpers import ENGRAM, REPO, binding_for, stdio_client, write_config
from tests.support.serve_support import admin

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_adapter_over_mutual_tls(mtls_core, pki, tmp_path):
    client = pki["client"]
    tls = ("--tls-ca", str(pki["ca"].cert), "--tls-cert", str(client.cert), "--tls-key", str(client.key))
    done = admin(mtls_core, "activate", "--tenant", "acme", "--workspace", "ws-main", tls=tls)
    assert done.returncode == 0, done.stderr
    core_tls = (f'tls_ca = "{pki["ca"].cert}"\ntls_cert = "{client.cert}"\ntls_key = "{client.key}"')
    config = write_config(tmp_path / "tls.toml", address=mtls_core.address, signing_key=mtls_core.host_key,
                          binding=binding_for("acme"), core_extra=core_tls)
    async with stdio_client(config) as mcp:
        assert [t.name for t in (await mcp.list_tools()).tools] == list(TOOL_NAMES)
    doctor = subprocess.run([ENGRAM, "doctor", "--host-config", str(config)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    plain = write_config(tmp_path / "plain.toml", address=mtls_core.address, signing_key=mtls_core.host_key,
                         binding=binding_for("acme"))
    async with stdio_client(plain) as mcp:
        try:
            tools = (await mcp.list_tools()).tools
        except MCPError:  # an error is as good as no tools: the core served nothing
            tools = []
        assert tools == []
