"""The adapter over streamable HTTP (`engram mcp --http HOST:PORT`): a file
binding, and the per-request `X-Engram-Host-Context` header binding of a
deployment in front of many agents (SPEC §2, §14)."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.shared.exceptions import MCPError

from adapters.mcp.host_context import encode_context_header
from engram_core.contract.schemas import TOOL_NAMES
from engram_core.trust.hostctx import TOOLS_LIST_CALL, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.mcp_helpers import (
    PURPOSE,
    WORKSPACE,
    approve,
    bearer,
    binding_for,
    capture_args,
    error_code,
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
MODES = ["auto", "legacy"]
HEADER = "X-Engram-Host-Context"


@pytest.fixture(scope="module")
def file_bound(core, tmp_path_factory):
    directory = tmp_path_factory.mktemp("http")
    secret, http = http_token(directory)
    config = write_config(
        directory / "acme.toml",
        address=core.address,
        signing_key=core.host_key_path,
        binding=binding_for("acme"),
        extra=http,
    )
    adapter = start_http_adapter(config, headers=bearer(secret))
    yield adapter
    stop(adapter)


@pytest.fixture(scope="module")
def header_bound(core, tmp_path_factory):
    config = write_config(
        tmp_path_factory.mktemp("http") / "front.toml", address=core.address, signing_key=core.host_key_path
    )  # no [binding]: bind per request
    adapter = start_http_adapter(config)
    yield adapter
    stop(adapter)


def context_header(key, tenant: str, *, purpose: str = PURPOSE, call: str = TOOLS_LIST_CALL,
                   **extra) -> dict[str, str]:
    signed = make_context(
        key,
        call=call,
        tenant=tenant,
        workspace=WORKSPACE,
        principal="agent-bob",
        agent_id="agent-2",
        session="s-2",
        purpose_ref=purpose,
        now_ms=time.time_ns() // 1_000_000,
        ttl_ms=300_000,
        **extra,
    )
    return {HEADER: encode_context_header(signed)}


@pytest.mark.parametrize("mode", MODES)
async def test_file_binding_over_http_lists_and_calls(file_bound, mode):
    word = token("heron")
    async with http_client(file_bound.url, headers=file_bound.headers, mode=mode, elicitation=approve) as client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
        cap = value_of(
            await client.call_tool("engram_memory_capture", capture_args(unique("key"), f"Note {word}"))
        )
        adm = value_of(
            await client.call_tool(
                "engram_memory_request_admission",
                {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")},
            )
        )
        record_id = adm["outcome"]["record_id"]
        forgot = value_of(
            await client.call_tool(
                "engram_memory_forget",
                {"record_id": record_id, "idempotency_key": unique("f"), "reason_ref": "r:1"},
            )
        )
        assert forgot["receipt"]["to_state"] == "tombstoned"


@pytest.mark.parametrize("mode", MODES)
async def test_header_binding_missing_or_invalid_is_32603(header_bound, core, mode):
    rogue = Ed25519PrivateKey.generate()
    trusted = load_private_key_file(core.host_key_path)
    bad_headers = [
        {},
        {HEADER: "not base64!"},
        {HEADER: "AAAA"},
        context_header(rogue, "acme"),  # signed by a key the core does not trust
        context_header(trusted, "acme", host_principal=True, maintenance_scopes=("maintain",)),
    ]
    for headers in bad_headers:
        async with http_client(header_bound.url, headers=headers, mode=mode) as client:
            with pytest.raises(MCPError) as err:
                await client.list_tools()
            assert (err.value.code, err.value.message) == (-32603, "Trusted invocation context unavailable")
            with pytest.raises(MCPError) as err:
                await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE})
            assert err.value.code == -32603


@pytest.mark.parametrize("mode", MODES)
async def test_header_binding_binds_identity_per_request(header_bound, core, mode):
    key = load_private_key_file(core.host_key_path)
    word = token("ibis")
    async with http_client(
        header_bound.url, headers=lambda call: context_header(key, "acme", call=call), mode=mode, elicitation=approve
    ) as acme:
        assert [t.name for t in (await acme.list_tools()).tools] == list(TOOL_NAMES)
        cap = value_of(
            await acme.call_tool("engram_memory_capture", capture_args(unique("key"), f"Note {word}"))
        )
        adm = value_of(
            await acme.call_tool(
                "engram_memory_request_admission",
                {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")},
            )
        )
        record_id = adm["outcome"]["record_id"]
        with pytest.raises(MCPError) as err:
            await acme.call_tool("engram_memory_search", {"query": word, "purpose_ref": "purpose:other"})
        assert err.value.code == -32603
    async with http_client(header_bound.url, headers=lambda call: context_header(key, "globex", call=call), mode=mode) as globex:
        found = value_of(
            await globex.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE})
        )
        assert found["records"] == []
        assert (
            error_code(
                await globex.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE})
            )
            == "NOT_FOUND"
        )
    async with http_client(
        header_bound.url, headers=lambda call: context_header(key, "acme", call=call), mode=mode, elicitation=approve
    ) as acme:
        forgot = value_of(
            await acme.call_tool(
                "engram_memory_forget",
                {"record_id": record_id, "idempotency_key": unique("f"), "reason_ref": "r:2"},
            )
        )
        assert forgot["receipt"]["to_state"] == "tombstoned"
