"""The in-process adapter most MCP tests use (``mcp_helpers.adapter_client``, issue 58) is the
adapter `engram mcp` runs: the same calls through it and through `engram mcp --host-config FILE`
over stdio (a subprocess, the SDK's own client for both) negotiate the same protocol, list the
same tools, refuse a purpose the binding does not hold the same way, and reach the real core as
the same tenant, workspace, principal and agent, a forget confirmed by the human through the
SDK's elicitation callback and carried by a grant signed with the host key, so the audit rows
they leave differ only in ids, times and digests."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.support.mcp_helpers import (
    adapter_client,
    approve,
    audit_rows,
    binding_for,
    capture_args,
    stdio_client,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    """What the binding and the calls decide in an audit row (not its ids, times or digests)."""
    return {
        **{k: row[k] for k in ("operation", "outcome", "tenant", "workspace", "principal", "agent_id")},
        "decisions": sorted((d["path"], tuple(d.get("reason_codes", []))) for d in row["decisions"]),
    }


async def _session(client: Any, word: str) -> tuple[str, list[str], list[str], int]:
    """(protocol version, tools listed, audit ids of a capture, admission and forget, the code of a
    search under another purpose)."""
    async with client:
        tools = [t.name for t in (await client.list_tools()).tools]
        cap = await client.call_tool("engram_memory_capture", capture_args(unique("cap"), f"In process {word}"))
        adm = await client.call_tool("engram_memory_request_admission",
                                     {"candidate_id": value_of(cap)["candidate_id"], "idempotency_key": unique("adm")})
        record_id = value_of(adm)["outcome"]["record_id"]
        forgot = await client.call_tool("engram_memory_forget", {"record_id": record_id, "idempotency_key": unique("f"),
                                                                 "reason_ref": "reason:test"})
        assert value_of(forgot)["receipt"]["to_state"] == "tombstoned"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("engram_memory_search", {"query": word, "purpose_ref": "purpose:other"})
        ids = [r.structured_content["auditId"] for r in (cap, adm, forgot)]
        return client.protocol_version, tools, ids, refused.value.code


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_in_process_adapter_binds_and_confirms_as_engram_mcp_over_stdio(core, tmp_path, mode) -> None:
    config = write_config(tmp_path / "acme.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme", principal=f"agent-in-process-{mode}"))
    over_stdio = await _session(stdio_client(config, mode=mode, elicitation=approve), token("stdio"))
    in_process = await _session(adapter_client(config, mode=mode, elicitation=approve), token("inproc"))
    assert over_stdio[0] == in_process[0] and over_stdio[1] == in_process[1] and over_stdio[3] == in_process[3]
    rows = audit_rows(core)
    stdio_rows = [_comparable(row) for audit_id in over_stdio[2] for row in rows[audit_id]]
    process_rows = [_comparable(row) for audit_id in in_process[2] for row in rows[audit_id]]
    assert stdio_rows == process_rows
    assert {r["principal"] for r in process_rows} == {f"agent-in-process-{mode}"}
    assert [r["operation"] for r in process_rows][-1] == "engram_memory_forget"
