"""Who may obtain a confirmation grant, and what the core's confirmation key may sign
(SPEC §2, §8; issue 13 finding 2). Real gRPC on loopback, real Rego, real DuckDB file.

The attacker holds an ordinary agent context (no host principal), or the core's own
``confirmation.key`` file, and tries to get past the human."""

from __future__ import annotations

import grpc
import pytest

from engram_core.api import admin_pb2, host_pb2
from engram_core.contract.errors import Code
from engram_core.contract.operation import operation_digest
from engram_core.rpc.server import RunningCore
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context, make_grant
from engram_core.trust.hostkeys import load_private_key_file, public_pem
from tests.support.core_support import Client, Failed, now_ms

FORGET = "engram_memory_forget"


def _forget_args(ana: Client, text: str) -> dict:
    rid = ana.remember(text)
    return {"record_id": rid, "idempotency_key": "fg-grant-" + rid[4:30], "reason_ref": "reason:test"}


def _issue(ana: Client, args: dict, context: bytes, *, approved_at_ms: int) -> host_pb2.IssueConfirmationResponse:
    digest = operation_digest(tool=FORGET, tenant=ana.tenant, workspace=ana.workspace, principal=ana.principal,
                              arguments=args)
    return ana.host.IssueConfirmation(
        host_pb2.IssueConfirmationRequest(tool=FORGET, target=args["record_id"], operation_digest=digest,
                                          approved_at_ms=approved_at_ms),
        metadata=[(CONTEXT_METADATA_KEY, context)], timeout=10)


def _code(call) -> Code:
    try:
        call()
    except grpc.RpcError as err:
        return code_from_rpc_error(err)
    raise AssertionError("call unexpectedly succeeded")


def test_agent_context_cannot_obtain_a_grant_for_its_own_forget(ana: Client) -> None:
    args = _forget_args(ana, "Grants: the agent tries to approve forgetting the ptarmigan note.")
    # The agent picks its own approval time, as in the finding.
    assert _code(lambda: _issue(ana, args, ana.context(call="host"), approved_at_ms=now_ms())) == Code.UNAUTHORIZED
    # Without the grant it never got, the forget is the protocol refusal, and nothing changed.
    assert ana.fails("forget", args) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert ana.get(args["record_id"])["record"]["record_id"] == args["record_id"]


def test_host_principal_obtains_a_grant_that_confirms_the_forget(ana: Client) -> None:
    args = _forget_args(ana, "Grants: the host asked its human about the snow bunting note.")
    host_ctx = ana.context(host_principal=True)
    issued = _issue(ana, args, host_ctx, approved_at_ms=now_ms())
    assert issued.grant_id.startswith("cnf_")
    out = ana.call("forget", args, grant=issued.signed_grant)
    assert out["receipt"]["to_state"] == "tombstoned"


def _confirmation_key_context(core: RunningCore, **fields) -> bytes:
    key = load_private_key_file(core.core.data_dir / "confirmation.key")
    return make_context(key, now_ms=now_ms(), **fields)


def test_context_signed_with_the_confirmation_key_cannot_export(core: RunningCore, ana: Client) -> None:
    ana.remember("Grants: a record the thief of confirmation.key wants exported.")
    ctx = _confirmation_key_context(core, call="admin", tenant="_host", workspace="_admin", principal="host:thief",
                                    host_principal=True, maintenance_scopes=("read", "maintain"),
                                    memory_enabled=False)
    request = admin_pb2.ExportRequest(tenant="acme", workspace="alpha", what="journal")
    assert _code(lambda: ana.admin.Export(request, metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE
    # The same request signed by the host key is served: the refusal is the key's role, not the request.
    good = make_context(ana.key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                        host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False,
                        now_ms=now_ms())
    ana.admin.Export(request, metadata=[(CONTEXT_METADATA_KEY, good)], timeout=10)


def test_agent_context_signed_with_the_confirmation_key_is_refused(core: RunningCore, ana: Client) -> None:
    ctx = _confirmation_key_context(core, call="engram_memory_search", tenant="acme", workspace="alpha",
                                    principal="user:ana",
                                    purpose_ref=ana.purpose_ref)
    assert ana.fails("search", {"query": "anything", "purpose_ref": ana.purpose_ref}, context=ctx) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_grant_signed_by_the_core_confirmation_key_still_confirms(core: RunningCore, ana: Client) -> None:
    args = _forget_args(ana, "Grants: the core's own key signs this grant for the dunlin note.")
    key = load_private_key_file(core.core.data_dir / "confirmation.key")
    grant = make_grant(key, tenant=ana.tenant, workspace=ana.workspace, principal=ana.principal, tool=FORGET,
                       target=args["record_id"],
                       operation_digest=operation_digest(tool=FORGET, tenant=ana.tenant, workspace=ana.workspace,
                                                         principal=ana.principal, arguments=args),
                       approved_at_ms=now_ms())
    assert ana.call("forget", args, grant=grant)["receipt"]["to_state"] == "tombstoned"


def test_the_confirmation_key_cannot_be_added_as_a_host_key(core: RunningCore, ana: Client) -> None:
    pub = load_private_key_file(core.core.data_dir / "confirmation.key").public_key()
    host = make_context(ana.key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                        host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False,
                        now_ms=now_ms())
    request = admin_pb2.HostKeyRequest(public_key_pem=public_pem(pub))
    assert _code(lambda: ana.admin.TrustHostKey(request, metadata=[(CONTEXT_METADATA_KEY, host)], timeout=10)) \
        == Code.INVALID_SCHEMA
    ctx = _confirmation_key_context(core, call="engram_memory_search", tenant="acme", workspace="alpha",
                                    principal="user:ana",
                                    purpose_ref=ana.purpose_ref)
    assert ana.fails("search", {"query": "anything", "purpose_ref": ana.purpose_ref}, context=ctx) \
        == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_a_grant_never_passes_as_a_context(ana: Client) -> None:
    args = _forget_args(ana, "Grants: a grant sent where a context belongs, the knot note.")
    grant = ana.grant("forget", args)
    with pytest.raises(Failed) as err:
        ana.call("forget", args, context=grant, grant=grant)
    assert err.value.code == Code.TRUSTED_CONTEXT_UNAVAILABLE


def test_a_replayed_forget_needs_no_second_grant(ana: Client) -> None:
    """Issue 26.8: the same forget again (same key and arguments, as after MUTATION_OUTCOME_UNKNOWN)
    is answered with its stored outcome before any grant is asked for: it changes nothing. A new
    operation under another key still needs one."""
    args = _forget_args(ana, "Grants: a forget of the dotterel note, retried after an unknown outcome.")
    first = ana.call("forget", args, grant=True)
    check = host_pb2.CheckGatedRequest(tool=FORGET, target=args["record_id"], idempotency_key=args["idempotency_key"],
                                       reason_ref=args["reason_ref"])
    assert ana.host.CheckGated(check, metadata=[(CONTEXT_METADATA_KEY, ana.context("forget"))],
                               timeout=10).status == "replay"
    again = ana.call("forget", args)  # no grant at all
    assert again == {**first, "replayed": True}
    other = {**args, "idempotency_key": "fg-grant-other-" + args["record_id"][4:20]}
    assert ana.fails("forget", other) == Code.TRUSTED_CONTEXT_UNAVAILABLE  # a new operation: the human first
    assert ana.fails("forget", {**args, "reason_ref": "reason:changed"}) == Code.DIGEST_CONFLICT
