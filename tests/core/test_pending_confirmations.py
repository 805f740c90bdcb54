"""Confirmations given in the console's browser page, at the core (issue 61;
engram_core/services/pending_confirmations.py). Real gRPC on loopback, real Rego, a real store.

The attacker holds an ordinary agent context (no host principal) and tries to approve its own
forget, claim someone else's approval, or use one twice; a context of another tenant tries to see
or decide it."""

from __future__ import annotations

import json
import time

import grpc

from engram_core.api import host_pb2
from engram_core.contract.errors import Code
from engram_core.contract.operation import operation_digest
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY
from tests.support.core_support import Client, now_ms

FORGET = "engram_memory_forget"


def _code(call) -> Code:
    try:
        call()
    except grpc.RpcError as err:
        return code_from_rpc_error(err)
    raise AssertionError("call unexpectedly succeeded")


def _args(ana: Client, text: str) -> dict:
    rid = ana.remember(text)
    return {"record_id": rid, "idempotency_key": "fg-url-" + rid[4:30], "reason_ref": "reason:asked"}


def _digest(client: Client, args: dict) -> str:
    return operation_digest(tool=FORGET, tenant=client.tenant, workspace=client.workspace,
                            principal=client.principal, arguments=args)


def _park(ana: Client, args: dict, *, digest: str | None = None, ttl_ms: int = 60_000) -> str:
    reply = ana.host.ParkConfirmation(host_pb2.ParkConfirmationRequest(
        tool=FORGET, target=args["record_id"], reason_ref=args["reason_ref"],
        operation_digest=digest or _digest(ana, args), ttl_ms=ttl_ms),
        metadata=[(CONTEXT_METADATA_KEY, ana.context(call="host"))], timeout=10)
    assert reply.confirmation_id.startswith("cfm_") and len(reply.confirmation_id) >= 40
    return reply.confirmation_id


def _claim(client: Client, cid: str, args: dict, *, digest: str | None = None, wait_ms: int = 0) -> str:
    return client.host.ClaimConfirmation(host_pb2.ClaimConfirmationRequest(
        confirmation_id=cid, tool=FORGET, target=args["record_id"], operation_digest=digest or _digest(client, args),
        wait_ms=wait_ms), metadata=[(CONTEXT_METADATA_KEY, client.context(call="host"))], timeout=15).status


def _person(client: Client, scopes: tuple[str, ...] = ("read", "maintain"), **over) -> bytes:
    """The console's context for a signed-in person on the client's scope."""
    return client.context(host_principal=True, principal="local:owner", agent_id="engram-console",
                          memory_enabled=False, maintenance_scopes=scopes, **over)


def _decide(client: Client, cid: str, approve: bool, context: bytes) -> dict:
    return json.loads(client.host.DecideConfirmation(host_pb2.DecideConfirmationRequest(
        confirmation_id=cid, approve=approve), metadata=[(CONTEXT_METADATA_KEY, context)], timeout=10).json)


def _list(client: Client, cid: str, context: bytes) -> dict:
    return json.loads(client.host.ListConfirmations(host_pb2.ListConfirmationsRequest(confirmation_id=cid),
                                                    metadata=[(CONTEXT_METADATA_KEY, context)], timeout=10).json)


def test_a_person_approves_once_and_the_same_binding_claims_once(ana: Client) -> None:
    args = _args(ana, "Pending: the person approves forgetting the dipper note.")
    cid = _park(ana, args)
    listed = _list(ana, cid, _person(ana, ("read",)))["confirmations"]
    assert [(c["target"], c["reason_ref"], c["principal"], c["agent_id"], c["state"]) for c in listed] == [
        (args["record_id"], "reason:asked", "user:ana", "agent-7", "pending")]
    assert _claim(ana, cid, args) == "pending"
    assert _decide(ana, cid, True, _person(ana))["confirmations"][0]["decided_by"] == "local:owner"
    # A decision is taken once.
    assert _code(lambda: _decide(ana, cid, False, _person(ana))) == Code.ALREADY_TERMINAL
    # Another principal of the scope, or another operation, cannot claim it, and does not spoil it.
    bob = Client(ana.core, principal="user:bob")
    assert _code(lambda: _claim(bob, cid, args, digest=_digest(ana, args))) == Code.NOT_FOUND
    other = dict(args, reason_ref="reason:other")
    assert _code(lambda: _claim(ana, cid, other)) == Code.NOT_FOUND
    assert _claim(ana, cid, args) == "approved"
    # Single use: claimed once, then it is gone.
    assert _code(lambda: _claim(ana, cid, args)) == Code.NOT_FOUND
    assert _code(lambda: _decide(ana, cid, True, _person(ana))) == Code.NOT_FOUND


def test_an_agent_context_cannot_approve_its_own_forget(ana: Client) -> None:
    args = _args(ana, "Pending: the agent tries to approve forgetting the wren note itself.")
    cid = _park(ana, args)
    for scopes in ((), ("read", "maintain")):  # a fresh context per call: each one is spent by its call
        assert _code(lambda s=scopes: _decide(ana, cid, True, ana.context(call="host", maintenance_scopes=s))) \
            == Code.UNAUTHORIZED
        assert _code(lambda s=scopes: _list(ana, cid, ana.context(call="host", maintenance_scopes=s))) \
            == Code.UNAUTHORIZED
    # A host principal with "read" only may look, not decide.
    assert _code(lambda: _decide(ana, cid, True, _person(ana, ("read",)))) == Code.UNAUTHORIZED
    assert _claim(ana, cid, args) == "pending"


def test_another_tenant_neither_sees_nor_decides(ana: Client) -> None:
    args = _args(ana, "Pending: a globex person looks for the acme kestrel note.")
    cid = _park(ana, args)
    globex = Client(ana.core, tenant="globex", workspace="alpha")
    beta = Client(ana.core, workspace="beta")
    for other in (globex, beta):
        assert _code(lambda other=other: _list(other, cid, _person(other))) == Code.NOT_FOUND
        assert _code(lambda other=other: _decide(other, cid, True, _person(other))) == Code.NOT_FOUND
        assert cid not in json.dumps(json.loads(other.host.ListConfirmations(
            host_pb2.ListConfirmationsRequest(), metadata=[(CONTEXT_METADATA_KEY, _person(other, ("read",)))],
            timeout=10).json))
    assert _claim(ana, cid, args) == "pending"


def test_a_digest_that_does_not_bind_what_the_page_shows_is_refused(ana: Client) -> None:
    args = _args(ana, "Pending: the page must show what the digest binds (the grebe note).")
    lying = _digest(ana, dict(args, reason_ref="reason:something-else"))
    assert _code(lambda: _park(ana, args, digest=lying)) == Code.INVALID_DIGEST


def test_denied_and_expired(ana: Client) -> None:
    args = _args(ana, "Pending: the person denies forgetting the avocet note.")
    cid = _park(ana, args)
    _decide(ana, cid, False, _person(ana))
    assert _claim(ana, cid, args) == "denied"
    assert _code(lambda: _claim(ana, cid, args)) == Code.NOT_FOUND

    args = _args(ana, "Pending: nobody answers about the curlew note in time.")
    cid = _park(ana, args, ttl_ms=1_000)
    started = now_ms()
    assert _claim(ana, cid, args, wait_ms=3_000) == "expired"  # waited for it, up to the expiry
    assert 900 <= now_ms() - started < 3_000
    time.sleep(0.05)
    assert _code(lambda: _decide(ana, cid, True, _person(ana))) == Code.NOT_FOUND
