"""The published schemas teach a first capture (issue 15): every property says what it is (its
own one-line description or its shared definition's), capture carries one complete, compact
example (issue 60: the rest are in the guide), every example, listed or in the guide, validates,
and each succeeds through a real adapter (in process, as `engram mcp` builds it; the SDK's own client) and a
real core."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from adapters.mcp.guidance import guide
from engram_core.contract.schema_examples import (
    CAPTURE_EXAMPLES,
    EXAMPLE_PURPOSE,
    SCHEMA_EXAMPLES,
    TOOL_EXAMPLES,
)
from engram_core.contract.schemas import INPUT_SCHEMAS, TOOL_NAMES, output_schema
from engram_core.contract.validation import validate_arguments
from tests.support.mcp_helpers import adapter_client, approve, binding_for, value_of, write_config

pytestmark = pytest.mark.anyio


def _properties(schema: dict[str, Any], pointer: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property schema reachable through properties / items, with its pointer."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{pointer}/{name}", sub
        yield from _properties(sub, f"{pointer}/{name}")
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _properties(items, f"{pointer}/*")


def described(schema: dict[str, Any], node: dict[str, Any]) -> str:
    """What a reader is told of ``node``: its own description and, for a ``$ref`` to a shared
    definition (``#/$defs/name``), the definition's."""
    ref = node.get("$ref", "")
    shared = schema["$defs"][ref.rsplit("/", 1)[1]].get("description", "") if ref else ""
    return " ".join(d for d in (node.get("description", ""), shared) if d)


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_every_input_and_output_property_has_a_description(tool: str) -> None:
    for name, schema in (("input", INPUT_SCHEMAS[tool]), ("output", output_schema(tool))):
        assert schema.get("description"), (tool, name)
        missing = [p for p, sub in _properties(schema) if not described(schema, sub)]
        assert missing == [], (tool, name, missing)


def test_times_and_sizes_state_their_units() -> None:
    capture = INPUT_SCHEMAS["engram_memory_capture"]
    payload = capture["properties"]["payload"]["properties"]
    assert "Epoch milliseconds" in described(capture, payload["valid_time"]["properties"]["t"])
    assert "Epoch milliseconds" in described(capture, payload["primary_event"]["properties"]["at"])
    text = payload["components"]["items"]["properties"]["text"]["description"]
    assert "UTF-8 bytes" in text and "NFC" in text
    key = capture["properties"]["idempotency_key"]["description"]
    assert "16-256 UTF-8 bytes" in key


@pytest.mark.parametrize("tool", TOOL_NAMES)
def test_every_example_is_complete_and_valid_for_schema_and_core(tool: str) -> None:
    """The guide's calls of every tool and the ones the schemas list."""
    assert INPUT_SCHEMAS[tool].get("examples", []) == SCHEMA_EXAMPLES.get(tool, [])
    examples = TOOL_EXAMPLES[tool] + SCHEMA_EXAMPLES.get(tool, [])
    assert examples, tool
    validator = jsonschema.Draft202012Validator(INPUT_SCHEMAS[tool])
    jsonschema.Draft202012Validator.check_schema(INPUT_SCHEMAS[tool])
    for example in examples:
        assert list(validator.iter_errors(example)) == []
        validate_arguments(tool, copy.deepcopy(example))  # the core's own check, bytes and cross-refs
    covered = {key for example in examples for key in example}
    assert set(INPUT_SCHEMAS[tool]["required"]) <= covered


def test_capture_lists_one_complete_compact_example() -> None:
    (example,) = INPUT_SCHEMAS["engram_memory_capture"]["examples"]
    assert set(example) == set(INPUT_SCHEMAS["engram_memory_capture"]["required"])
    assert set(example["payload"]) == set(INPUT_SCHEMAS["engram_memory_capture"]["properties"]["payload"]["required"])


def test_capture_examples_cover_every_kind_of_memory_and_every_component_kind() -> None:
    assert list(CAPTURE_EXAMPLES) == [
        "decision with its reason", "verified fact", "known problem and its fix", "convention", "hand-off",
    ]
    kinds = {c["kind"] for _, ex in CAPTURE_EXAMPLES.values() for c in ex["payload"]["components"]}
    assert kinds == {"context", "decision", "evidence"}


def test_guide_shows_one_worked_capture_per_kind_and_every_other_call_with_the_bound_purpose() -> None:
    text = guide("purpose:other-team")
    for number, kind in enumerate(CAPTURE_EXAMPLES, start=1):
        assert f"{number}. A {kind}:" in text
    for tool in TOOL_NAMES:
        if tool != "engram_memory_capture":
            assert f"- {tool} {{" in text, tool
    assert '"purpose_ref":"purpose:other-team"' in text and EXAMPLE_PURPOSE not in text


@pytest.fixture
def example_config(core, tmp_path: Path) -> Path:
    binding = {**binding_for("acme"), "purpose_ref": EXAMPLE_PURPOSE}
    return write_config(tmp_path / "examples.toml", address=core.address, signing_key=core.host_key_path,
                        binding=binding)


async def test_every_example_succeeds_through_mcp(example_config: Path) -> None:
    """Each tool's examples, as published in tools/list and in the guide, run through the adapter
    in the flow an agent follows: capture the listed example and every kind, admit each, search,
    get, then withdraw a fresh candidate and forget a record (both confirmed by the human through
    elicitation)."""
    async with adapter_client(example_config, elicitation=approve) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == set(TOOL_NAMES)
        for name, tool in listed.items():
            assert tool.input_schema.get("examples", []) == SCHEMA_EXAMPLES.get(name, [])
            assert tool.input_schema == INPUT_SCHEMAS[name]

        records = []
        for example in listed["engram_memory_capture"].input_schema["examples"] + TOOL_EXAMPLES["engram_memory_capture"]:
            captured = value_of(await client.call_tool("engram_memory_capture", example))
            assert captured["status"] == "committed_pending"
            admission = {**TOOL_EXAMPLES["engram_memory_request_admission"][0],
                         "candidate_id": captured["candidate_id"],
                         "idempotency_key": "admit-" + example["idempotency_key"]}
            outcome = value_of(await client.call_tool("engram_memory_request_admission", admission))["outcome"]
            assert outcome["status"] == "accepted", outcome
            records.append(outcome["record_id"])

        for example in TOOL_EXAMPLES["engram_memory_search"]:
            found = value_of(await client.call_tool("engram_memory_search", example))
            assert found["records"], example
            assert {hit["record"]["record_id"] for hit in found["records"]} <= set(records)

        got = value_of(await client.call_tool("engram_memory_get",
                                              {**TOOL_EXAMPLES["engram_memory_get"][0], "record_id": records[0]}))
        assert got["record"]["record_id"] == records[0]

        fresh = copy.deepcopy(TOOL_EXAMPLES["engram_memory_capture"][0])
        fresh["idempotency_key"] = "capture-to-withdraw-0001"
        fresh["payload"]["components"][0]["text"] += " (draft to withdraw)"
        pending = value_of(await client.call_tool("engram_memory_capture", fresh))["candidate_id"]
        withdrawn = value_of(await client.call_tool("engram_memory_withdraw",
                                                    {**TOOL_EXAMPLES["engram_memory_withdraw"][0],
                                                     "candidate_id": pending}))
        assert withdrawn["receipt"]["to_state"] == "withdrawn"

        forgotten = value_of(await client.call_tool("engram_memory_forget",
                                                    {**TOOL_EXAMPLES["engram_memory_forget"][0],
                                                     "record_id": records[0]}))
        assert forgotten["receipt"]["to_state"] == "tombstoned"


async def test_listed_examples_carry_the_bound_purpose_so_a_verbatim_copy_succeeds(core, tmp_path: Path) -> None:
    """`engram init` binds purpose:default; an agent that copies the capture example from
    tools/list as it is must not be refused as a purpose mismatch (-32603)."""
    bound = "purpose:default"
    config = write_config(tmp_path / "default.toml", address=core.address, signing_key=core.host_key_path,
                          binding={**binding_for("acme", principal="agent-verbatim"), "purpose_ref": bound})
    async with adapter_client(config) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        for name in SCHEMA_EXAMPLES:
            text = str(listed[name].input_schema["examples"])
            assert EXAMPLE_PURPOSE not in text and bound in text, name
        # everything but the examples is the published schema
        assert {k: v for k, v in listed["engram_memory_capture"].input_schema.items() if k != "examples"} == \
            {k: v for k, v in INPUT_SCHEMAS["engram_memory_capture"].items() if k != "examples"}
        (verbatim,) = listed["engram_memory_capture"].input_schema["examples"]
        assert value_of(await client.call_tool("engram_memory_capture", verbatim))["status"] == "committed_pending"
        found = value_of(await client.call_tool("engram_memory_search",
                                                listed["engram_memory_search"].input_schema["examples"][0]))
        assert "records" in found
