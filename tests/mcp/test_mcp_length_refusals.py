"""A string over or under its bound is refused with a message that names the bound of the field that
failed (issue 31 item 4): one constant sentence per field, never the input. Real core, real
the adapter in process (as `engram mcp` builds it), the SDK's own client; the audit row carries the same class."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engram_core.contract.errors import REFUSALS, Code
from tests.support.mcp_helpers import (
    PURPOSE,
    adapter_client,
    audit_rows,
    binding_for,
    capture_args,
    envelope_of,
    unique,
    write_config,
)

pytestmark = pytest.mark.anyio


def _capture(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    args = copy.deepcopy(capture_args(unique("length-key"), "A decision worth keeping."))
    change(args)
    return args


def _set(path: tuple[Any, ...], value: str) -> Callable[[dict[str, Any]], None]:
    def change(args: dict[str, Any]) -> None:
        target = args
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return change


# (field, tool, arguments, reason class, the bound its message must state)
CASES = [
    ("query of 8,193 bytes", "engram_memory_search", {"query": "q" * 8_193, "purpose_ref": PURPOSE},
     "query_length", "1-8,192 UTF-8 bytes"),
    ("query of 8,192 bytes in 4-byte characters plus one", "engram_memory_search",
     {"query": "\U0001f600" * 2_048 + "q", "purpose_ref": PURPOSE}, "query_length", "1-8,192 UTF-8 bytes"),
    ("text of 65,537 bytes", "engram_memory_capture",
     _capture(_set(("payload", "components", 0, "text"), "t" * 65_537)), "text_length", "1-65,536 UTF-8 bytes"),
    ("idempotency key of 15 bytes", "engram_memory_capture", _capture(_set(("idempotency_key",), "k" * 15)),
     "idempotency_key_length", "16-256 UTF-8 bytes"),
    ("idempotency key of 257 bytes", "engram_memory_capture", _capture(_set(("idempotency_key",), "k" * 257)),
     "idempotency_key_length", "16-256 UTF-8 bytes"),
    ("source_ref of 513 bytes", "engram_memory_capture",
     _capture(_set(("payload", "citations", 0, "source_ref"), "s" * 513)), "ref_length", "1-512 UTF-8 bytes"),
    ("citation id in a list, 513 bytes", "engram_memory_capture",
     _capture(_set(("evidence", "citation_ids", 0), "c" * 513)), "ref_length", "1-512 UTF-8 bytes"),
    ("attestation of 4,097 bytes", "engram_memory_capture", _capture(_set(("evidence", "attestation"), "a" * 4_097)),
     "attestation_length", "4,096 UTF-8 bytes"),
    ("page_cursor of 4,097 characters", "engram_memory_search",
     {"query": "q", "purpose_ref": PURPOSE, "page_cursor": "p" * 4_097}, "page_cursor_length", "1-4,096 bytes"),
]


@pytest.fixture(scope="module")
def acme(core, tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("lengths") / "acme.toml", address=core.address,
                        signing_key=core.host_key_path, binding=binding_for("acme"))


async def test_a_length_refusal_names_the_bound_of_the_field_that_failed(core, acme: Path) -> None:
    answers = []
    async with adapter_client(acme) as client:
        for _what, tool, args, _, _ in CASES:
            answers.append(envelope_of(await client.call_tool(tool, args)))
    rows = audit_rows(core)
    for (what, _tool, _args, cls, bound), env in zip(CASES, answers, strict=True):
        error = env["error"]
        assert (error["code"], error["retriable"]) == ("INVALID_SCHEMA", False), (what, env)
        assert error["message"] == REFUSALS[Code.INVALID_SCHEMA][cls], what  # constant per field
        assert bound in error["message"], (what, error["message"])
        for echoed in ("qqqq", "tttt", "kkkk", "ssss", "cccc", "aaaa", "pppp", "\U0001f600"):
            assert echoed not in error["message"], what
        (row,) = rows[env["auditId"]]
        refusal = next(d for d in row["decisions"] if d.get("path") == "refusal")
        assert refusal["reason_class"] == cls, (what, refusal)


def test_each_length_class_has_its_own_message() -> None:
    classes = {cls for *_, cls, _ in CASES}
    messages = {REFUSALS[Code.INVALID_SCHEMA][cls] for cls in classes}
    assert len(messages) == len(classes)
