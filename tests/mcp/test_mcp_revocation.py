"""Revocation through the MCP adapter (issue 13 finding 7): after `engram admin revoke` the
adapter follows the scope's new authorization epoch and keeps working, while a context
signed before the revoke is refused. The SDK's own client, the real adapter in process (as
`engram mcp` builds it), a real core."""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest

from engram_core.api import admin_pb2, admin_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.schemas import TOOL_NAMES
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.mcp_helpers import (
    ENGRAM,
    PURPOSE,
    WORKSPACE,
    activate,
    adapter_client,
    approve,
    binding_for,
    capture_args,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def _revoke(core, tenant: str) -> int:
    key = load_private_key_file(core.host_key_path)
    ctx = make_context(key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=_now_ms(),
                       host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False)
    with grpc.insecure_channel(core.address) as channel:
        out = admin_pb2_grpc.AdminServiceStub(channel).Revoke(
            admin_pb2.ScopeRequest(tenant=tenant, workspace=WORKSPACE), metadata=[(CONTEXT_METADATA_KEY, ctx)],
            timeout=10)
    return json.loads(out.json)["authorization_epoch"]


def _get_with(core, context: bytes, record_id: str) -> str:
    with grpc.insecure_channel(core.address) as channel:
        try:
            memory_pb2_grpc.MemoryServiceStub(channel).Get(
                memory_pb2.GetRequest(record_id=record_id, purpose_ref=PURPOSE),
                metadata=[(CONTEXT_METADATA_KEY, context)], timeout=10)
        except grpc.RpcError as err:
            return code_from_rpc_error(err).value
    return "OK"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_adapter_keeps_working_after_revoke_while_older_contexts_are_refused(core, tmp_path, mode):
    tenant = f"initech-{mode}"
    activate(core, tenant, WORKSPACE)
    binding = binding_for(tenant)
    config = write_config(tmp_path / "host.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding)
    key = load_private_key_file(core.host_key_path)
    word = token("kittiwake")
    async with adapter_client(config, mode=mode, elicitation=approve) as client:
        cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("cap"), f"Note {word}")))
        adm = value_of(await client.call_tool("engram_memory_request_admission",
                                              {"candidate_id": cap["candidate_id"], "idempotency_key": unique("a")}))
        record_id = adm["outcome"]["record_id"]
        # A context the host signed before the revoke (say it leaked): epoch 0, still inside its lifetime.
        leaked = make_context(key, call="engram_memory_get", tenant=tenant, workspace=WORKSPACE,
                              principal=binding["principal"],
                              purpose_ref=PURPOSE, now_ms=_now_ms())

        assert _revoke(core, tenant) == 1

        found = value_of(await client.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))
        assert [r["record"]["record_id"] for r in found["records"]] == [record_id]
        forgot = value_of(await client.call_tool(
            "engram_memory_forget", {"record_id": record_id, "idempotency_key": unique("f"), "reason_ref": "r:1"}))
        assert forgot["receipt"]["to_state"] == "tombstoned"
    assert _get_with(core, leaked, record_id) == "AUTHORIZATION_REVOKED"

    # A new adapter (which starts at epoch 0, as a new `engram mcp` process does) follows the epoch
    # as well, for tools/list too.
    assert _revoke(core, tenant) == 2
    async with adapter_client(config, mode=mode, elicitation=approve) as client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
        found = value_of(await client.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))
        assert found["records"] == []


def test_doctor_stays_green_after_revoke(core, tmp_path):
    """`engram doctor` probes the tool list as the adapter gets it, following the epoch."""
    tenant = "initech-doctor"
    activate(core, tenant, WORKSPACE)
    config = write_config(tmp_path / "host.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for(tenant))
    assert _revoke(core, tenant) == 1
    result = subprocess.run([ENGRAM, "doctor", "--host-config", str(config)], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tools granted: " in result.stdout
