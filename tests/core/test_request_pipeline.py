"""One request pipeline (docs/architecture.md): a call is validated and canonicalized once, its
digests computed once, and they are the digests the contract defines (docs/digests.md).

The counting tests drive a real core over gRPC and count, in the server, every serialization
that writes the capture's text: RFC 8785 canonical JSON (the fast path's string encoder, in
``canonical`` and in ``validation``'s one-pass check), ``rfc8785`` itself, and ``json.dumps``.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import rfc8785

from engram_core.contract import canonical as canonical_module
from engram_core.contract import validation as validation_module
from engram_core.contract.canonical import digest
from engram_core.contract.operation import operation_digest, request_digest
from engram_core.contract.schema_examples import TOOL_EXAMPLES
from engram_core.services.pipeline import prepare
from engram_core.trust.hostctx import verify_context
from tests.support.core_support import Client, capture_args


class Serializations:
    """How many times a marker string is written by any JSON serializer, in any thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, marker: str) -> None:
        self.marker = marker
        self.count = 0
        self._lock = threading.Lock()
        encode = canonical_module.encode_basestring
        dumps, rfc_dumps = json.dumps, rfc8785.dumps

        def counted_encode(text: str) -> str:
            if marker in text:
                self._saw()
            return encode(text)

        def counted_dumps(*args: Any, **kwargs: Any) -> str:
            out = dumps(*args, **kwargs)
            if marker in out:
                self._saw()
            return out

        def counted_rfc(value: Any) -> bytes:
            out = rfc_dumps(value)
            if marker.encode() in out:
                self._saw()
            return out

        monkeypatch.setattr(canonical_module, "encode_basestring", counted_encode)
        monkeypatch.setattr(validation_module, "encode_basestring", counted_encode)
        monkeypatch.setattr(json, "dumps", counted_dumps)
        monkeypatch.setattr(rfc8785, "dumps", counted_rfc)

    def _saw(self) -> None:
        with self._lock:
            self.count += 1


@pytest.fixture
def marker() -> Iterator[str]:
    yield f"canonicalized-once-{uuid.uuid4().hex}"


def test_a_capture_canonicalizes_its_payload_once(ana: Client, marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation (its size bound), the capture policy's payload size, the request digest, the
    payload digest, the record digest and the sealed envelope all use the one canonical form."""
    args = capture_args(f"We chose the {marker} store because it is embedded.")
    seen = Serializations(monkeypatch, marker)
    out = ana.call("capture", args)
    assert out["status"] == "committed_pending"
    assert seen.count == 1


def test_a_gated_capture_canonicalizes_its_payload_once_too(ana: Client, marker: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With a confirmation: the grant's operation digest splices the same canonical form (a
    grant for another operation digest is refused, so the digest is the one the host signed)."""
    args = capture_args(f"A gated capture of the {marker} decision.")
    grant = ana.grant("capture", args)
    seen = Serializations(monkeypatch, marker)
    core = ana.core.core
    ctx = verify_context(ana.context(), core.trusted, now_ms=core.now_ms())
    prepared = prepare(ctx, "engram_memory_capture", args)
    assert seen.count == 1
    assert prepared.operation_digest == operation_digest(tool="engram_memory_capture", tenant=ctx.tenant,
                                                         workspace=ctx.workspace, principal=ctx.principal,
                                                         arguments=args)
    assert seen.count == 2  # the reference digest above walked it once more, as every step used to
    assert ana.call("capture", args, grant=grant)["status"] == "committed_pending"
    assert seen.count == 3


def test_an_admission_serializes_the_payload_once_its_sealed_body(ana: Client, marker: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cap = ana.call("capture", capture_args(f"The {marker} admission seals its body once."))
    seen = Serializations(monkeypatch, marker)
    assert ana.admit(cap["candidate_id"])["outcome"]["status"] == "accepted"
    assert seen.count == 1


def test_the_spliced_digests_are_the_contracts_digests(ana: Client) -> None:
    """The record digest a capture answers with, and the payload digest its record carries, are
    the digests docs/digests.md defines over the effective payload written out in full."""
    args = capture_args("The spliced digests are the contract's digests.")
    cap = ana.call("capture", args)
    effective = {**args["payload"], "retention": {"derivative_rule": "make-ineligible"},
                 "scope_ref": {"tenant": ana.tenant, "workspace": ana.workspace}}
    payload_digest = digest("payload", effective)
    assert cap["record_digest"] == digest("record", {
        "candidate_id": cap["candidate_id"], "payload": effective, "payload_digest": payload_digest,
        "trust_class": "asserted", "principal": ana.principal, "agent_id": "agent-7"})
    rid = ana.admit(cap["candidate_id"])["outcome"]["record_id"]
    assert ana.get(rid)["record"]["payload_digest"] == payload_digest


@pytest.mark.parametrize("tool", sorted(TOOL_EXAMPLES))
def test_a_prepared_call_has_the_digests_of_its_arguments(ana: Client, tool: str) -> None:
    core = ana.core.core
    ctx = verify_context(ana.context(), core.trusted, now_ms=core.now_ms())
    for example in TOOL_EXAMPLES[tool]:
        prepared = prepare(ctx, tool, example)
        assert prepared.body.data == canonical_module.canonical_json(example)
        assert prepared.request_digest == request_digest(tool, example)
        assert prepared.operation_digest == operation_digest(tool=tool, tenant=ctx.tenant, workspace=ctx.workspace,
                                                             principal=ctx.principal, arguments=example)


def test_a_read_answers_with_the_digests_of_what_it_answers(ana: Client) -> None:
    """Search and get canonicalize their answer once, each payload's text spliced from its sealed
    body: the digests are still those of the answer written out in full."""
    rid = ana.remember("The spliced read digests cover what the read answers.")
    page = ana.search("spliced read digests")
    assert any(p["record"]["record_id"] == rid for p in page["records"])
    body = {k: v for k, v in page.items() if k != "response_digest"}
    assert page["response_digest"] == digest("response", body)
    packet = ana.get(rid)
    assert packet["packet_digest"] == digest("packet", {k: v for k, v in packet.items() if k != "packet_digest"})
    assert "scope_ref" not in packet["record"]["payload"]
