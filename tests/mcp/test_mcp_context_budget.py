"""The agent's context budget (issue 60): every agent that enables Engram reads the tool list in
every session, so what a model reads of it, each tool's name, description and inputSchema, stays
at most 10 KB for the six tools and 5 KB for engram_memory_capture, measured on what the SDK
sends (its JSON dump of each tool, compact). The lighter list loses nothing a first capture needs:
the schemas stay closed and exact (the core enforces the published schema, references inlined),
the output schemas stay complete, the descriptions point to the guide, the guide is one resource
read away and holds the worked calls, and the listed capture example, copied as it is, is captured
and admitted on the first try. Real core, the real adapter in process (as `engram mcp`
builds it), the SDK's own client.

Sizes when this test was written (compact bytes, as measured here): before, 28,098 in all and
16,850 for capture (29,057 and 17,535 with json.dumps' default spacing); after, about 9,600 and
5,040.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from adapters.mcp.guidance import GUIDE_RESOURCE_URI
from engram_core.contract.schema_examples import CAPTURE_EXAMPLES
from engram_core.contract.schemas import ENFORCED_SCHEMAS, enforced, output_schema
from engram_core.contract.tools import CAPTURE_TOOL, SEARCH_TOOL, TOOL_NAMES
from tests.support.mcp_helpers import PURPOSE, adapter_client, binding_for, unique, value_of, write_config

pytestmark = pytest.mark.anyio

TOTAL_BUDGET = 10_240
CAPTURE_BUDGET = 5_120
MODEL_FACING = ("name", "description", "inputSchema")


@pytest.fixture
def config(core, tmp_path: Path) -> Path:
    return write_config(tmp_path / "budget.toml", address=core.address, signing_key=core.host_key_path,
                        binding=binding_for("acme", principal="agent-budget"))


def model_facing_bytes(tool: Any) -> int:
    """Bytes of the tool's name, description and inputSchema as the SDK writes them on the wire
    (``model_dump_json(by_alias=True, exclude_unset=True)``, compact JSON)."""
    wire = tool.model_dump_json(by_alias=True, exclude_unset=True)
    dumped = json.loads(wire)
    size = 0
    for field in MODEL_FACING:
        part = json.dumps(dumped[field], ensure_ascii=False, separators=(",", ":"))
        assert part in wire, field  # the very bytes the SDK sends
        size += len(part.encode("utf-8"))
    return size


async def test_the_model_facing_tool_list_fits_the_budget(config: Path) -> None:
    async with adapter_client(config) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert list(tools) == list(TOOL_NAMES)
    sizes = {name: model_facing_bytes(tool) for name, tool in tools.items()}
    assert sizes[CAPTURE_TOOL] <= CAPTURE_BUDGET, sizes
    assert sum(sizes.values()) <= TOTAL_BUDGET, sizes


async def test_the_lighter_list_stays_closed_exact_and_complete(config: Path) -> None:
    async with adapter_client(config) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name, tool in tools.items():
        published = tool.input_schema
        jsonschema.Draft202012Validator.check_schema(published)
        # what the core validates is the published schema with its shared definitions inlined
        assert {k: v for k, v in enforced(published).items() if k != "examples"} == \
            {k: v for k, v in ENFORCED_SCHEMAS[name].items() if k != "examples"}
        assert tool.output_schema == output_schema(name)  # outputs are not trimmed: clients validate them
        for line in _descriptions(published):  # every description in the schema is one line
            assert "\n" not in line and len(line) <= 120, (name, line)
    for name in (SEARCH_TOOL, CAPTURE_TOOL):
        assert GUIDE_RESOURCE_URI in (tools[name].description or ""), name


async def test_a_first_capture_from_the_listed_example_succeeds_and_the_guide_is_one_read(config: Path) -> None:
    """What an agent has in hand: the lighter list and, one resources/read away, the guide."""
    async with adapter_client(config) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        (example,) = tools[CAPTURE_TOOL].input_schema["examples"]
        assert example["payload"]["purpose_ref"] == PURPOSE
        captured = value_of(await client.call_tool(CAPTURE_TOOL, example))
        assert captured["status"] == "committed_pending"
        outcome = value_of(await client.call_tool("engram_memory_request_admission", {
            "candidate_id": captured["candidate_id"], "idempotency_key": unique("budget-admit")}))["outcome"]
        assert outcome["status"] == "accepted", outcome

        read = await client.read_resource(GUIDE_RESOURCE_URI)
        (content,) = read.contents
        guide = content.text
        for number, kind in enumerate(CAPTURE_EXAMPLES, start=1):
            assert f"{number}. A {kind}:" in guide
        assert "Other calls." in guide and "Capturing." in guide and "Arguments." in guide


def _descriptions(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        own = [schema["description"]] if isinstance(schema.get("description"), str) else []
        return own + [d for k, v in schema.items() if k != "examples" for d in _descriptions(v)]
    if isinstance(schema, list):
        return [d for v in schema for d in _descriptions(v)]
    return []
