"""The adapter's one line per refusal (issue 31 items 6 and 7): shown in text logs at INFO, as
docs/operations.md says, and with `--log-format json` its fields are JSON fields, not text inside
`msg`. Real core, real `engram mcp` over stdio (stderr captured), the SDK's own client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.stdio import stdio_client as stdio_transport

from tests.support.mcp_helpers import ENGRAM, PURPOSE, REPO, binding_for, envelope_of, write_config

pytestmark = pytest.mark.anyio


async def _refusals(config: Path, errlog: Path, *extra: str) -> tuple[str, str]:
    """Two refusals, one decided by the adapter (a query over its bound) and one by the core (an
    unknown record); their audit ids."""
    with errlog.open("w") as sink:
        params = StdioServerParameters(command=ENGRAM, args=["mcp", "--host-config", str(config), *extra],
                                       cwd=str(REPO))
        async with Client(stdio_transport(params, errlog=sink)) as client:
            schema = envelope_of(await client.call_tool("engram_memory_search",
                                                        {"query": "q" * 8_193, "purpose_ref": PURPOSE}))
            missing = envelope_of(await client.call_tool("engram_memory_get", {
                "record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE}))
    assert schema["error"]["code"] == "INVALID_SCHEMA" and missing["error"]["code"] == "NOT_FOUND"
    return schema["auditId"], missing["auditId"]


@pytest.fixture
def acme(core, tmp_path: Path) -> Path:
    return write_config(tmp_path / "acme.toml", address=core.address, signing_key=core.host_key_path,
                        binding=binding_for("acme"))


async def test_json_logs_carry_the_refusal_fields_as_json_fields(acme: Path, tmp_path: Path) -> None:
    errlog = tmp_path / "adapter.stderr"
    by_adapter, by_core = await _refusals(acme, errlog, "--log-format", "json")
    lines = [json.loads(line) for line in errlog.read_text().splitlines() if line.strip()]  # JSON lines only
    refusals = {doc["audit_id"]: doc for doc in lines if doc["logger"] == "engram.mcp.refusal"}
    schema = refusals[by_adapter]
    assert schema["level"] == "info" and schema["event"] == "call_refused"
    assert {k: schema[k] for k in ("decided_by", "tool", "tenant", "workspace", "principal", "code",
                                   "reason_class", "reason_codes", "pointer")} == {
        "decided_by": "adapter", "tool": "engram_memory_search", "tenant": "acme", "workspace": "ws-main",
        "principal": "agent-alice", "code": "INVALID_SCHEMA", "reason_class": "query_length",
        "reason_codes": ["query_length"], "pointer": "/query"}
    missing = refusals[by_core]
    assert (missing["decided_by"], missing["tool"], missing["code"]) == ("core", "engram_memory_get", "NOT_FOUND")
    assert "q" * 64 not in errlog.read_text()


async def test_text_logs_show_one_info_line_per_refusal(acme: Path, tmp_path: Path) -> None:
    errlog = tmp_path / "adapter.stderr"
    by_adapter, by_core = await _refusals(acme, errlog)
    text = errlog.read_text().splitlines()
    schema = [line for line in text if by_adapter in line]
    assert len(schema) == 1 and schema[0].startswith("INFO engram.mcp.refusal: call refused: decided_by=adapter "
                                                     "tool=engram_memory_search tenant=acme"), schema
    assert "code=INVALID_SCHEMA reason_class=query_length" in schema[0] and "pointer=/query" in schema[0]
    assert [line for line in text if by_core in line and "decided_by=core" in line and "code=NOT_FOUND" in line]
