"""A core that is not answering is transient, on every request an agent makes (issue 31 item 1):
`tools/call` answers the retriable STORE_UNAVAILABLE envelope, and `tools/list`, which has no
envelope, the JSON-RPC error -32010 carrying the same error object; once the core answers again,
the retry the signal promised succeeds. -32603 "Trusted invocation context unavailable" stays
what it is: a context the core refuses. Real cores (stopped and restarted on their port), real
`engram mcp` over stdio, the SDK's own client in both protocol versions."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.shared.exceptions import MCPError

from adapters.mcp.envelope import TEMPORARILY_UNAVAILABLE, TEMPORARILY_UNAVAILABLE_CODE
from engram_core.contract.errors import MESSAGES, Code
from engram_core.contract.schemas import TOOL_NAMES
from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    PURPOSE,
    WORKSPACE,
    Core,
    activate,
    binding_for,
    envelope_of,
    free_port,
    stdio_client,
    write_config,
)

pytestmark = pytest.mark.anyio

RETRY_FOR_S = 30.0  # the adapter's gRPC channel reconnects with backoff; an agent retries as long


async def _listed_again(client) -> list[str]:
    """Back off and list again until the core answers, as the signal tells an agent to."""
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            return [tool.name for tool in (await client.list_tools()).tools]
        except MCPError as exc:
            assert exc.code == TEMPORARILY_UNAVAILABLE_CODE, exc  # never a "stop" signal meanwhile
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.2)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_core_that_stops_answering_is_retriable_on_list_and_call_and_the_retry_succeeds(
        stores: EngineStores, tmp_path: Path, mode: str) -> None:
    data, address = tmp_path / "core", f"127.0.0.1:{free_port()}"
    running = stores.start_core(data, listen=address)
    try:
        activate(Core(address, Path(running.host_key_path)), "acme", WORKSPACE)
        config = write_config(tmp_path / "acme.toml", address=address, signing_key=Path(running.host_key_path),
                              binding=binding_for("acme"))
        async with stdio_client(config, mode=mode) as client:
            assert [tool.name for tool in (await client.list_tools()).tools] == list(TOOL_NAMES)
            running.stop()
            running = None

            with pytest.raises(MCPError) as listed:
                await client.list_tools()
            assert listed.value.code == TEMPORARILY_UNAVAILABLE_CODE
            assert listed.value.message == TEMPORARILY_UNAVAILABLE
            assert listed.value.data == {"code": "STORE_UNAVAILABLE", "retriable": True,
                                         "message": MESSAGES[Code.STORE_UNAVAILABLE]}

            called = envelope_of(await client.call_tool("engram_memory_search",
                                                        {"query": "anything", "purpose_ref": PURPOSE}))
            assert called["error"] == listed.value.data  # one failure, one error object, on both paths

            running = stores.start_core(data, listen=address)
            assert await _listed_again(client) == list(TOOL_NAMES)
    finally:
        if running is not None:
            running.stop()


async def test_a_context_the_core_refuses_is_still_the_stop_signal(core: Core, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger.key"
    stranger.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    stranger.chmod(0o600)
    config = write_config(tmp_path / "stranger.toml", address=core.address, signing_key=stranger,
                          binding=binding_for("acme"))
    async with stdio_client(config) as client:
        with pytest.raises(MCPError) as listed:
            await client.list_tools()
    assert (listed.value.code, listed.value.message) == (-32603, "Trusted invocation context unavailable")
    assert listed.value.data is None
