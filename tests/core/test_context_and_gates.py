"""Host-bound context (SPEC §2), authorization by policy, confirmation gate (SPEC §8)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.contract.errors import Code
from engram_core.trust.hostctx import make_context, make_grant
from tests.support.core_support import PURPOSE, Client, capture_args, now_ms


def _search(c: Client, **kw) -> Code:
    return c.fails("search", {"query": "anything", "purpose_ref": PURPOSE}, **kw)


def test_missing_context_is_refused(ana: Client) -> None:
    assert _search(ana, context=None) == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_unknown_host_key_is_refused(ana: Client) -> None:
    rogue = make_context(Ed25519PrivateKey.generate(), call="engram_memory_search", tenant="acme", workspace="alpha",
                         principal="user:ana",
                         purpose_ref=PURPOSE, now_ms=now_ms())
    assert _search(ana, context=rogue) == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_tampered_context_is_refused(ana: Client) -> None:
    raw = bytearray(ana.context("search"))
    raw[10] ^= 0x01
    assert _search(ana, context=bytes(raw)) == Code.TRUSTED_CONTEXT_UNAVAILABLE


@pytest.mark.parametrize("overrides", [
    {"now_ms": 0},                                # long expired
    {"ttl_ms": 301_000},                          # lifetime beyond 300 s
    {"tenant": ""},                               # empty binding
    {"principal": ""},
    {"now_ms": 10**13},                           # issued in the future
])
def test_invalid_context_fields_are_refused(ana: Client, overrides: dict) -> None:
    assert _search(ana, context=ana.context("search", **overrides)) == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_purpose_mismatch_is_the_protocol_refusal(ana: Client) -> None:
    assert ana.fails("search", {"query": "x", "purpose_ref": "purpose:other"}) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.fails("capture", capture_args("x y z", purpose_ref="purpose:other")) == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_memory_off_unless_host_enabled_and_scope_activated(core) -> None:
    disabled = Client(core, memory_enabled=False)
    assert disabled.tools() == []
    assert _search(disabled) == Code.UNAUTHORIZED
    inactive = Client(core, workspace="never-activated")
    assert inactive.tools() == []
    assert inactive.fails("capture", capture_args("not activated")) == Code.UNAUTHORIZED
    assert sorted(Client(core).tools()) == sorted([
        "engram_memory_search", "engram_memory_get", "engram_memory_capture",
        "engram_memory_request_admission", "engram_memory_withdraw", "engram_memory_forget"])


def test_agent_context_cannot_use_admin(ana: Client) -> None:
    from engram_core.api import admin_pb2
    from engram_core.rpc.status import code_from_rpc_error
    from engram_core.trust.hostctx import CONTEXT_METADATA_KEY

    try:
        ana.admin.Activate(admin_pb2.ActivateRequest(tenant="acme", workspace="x"),
                           metadata=[(CONTEXT_METADATA_KEY, ana.context(call="admin"))])
    except Exception as err:  # grpc.RpcError
        assert code_from_rpc_error(err) == Code.UNAUTHORIZED
    else:
        raise AssertionError("agent activated a scope")


def _forget_setup(ana: Client, text: str) -> dict:
    rid = ana.remember(text)
    return {"record_id": rid, "idempotency_key": "fg-gate-" + rid[4:30], "reason_ref": "reason:test"}


def test_forget_without_confirmation_is_protocol_refusal(ana: Client) -> None:
    args = _forget_setup(ana, "Gate: the marmot endpoint is /v2/marmot.")
    assert ana.fails("forget", args) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.get(args["record_id"])["record"]["record_id"] == args["record_id"]


@pytest.mark.parametrize("mutation", [
    {"target": "mem_" + "b" * 52},
    {"operation_digest": "sha256:" + "0" * 64},
    {"tenant": "globex"},
    {"principal": "user:bob"},
    {"tool": "engram_memory_withdraw"},
    {"approved_at_ms": 1_000},                       # expired long ago
    {"approved_at_ms": -1},                          # executed more than 30 s after approval (set below)
])
def test_confirmation_that_does_not_verify_is_gate_failed(ana: Client, mutation: dict) -> None:
    args = _forget_setup(ana, f"Gate: the badger runs {mutation} case.")
    if mutation.get("approved_at_ms") == -1:
        mutation = {"approved_at_ms": now_ms() - 31_000}
    grant = ana.grant("forget", args, **mutation)
    assert ana.fails("forget", args, grant=grant) == Code.GATE_FAILED
    assert ana.get(args["record_id"])["record"]["record_id"] == args["record_id"]


def test_forged_grant_signature_is_gate_failed(ana: Client) -> None:
    args = _forget_setup(ana, "Gate: the forged signature case for the mink job.")
    from engram_core.contract.operation import operation_digest

    forged = make_grant(Ed25519PrivateKey.generate(), tenant="acme", workspace="alpha", principal="user:ana",
                        tool="engram_memory_forget", target=args["record_id"],
                        operation_digest=operation_digest(tool="engram_memory_forget", tenant="acme",
                                                          workspace="alpha", principal="user:ana", arguments=args),
                        approved_at_ms=now_ms())
    assert ana.fails("forget", args, grant=forged) == Code.GATE_FAILED


def test_grant_is_single_use(ana: Client) -> None:
    a1 = _forget_setup(ana, "Gate: single use grant, the first vole.")
    grant = ana.grant("forget", a1)
    ana.call("forget", a1, grant=grant)
    # the same grant replayed for a fresh key+same target: replay of the effect is fine, but
    # a new operation needs a new grant — prove by withdrawing with a reused grant
    cap = ana.capture("Gate: single use grant for withdraw, the shrew.")
    w = {"candidate_id": cap["candidate_id"], "idempotency_key": "wd-single-use-01", "reason_ref": "r:x"}
    g = ana.grant("withdraw", w)
    ana.call("withdraw", w, grant=g)
    w2 = dict(w, idempotency_key="wd-single-use-02")
    assert ana.fails("withdraw", w2, grant=g) in (Code.GATE_FAILED, Code.ALREADY_TERMINAL)
    cap2 = ana.capture("Gate: another shrew candidate.")
    w3 = {"candidate_id": cap2["candidate_id"], "idempotency_key": "wd-single-use-03", "reason_ref": "r:x"}
    g3 = ana.grant("withdraw", w3)
    ana.call("withdraw", w3, grant=g3)
    cap3 = ana.capture("Gate: a third shrew candidate.")
    w4 = {"candidate_id": cap3["candidate_id"], "idempotency_key": "wd-single-use-04", "reason_ref": "r:x"}
    assert ana.fails("withdraw", w4, grant=g3) == Code.GATE_FAILED


def test_model_written_confirmation_is_invalid_schema(ana: Client) -> None:
    from engram_core.contract.validation import validate_arguments

    with pytest.raises(Exception) as exc:
        validate_arguments("engram_memory_forget", {"record_id": "mem_" + "a" * 52, "idempotency_key": "k" * 16,
                                                    "reason_ref": "r", "confirmed": True})
    assert getattr(exc.value, "code", None) == Code.INVALID_SCHEMA

