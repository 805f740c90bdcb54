"""Host lifecycle transitions of SPEC §6: idempotent by event id, journaled, audited, checked before any cursor."""

from __future__ import annotations

import grpc
import pytest

from engram_core.api import admin_pb2
from engram_core.contract.scope import Scope
from engram_core.contract.validation import format_instant
from tests.support.admin_support import TENANT, WORKSPACE, code_of, new_event_id


def _journal(env) -> list[dict]:
    return env.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="journal"))["items"]


def _state(env, rid: str) -> str:
    return env.admin("History", admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE, record_id=rid))["records"][0]["state"]


def test_dispute_and_resolve_are_idempotent_by_event_id(env):
    rid = env.record("dispute me about the database choice")
    eid = new_event_id()
    first = env.transition("dispute", rid, event_id=eid)
    assert first["replayed"] is False
    assert first["receipt"]["from_state"] == "accepted_current" and first["receipt"]["to_state"] == "accepted_disputed"
    again = env.transition("dispute", rid, event_id=eid)
    assert again == {**first, "replayed": True}
    with pytest.raises(grpc.RpcError) as err:
        env.transition("mark_non_current", rid, event_id=eid)
    assert code_of(err.value) == "DIGEST_CONFLICT"
    disputed = env.admin("History", admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE, disputed_only=True))
    assert [r["record_id"] for r in disputed["records"]] == [rid]
    with pytest.raises(grpc.RpcError) as err:
        env.get(rid)
    assert code_of(err.value) == "NOT_FOUND"
    resolved = env.transition("resolve_dispute", rid, to_state="accepted_current")
    assert resolved["receipt"]["to_state"] == "accepted_current"
    assert env.get(rid)["record"]["record_id"] == rid
    events = [e for e in _journal(env) if e["target"] == rid]
    assert [e["operation"] for e in events] == ["dispute", "resolve_dispute"]
    assert events[0]["event_id"] == eid


def test_supersede_then_rewind_swaps_atomically(env):
    old = env.record("we use postgres for billing")
    new = env.record("we use duckdb for billing")
    sup = env.transition("supersede", old, successor=new)
    assert sup["receipt"]["to_state"] == "historical" and sup["receipt"]["successor"] == new
    assert env.search_ids("billing") == [new]
    hist = env.admin("History", admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE, record_id=old))
    assert hist["records"][0]["successor_id"] == new
    assert [e["operation"] for e in hist["events"]] == ["capture", "accept", "supersede"]
    rew = env.transition("rewind", old, successor=new)
    assert rew["receipt"]["to_state"] == "accepted_current"
    assert rew["receipt"]["successor_event"]["to_state"] == "historical"
    assert int(rew["receipt"]["successor_event"]["cursor"]) == int(rew["receipt"]["cursor"]) + 1
    assert _state(env, old) == "accepted_current" and _state(env, new) == "historical"
    assert env.search_ids("billing") == [old]


def test_supersede_needs_a_current_successor_in_scope(env):
    a = env.record("alpha decision")
    with pytest.raises(grpc.RpcError) as err:
        env.transition("supersede", a, successor="mem_" + "a" * 52)
    assert code_of(err.value) == "NOT_FOUND"
    with pytest.raises(grpc.RpcError) as err:
        env.transition("supersede", a)
    assert code_of(err.value) == "INVALID_SCHEMA"


def test_illegal_transitions_fail_before_any_cursor(env):
    rid = env.record("illegal transition target")
    before = len(_journal(env))
    with pytest.raises(grpc.RpcError) as err:
        env.transition("rewind", rid, successor=env.record("other current"))
    assert code_of(err.value) == "ILLEGAL_TRANSITION"
    with pytest.raises(grpc.RpcError) as err:
        env.transition("resolve_dispute", rid, to_state="historical")
    assert code_of(err.value) == "ILLEGAL_TRANSITION"
    assert len(_journal(env)) == before + 2  # only the second record's capture and accept
    env.transition("tombstone", rid)
    after = len(_journal(env))
    for op in ("dispute", "trust_invalidate", "tombstone"):
        with pytest.raises(grpc.RpcError) as err:
            env.transition(op, rid)
        assert code_of(err.value) == "ALREADY_TERMINAL", op
    assert len(_journal(env)) == after


def test_mark_non_current_and_trust_invalidate_leave_search(env):
    a = env.record("kafka retention is seven days")
    b = env.record("kafka partitions are twelve")
    env.transition("mark_non_current", a)
    env.transition("trust_invalidate", b)
    assert env.search_ids("kafka") == []
    assert _state(env, a) == "historical" and _state(env, b) == "trust_invalid"
    env.transition("trust_invalidate", a)
    assert _state(env, a) == "trust_invalid"


def test_host_tombstone_shreds_key_and_removes_postings(env):
    rid = env.record("forget this redis password policy")
    eid = new_event_id()
    out = env.transition("tombstone", rid, event_id=eid)
    assert out["receipt"]["to_state"] == "tombstoned" and out["projection_invalidation"] == "complete"
    assert env.transition("tombstone", rid, event_id=eid)["replayed"] is True
    with env.core.store.read() as tx:
        assert tx.postings_count(rid) == 0
        assert tx.record(Scope(TENANT, WORKSPACE), rid).sealed_body is None
    status = env.admin("KeyStatus", env.scope_req())
    assert {r["record_id"]: r["key"] for r in status["scope"]["records"]}[rid] == "destroyed"
    with pytest.raises(grpc.RpcError) as err:
        env.get(rid)
    assert code_of(err.value) == "NOT_FOUND"


def test_host_reject_and_withdraw_pending_candidates(env):
    c1, c2 = env.capture("candidate to reject"), env.capture("candidate to withdraw")
    rej = env.transition("reject", c1)
    assert rej["receipt"]["to_state"] == "rejected" and rej["key_destruction"] == "pending"
    wd = env.transition("withdraw", c2)
    assert wd["receipt"]["to_state"] == "withdrawn"
    with pytest.raises(grpc.RpcError) as err:
        env.transition("withdraw", c1)
    assert code_of(err.value) == "ALREADY_TERMINAL"
    with pytest.raises(grpc.RpcError) as err:
        env.transition("reject", "cand_doesnotexist")
    assert code_of(err.value) == "NOT_FOUND"
    view = env.admin("InspectCandidate", admin_pb2.InspectRequest(tenant=TENANT, workspace=WORKSPACE, candidate_id=c1))
    assert view["state"] == "rejected" and view["sealed_envelope_present"] is False


def test_expire_sweep_follows_retention_policy(env, clock):
    soon = env.record("expires within the hour", expires_at=format_instant(clock.now_ms() + 3_600_000))
    keep = env.record("no expiry on this one")
    assert env.admin("ExpireSweep", env.scope_req())["scopes"][0]["expired"] == []
    clock.advance(2 * 3_600_000)
    out = env.admin("ExpireSweep", env.scope_req())
    assert [e["record_id"] for e in out["scopes"][0]["expired"]] == [soon]
    assert _state(env, soon) == "expired" and _state(env, keep) == "accepted_current"
    assert env.admin("ExpireSweep", env.admin_stub and env.scope_req())["scopes"][0]["expired"] == []
    events = [e for e in _journal(env) if e["target"] == soon]
    assert events[-1]["operation"] == "expire"
    assert events[-1]["body"]["decisions"][-1]["path"] == "engram/retention/decision"
