"""Seconds sent as milliseconds (issue 31.3, with issue 26.5's window): refused with the capture
policy's reason, a message saying "epoch milliseconds" with an example, schema descriptions and a
guide that say the same, and an adapter log line naming the likely unit mistake. Real core, a real
`engram mcp --http` subprocess (whose stderr the test reads), the SDK's own client."""

from __future__ import annotations

import time

import pytest

from engram_core.contract.errors import REFUSALS, Code
from tests.support.mcp_helpers import (
    bearer,
    binding_for,
    capture_args,
    envelope_of,
    http_client,
    http_token,
    start_http_adapter,
    stop,
    token,
    unique,
    write_config,
)

pytestmark = pytest.mark.anyio


def _dated(text: str, t: int) -> dict:
    args = capture_args(unique("units"), text)
    args["payload"]["valid_time"]["t"] = t
    args["payload"]["primary_event"]["at"] = t
    return args


async def test_seconds_and_microseconds_are_refused_and_the_log_names_the_unit(core, tmp_path) -> None:
    secret, http = http_token(tmp_path)  # an HTTP adapter authenticates on every bind (issue 26.1)
    config = write_config(tmp_path / "units.toml", address=core.address, signing_key=core.host_key_path,
                          binding=binding_for("acme"), extra=http)
    now_ms = time.time_ns() // 1_000_000
    seconds, micros = now_ms // 1000, now_ms * 1000
    adapter = start_http_adapter(config, headers=bearer(secret))
    try:
        async with http_client(adapter.url, headers=bearer(secret)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            schema = tools["engram_memory_capture"].input_schema
            valid_time = schema["properties"]["payload"]["properties"]["valid_time"]
            for field in ("t", "t_end"):
                node = valid_time["properties"][field]  # its own description, or its shared definition's
                shared = schema["$defs"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else {}
                described = node.get("description", "") + shared.get("description", "")
                assert "Epoch milliseconds" in described and "Not epoch seconds" in described
            guide = (await client.read_resource("engram://guide")).contents[0].text
            assert "epoch milliseconds" in guide and "1767225600000" in guide and "January 1970" in guide
            early = envelope_of(await client.call_tool("engram_memory_capture",
                                                       _dated(f"dated in seconds {token('ibex')}", seconds)))
            late = envelope_of(await client.call_tool("engram_memory_capture",
                                                      _dated(f"dated in microseconds {token('ibex')}", micros)))
            fine = envelope_of(await client.call_tool("engram_memory_capture",
                                                      _dated(f"dated in milliseconds {token('ibex')}", now_ms - 1000)))
    finally:
        stop(adapter)
    assert early["error"] == {"code": "UNAUTHORIZED", "retriable": False,
                              "message": REFUSALS[Code.UNAUTHORIZED]["time_before_floor"]}
    assert "epoch milliseconds" in early["error"]["message"] and "1767225600000" in early["error"]["message"]
    assert late["error"]["code"] == "UNAUTHORIZED"
    assert late["error"]["message"] == REFUSALS[Code.UNAUTHORIZED]["time_beyond_horizon"]
    assert fine["ok"] is True
    stderr = adapter.process.stderr.read().decode() if adapter.process.stderr else ""

    def line_of(audit_id: str) -> str:
        (line,) = [x for x in stderr.splitlines() if audit_id in x and "call refused" in x]
        return line

    first, second = line_of(early["auditId"]), line_of(late["auditId"])
    assert "reason_class=time_before_floor" in first and "reason_class=time_beyond_horizon" in second
    assert "likely_unit_mistake=/payload/valid_time/t:seconds,/payload/primary_event/at:seconds" in first
    assert "likely_unit_mistake=/payload/valid_time/t:microseconds,/payload/primary_event/at:microseconds" in second
    for line in (first, second):  # names the unit, never the values
        assert str(seconds) not in line and str(micros) not in line
