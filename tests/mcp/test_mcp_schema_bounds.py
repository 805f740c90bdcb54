"""The advertised schema is what the core enforces (issue 15): every bounded field of every tool,
walked at min-1, min, max and max+1 through a real adapter and core, is accepted exactly when the
published inputSchema says it is valid. Strings are ASCII here, where characters and UTF-8 bytes
agree; where they do not, the description states the byte bound (checked below). The bounds are
walked on the enforced schemas, the published ones with their shared definitions ($defs) inlined;
the client validates against the published ones, references and all."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcp.shared.exceptions import MCPError

from engram_core.contract.schemas import ENFORCED_SCHEMAS, INPUT_SCHEMAS
from engram_core.contract.validation import _BYTE_BOUNDS
from tests.support.mcp_helpers import PURPOSE, adapter_client, approve, binding_for, envelope_of, write_config

pytestmark = pytest.mark.anyio

BOUND_KEYWORDS = ("minLength", "maxLength", "minimum", "maximum", "minItems", "maxItems")
SCHEMA_CODES = {"INVALID_SCHEMA", "INVALID_DIGEST"}
# Bound to the host's purpose: any other value is the protocol refusal, whatever its length.
BOUND_BY_HOST = {"purpose_ref", "payload/purpose_ref"}
COMPONENT = "c-one"
CITATION = "cit-one"


def bounded_fields(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict]]:
    found = {k: schema[k] for k in BOUND_KEYWORDS if k in schema}
    for alternative in schema.get("anyOf", []):  # idempotency_key: 16 for ASCII keys
        if "minLength" in alternative:
            found["minLength"] = max(found.get("minLength", 0), alternative["minLength"])
    if found:
        yield path, found
    for name, sub in schema.get("properties", {}).items():
        yield from bounded_fields(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        yield from bounded_fields(schema["items"], (*path, "*"))


def _key(n: int) -> str:
    return (uuid.uuid4().hex * 9)[:n]


def _citation(cid: str) -> dict[str, Any]:
    return {"citation_id": cid, "source_ref": "doc:bounds", "locator": {"scheme": "path", "value": "b.md"},
            "content_digest": "sha256:" + "c" * 64}


def base_args(tool: str) -> dict[str, Any]:
    if tool == "engram_memory_search":
        return {"query": "bounds", "purpose_ref": PURPOSE}
    if tool == "engram_memory_get":
        return {"record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE}
    if tool == "engram_memory_request_admission":
        return {"candidate_id": "cand_" + "a" * 26, "idempotency_key": _key(24)}
    if tool == "engram_memory_withdraw":
        return {"candidate_id": "cand_" + "a" * 26, "idempotency_key": _key(24), "reason_ref": "reason:bounds"}
    if tool == "engram_memory_forget":
        return {"record_id": "mem_" + "a" * 52, "idempotency_key": _key(24), "reason_ref": "reason:bounds"}
    return {
        "idempotency_key": _key(24),
        "payload": {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": 1_764_547_200_000},
            "components": [{"component_id": COMPONENT, "kind": "context", "text": "bounds walk",
                            "citation_ids": [CITATION]}],
            "primary_component_id": COMPONENT,
            "primary_event": {"at": 1_764_547_200_000, "type_ref": "event:bounds", "citation_id": CITATION},
            "citations": [_citation(CITATION)],
        },
        "evidence": {"evidence_ref": "ev:bounds", "evidence_digest": "sha256:" + "d" * 64, "citation_ids": [CITATION]},
    }


def _replace(value: Any, old: str, new: str) -> Any:
    if value == old:
        return new
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, old, new) for v in value]
    return value


def _set(args: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = args
    for part in path[:-1]:
        node = node[0] if part == "*" else node.setdefault(part, {})
    node[path[-1]] = value


def _ids(n: int) -> list[str]:
    return [CITATION] + [f"cit-{i:03d}" for i in range(1, n)] if n else []


def with_list(path: str, n: int) -> Callable[[dict[str, Any]], None]:
    """How a list of n items is made valid in every other respect."""
    def apply(args: dict[str, Any]) -> None:
        payload = args["payload"]
        if path == "payload/components":
            payload["components"] = [{"component_id": COMPONENT if i == 0 else f"c-{i:03d}", "kind": "context",
                                      "text": f"part {i}", "citation_ids": [CITATION]} for i in range(n)]
        elif path == "payload/citations":
            payload["citations"] = [_citation(c) for c in _ids(n)]
        elif path in ("payload/components/*/citation_ids", "evidence/citation_ids"):
            payload["citations"] = [_citation(c) for c in _ids(max(n, 1))]
            target = payload["components"][0] if path.startswith("payload") else args["evidence"]
            target["citation_ids"] = _ids(n)
        elif path == "payload/reconciliation/family_refs":
            payload["reconciliation"] = {"family_refs": [f"family:{i:03d}" for i in range(n)]}
        else:
            raise AssertionError(f"no list builder for {path}")
    return apply


def with_value(tool: str, path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], Any]:
    def apply(args: dict[str, Any]) -> Any:
        joined = "/".join(path)
        if joined in ("payload/components/*/component_id", "payload/primary_component_id"):
            return _replace(args, COMPONENT, value)  # a component id is named in two places
        if path[-1] in ("citation_id", "*") and "citation" in joined:
            return _replace(args, CITATION, value)  # a citation id is named wherever it is cited
        if joined == "payload/valid_time/t_end":
            args["payload"]["valid_time"]["t"] = value  # t_end >= t is a cross-field rule
        _set(args, path, value)
        return args
    return apply


def string_of(tool: str, path: tuple[str, ...], n: int) -> str:
    if path[-1] == "candidate_id":
        return "cand_" + "a" * max(n - 5, 0)
    if path[-1] == "record_id":
        return "mem_" + "a" * max(n - 4, 0)
    if path[-1] == "idempotency_key":
        return _key(n)
    return "x" * n


def cases() -> Iterator[tuple[str, str, int | str, Callable[[dict[str, Any]], Any]]]:
    for tool, schema in ENFORCED_SCHEMAS.items():
        for path, bounds in bounded_fields(schema):
            joined = "/".join(path)
            if joined in BOUND_BY_HOST:
                continue
            if "minItems" in bounds or "maxItems" in bounds:
                lo, hi = bounds.get("minItems"), bounds.get("maxItems")
                for n in ([lo - 1, lo] if lo is not None and lo > 0 else [0]) + [hi, hi + 1]:
                    yield tool, joined, n, with_list(joined, n)
            elif "minimum" in bounds:
                lo, hi = bounds["minimum"], bounds["maximum"]
                for n in (lo - 1, lo, hi, hi + 1):
                    yield tool, joined, n, with_value(tool, path, n)
            else:
                lo, hi = bounds.get("minLength"), bounds["maxLength"]
                lengths = ([lo - 1, lo] if lo is not None else []) + [hi, hi + 1]
                for n in lengths:
                    yield tool, joined, n, with_value(tool, path, string_of(tool, path, n))


CASES = list(cases())


def test_every_bounded_field_is_walked() -> None:
    walked = {(tool, path) for tool, path, _, _ in CASES}
    for tool, schema in ENFORCED_SCHEMAS.items():
        for path, _ in bounded_fields(schema):
            joined = "/".join(path)
            assert (tool, joined) in walked or joined in BOUND_BY_HOST, (tool, joined)
    assert len(CASES) >= 4 * 30


def test_byte_bounded_strings_say_so_in_their_description() -> None:
    """Where characters and bytes differ (non-ASCII), JSON Schema cannot state the bound: the
    description does, the property's own or, for a shared definition, the definition's."""
    for tool, schema in ENFORCED_SCHEMAS.items():
        published = INPUT_SCHEMAS[tool]
        for path, _ in bounded_fields(schema):
            name = path[-1] if path[-1] != "*" else {"citation_ids": "citation_id",
                                                      "family_refs": "citation_id"}.get(path[-2], "")
            if name in _BYTE_BOUNDS and path[-1] != "*":
                node: Any = published
                for part in path:
                    node = node["items"] if part == "*" else node["properties"][part]
                ref = node.get("$ref", "")
                shared = published["$defs"][ref.rsplit("/", 1)[1]]["description"] if ref else ""
                assert "UTF-8 bytes" in node.get("description", "") + shared, (tool, path)


@pytest.fixture
def config(core, tmp_path: Path) -> Path:
    return write_config(tmp_path / "bounds.toml", address=core.address, signing_key=core.host_key_path,
                        binding=binding_for("acme"))


async def test_advertised_valid_iff_accepted_at_every_bound(config: Path) -> None:
    mismatches = []
    async with adapter_client(config, elicitation=approve) as client:
        published = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        validators = {name: jsonschema.Draft202012Validator(s) for name, s in published.items()}
        for tool, path, n, apply in CASES:
            base = copy.deepcopy(base_args(tool))
            made = apply(base)
            args = made if isinstance(made, dict) else base
            advertised = validators[tool].is_valid(args)
            try:
                env = envelope_of(await client.call_tool(tool, args))
                code = "OK" if env["ok"] else env["error"]["code"]
            except MCPError as exc:
                code = f"protocol {exc.code}"
            accepted = code not in SCHEMA_CODES
            if advertised != accepted:
                mismatches.append((tool, path, n, advertised, code))
    assert mismatches == []
