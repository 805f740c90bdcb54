"""Every maintenance call needs a host principal with the scope the policy names (SPEC §2, §12)."""

from __future__ import annotations

import grpc
import pytest

from engram_core.api import admin_pb2
from tests.support.admin_support import TENANT, WORKSPACE, code_of, new_event_id


def test_agent_bound_context_is_refused_for_reads_and_changes(env):
    rid = env.record("agent context cannot maintain")
    calls = [
        ("History", env.scope_req()),
        ("KeyStatus", env.scope_req()),
        ("Transition", admin_pb2.TransitionRequest(tenant=TENANT, workspace=WORKSPACE, operation="dispute",
                                                   target=rid, event_id=new_event_id(), reason_ref="r:x")),
        ("Activate", admin_pb2.ActivateRequest(tenant=TENANT, workspace=WORKSPACE)),
    ]
    for rpc, req in calls:
        with pytest.raises(grpc.RpcError) as err:
            env.admin(rpc, req, md=env.agent_md())
        assert code_of(err.value) == "UNAUTHORIZED", rpc
    assert env.get(rid)["record"]["state"] == "accepted_current"


def test_read_scope_reads_but_cannot_change_anything(env):
    rid = env.record("read scope only")
    assert env.admin("History", admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE), scopes=("read",))["records"]
    changes = [
        ("Transition", admin_pb2.TransitionRequest(tenant=TENANT, workspace=WORKSPACE, operation="dispute",
                                                   target=rid, event_id=new_event_id(), reason_ref="r:x")),
        ("Revoke", env.scope_req()),
        ("RotateKeys", env.scope_req()),
        ("RebuildProjections", env.scope_req()),
        ("ReloadPolicies", env.scope_req()),
        ("Migrate", env.scope_req()),
    ]
    for rpc, req in changes:
        with pytest.raises(grpc.RpcError) as err:
            env.admin(rpc, req, scopes=("read",))
        assert code_of(err.value) == "UNAUTHORIZED", rpc
    assert env.get(rid)["record"]["state"] == "accepted_current"


def test_missing_context_is_unauthenticated(env):
    with pytest.raises(grpc.RpcError) as err:
        env.admin_stub.History(admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_admin_calls_are_audited_with_the_host_principal(env):
    env.admin("KeyStatus", env.scope_req())
    rows = env.admin("Export", admin_pb2.ExportRequest(what="audit"))["items"]
    ops = {(r["operation"], r["principal"]) for r in rows}
    assert ("admin.activate", "host:operator") in ops
    assert ("admin.key_status", "host:operator") in ops
