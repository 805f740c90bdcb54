"""What `engram admin revoke` cuts off (SPEC §12; issue 13 finding 7): contexts and grants
signed under an older authorization epoch. Hosts learn the new epoch from the core
(HostService.AuthorizationEpoch, host principals only). Real gRPC, real Rego."""

from __future__ import annotations

import json

import grpc

from engram_core.api import admin_pb2, host_pb2
from engram_core.contract.errors import Code
from engram_core.rpc.server import RunningCore
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, HOST_CALL, make_context
from tests.support.core_support import PURPOSE, Client, now_ms


def _revoke(ana: Client) -> int:
    host = make_context(ana.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                        now_ms=now_ms(),
                        host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False)
    out = ana.admin.Revoke(admin_pb2.ScopeRequest(tenant=ana.tenant, workspace=ana.workspace),
                           metadata=[(CONTEXT_METADATA_KEY, host)], timeout=10)
    return json.loads(out.json)["authorization_epoch"]


def _epoch(ana: Client, context: bytes) -> int | Code:
    try:
        return ana.host.AuthorizationEpoch(host_pb2.AuthorizationEpochRequest(),
                                           metadata=[(CONTEXT_METADATA_KEY, context)], timeout=10).authorization_epoch
    except grpc.RpcError as err:
        return code_from_rpc_error(err)


def test_context_and_grant_signed_before_revoke_are_refused(fresh_core: RunningCore) -> None:
    ana = Client(fresh_core)
    rid = ana.remember("Revoke: the leaked-context note about the eider.")
    args = {"record_id": rid, "idempotency_key": "fg-revoke-" + rid[4:30], "reason_ref": "reason:test"}
    leaked_context = ana.context("get")        # epoch 0, inside its lifetime
    leaked_grant = ana.grant("forget", args)   # epoch 0, approved just now
    assert _revoke(ana) == 1
    assert ana.fails("get", {"record_id": rid, "purpose_ref": PURPOSE}, context=leaked_context) \
        == Code.AUTHORIZATION_REVOKED
    # A fresh context of the new epoch works; the grant signed before the revoke does not.
    fresh = ana.context("forget", authorization_epoch=1)
    assert ana.fails("forget", args, context=fresh, grant=leaked_grant) == Code.AUTHORIZATION_REVOKED
    assert ana.call("get", {"record_id": rid, "purpose_ref": PURPOSE},
                    context=ana.context("get", authorization_epoch=1))["record"]["record_id"] == rid
    # A grant of the new epoch confirms it.
    out = ana.call("forget", args, context=ana.context("forget", authorization_epoch=1),
                   grant=ana.grant("forget", args, authorization_epoch=1))
    assert out["receipt"]["to_state"] == "tombstoned"


def test_hosts_read_the_current_epoch_agents_do_not(fresh_core: RunningCore) -> None:
    ana = Client(fresh_core)
    assert _epoch(ana, ana.context(host_principal=True)) == 0
    assert _revoke(ana) == 1
    assert _revoke(ana) == 2
    # Answered to a host whose context still carries the old epoch: that is how it learns.
    assert _epoch(ana, ana.context(host_principal=True)) == 2
    assert _epoch(ana, ana.context(call=HOST_CALL)) == Code.UNAUTHORIZED
    assert _epoch(ana, ana.context(call=HOST_CALL, authorization_epoch=2)) == Code.UNAUTHORIZED
