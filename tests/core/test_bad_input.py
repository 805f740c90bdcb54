"""Bad input gets its precise code and changes nothing (SPEC §4, issue 2 "Bad input")."""

from __future__ import annotations

import copy

import pytest
from google.protobuf import json_format

from engram_core.contract.errors import Code
from engram_core.contract.validation import validate_arguments
from tests.support.core_engines import one
from tests.support.core_support import PURPOSE, Client, capture_args

BASE = capture_args("Validation base text.", key="bad-input-key-00001")


def _mut(path: list, value) -> dict:
    args = copy.deepcopy(BASE)
    node = args
    for p in path[:-1]:
        node = node[p]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return args


CASES = [
    ("extra top-level field", _mut(["confirmed"], True), Code.INVALID_SCHEMA),
    ("extra nested field", _mut(["payload", "extra"], 1), Code.INVALID_SCHEMA),
    ("null", _mut(["payload", "purpose_ref"], None), Code.INVALID_SCHEMA),
    ("missing required", _mut(["payload", "components"], KeyError), Code.INVALID_SCHEMA),
    ("non-NFC", _mut(["payload", "components", 0, "text"], "Cafe\u0301"), Code.INVALID_SCHEMA),
    ("ref over 512 bytes", _mut(["payload", "primary_event", "type_ref"], "é" * 257), Code.INVALID_SCHEMA),
    ("text over 65536 bytes", _mut(["payload", "components", 0, "text"], "€" * 21846), Code.INVALID_SCHEMA),
    ("short idempotency key", _mut(["idempotency_key"], "short"), Code.INVALID_SCHEMA),
    ("unsafe integer", _mut(["payload", "valid_time", "t"], 2**53), Code.INVALID_SCHEMA),
    ("t_end before t", _mut(["payload", "valid_time", "t_end"], 0), Code.INVALID_SCHEMA),
    ("schema_version 1", _mut(["payload", "schema_version"], 1), Code.INVALID_SCHEMA),
    ("bad digest", _mut(["payload", "citations", 0, "content_digest"], "sha256:ABC"), Code.INVALID_DIGEST),
    ("bad evidence digest", _mut(["evidence", "evidence_digest"], "md5:00"), Code.INVALID_DIGEST),
    ("unresolved component citation", _mut(["payload", "components", 0, "citation_ids"], ["nope"]), Code.INVALID_SCHEMA),
    ("unresolved primary", _mut(["payload", "primary_component_id"], "c9"), Code.INVALID_SCHEMA),
    ("unresolved event citation", _mut(["payload", "primary_event", "citation_id"], "nope"), Code.INVALID_SCHEMA),
    ("unresolved evidence citation", _mut(["evidence", "citation_ids"], ["nope"]), Code.INVALID_SCHEMA),
    ("duplicate citation ids", _mut(["payload", "components", 0, "citation_ids"], ["cit1", "cit1"]), Code.INVALID_SCHEMA),
    ("not a real date", _mut(["payload", "citations", 0, "observed_at"], "2026-02-30T00:00:00.000Z"), Code.INVALID_SCHEMA),
    ("instant without ms", _mut(["payload", "citations", 0, "observed_at"], "2026-02-03T00:00:00Z"), Code.INVALID_SCHEMA),
    ("unsorted families", _mut(["payload", "reconciliation"], {"family_refs": ["b", "a"]}), Code.INVALID_SCHEMA),
    ("bad kind", _mut(["payload", "components", 0, "kind"], "note"), Code.INVALID_SCHEMA),
    ("too many components", _mut(["payload", "components"], [BASE["payload"]["components"][0]] * 65), Code.INVALID_SCHEMA),
]


@pytest.mark.parametrize(("name", "args", "code"), CASES, ids=[c[0] for c in CASES])
def test_malformed_capture_changes_nothing(ana: Client, name: str, args: dict, code: Code) -> None:
    with pytest.raises(Exception) as exc:
        validate_arguments("engram_memory_capture", args)
    assert exc.value.code == code  # type: ignore[attr-defined]
    store = ana.core.core.store
    with store.read() as tx:
        before = [one(tx, f"SELECT count(*) FROM {t}")[0] for t in ("candidates", "journal", "idempotency")]
    try:
        got = ana.fails("capture", args)
    except json_format.ParseError:
        # Not expressible through the generated message: send it as an unknown field on the wire.
        got = _raw_capture_with_unknown_field(ana)
    assert got == code
    with store.read() as tx:
        after = [one(tx, f"SELECT count(*) FROM {t}")[0] for t in ("candidates", "journal", "idempotency")]
    assert before == after


def test_oversized_arguments(ana: Client) -> None:
    comps = [{"component_id": f"c{i}", "kind": "context", "text": "x" * 60_000, "citation_ids": ["cit1"]} for i in range(20)]
    args = copy.deepcopy(BASE)
    args["payload"]["components"] = comps
    args["payload"]["primary_component_id"] = "c0"
    assert ana.fails("capture", args) == Code.INVALID_SCHEMA


@pytest.mark.parametrize("args", [
    {"record_id": "mem_UPPER", "purpose_ref": PURPOSE},
    {"record_id": "cand_" + "a" * 26, "purpose_ref": PURPOSE},
    {"record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE, "max_packet_bytes": 100},
])
def test_malformed_get(ana: Client, args: dict) -> None:
    assert ana.fails("get", args) == Code.INVALID_SCHEMA


@pytest.mark.parametrize("extra", [{"limit": 0}, {"limit": 51}, {"max_packet_bytes": 1_048_577},
                                   {"capability_policy": {"minimum_channels": "vector"}}])
def test_malformed_search(ana: Client, extra: dict) -> None:
    assert ana.fails("search", {"query": "q", "purpose_ref": PURPOSE, **extra}) == Code.INVALID_SCHEMA


def test_unknown_candidate_is_not_found(ana: Client) -> None:
    assert ana.fails("request_admission", {"candidate_id": "cand_" + "z" * 26,
                                           "idempotency_key": "unknown-cand-0001"}) == Code.NOT_FOUND


def _raw_capture_with_unknown_field(ana: Client) -> Code:
    import grpc

    from engram_core.api import memory_pb2
    from engram_core.rpc.convert import value_to_message
    from engram_core.rpc.status import code_from_rpc_error
    from engram_core.trust.hostctx import CONTEXT_METADATA_KEY

    raw = value_to_message(BASE, memory_pb2.CaptureRequest()).SerializeToString() + b"\xa8\x06\x01"
    call = ana.channel.unary_unary("/engram.v1.MemoryService/Capture", request_serializer=None,
                                   response_deserializer=None)
    try:
        call(raw, metadata=[(CONTEXT_METADATA_KEY, ana.context("capture"))], timeout=10)
    except grpc.RpcError as err:
        return code_from_rpc_error(err)
    raise AssertionError("unknown field accepted")
