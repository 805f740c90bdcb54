"""Adjudication of pending_adjudication candidates, redacted inspection, export and verification (SPEC §12)."""

from __future__ import annotations

import json

import duckdb
import grpc
import pytest

from engram_core.api import admin_pb2
from engram_core.store.chain import scope_chain
from tests.support.admin_support import TENANT, WORKSPACE, code_of, new_event_id, start_env

SECRET_TEXT = "the forgotten decision about caching tiers"


def _pending_adjudication(env) -> str:
    rid = env.record(SECRET_TEXT)
    env.transition("tombstone", rid)
    # SPEC §5: re-capturing forgotten content cannot be admitted without a host decision.
    cand = env.capture(SECRET_TEXT)
    assert env.admit(cand)["status"] == "pending_adjudication"
    return cand


def test_adjudication_list_is_redacted_and_decide_accepts_once(env):
    cand = _pending_adjudication(env)
    listing = env.admin("ListAdjudication", env.scope_req())
    assert [c["candidate_id"] for c in listing["candidates"]] == [cand]
    item = listing["candidates"][0]
    assert "FORGOTTEN_CONTENT" in item["reasons"]
    assert item["sizes"]["components"]["count"] == 1 and item["payload_digest"].startswith("sha256:")
    view = env.admin("InspectCandidate", admin_pb2.InspectRequest(tenant=TENANT, workspace=WORKSPACE, candidate_id=cand))
    assert view["state"] == "pending_adjudication" and view["sealed_envelope_present"] is True
    for doc in (listing, view):
        assert "caching" not in json.dumps(doc)
    eid = new_event_id()
    req = admin_pb2.AdjudicateRequest(tenant=TENANT, workspace=WORKSPACE, candidate_id=cand, decision="accept",
                                      reason_ref="reason:reviewed", event_id=eid)
    out = env.admin("Adjudicate", req)
    assert out["outcome"]["status"] == "accepted" and out["replayed"] is False
    assert env.admin("Adjudicate", req) == {**out, "replayed": True}
    assert env.get(out["outcome"]["record_id"])["record"]["payload"]["components"][0]["text"] == SECRET_TEXT
    assert env.admin("ListAdjudication", env.scope_req())["candidates"] == []


def test_adjudicate_reject_and_refusals(env):
    cand = _pending_adjudication(env)
    pending = env.capture("an ordinary pending candidate")
    with pytest.raises(grpc.RpcError) as err:
        env.admin("Adjudicate", admin_pb2.AdjudicateRequest(tenant=TENANT, workspace=WORKSPACE, candidate_id=pending,
                                                             decision="accept", reason_ref="r:x", event_id=new_event_id()))
    assert code_of(err.value) == "ILLEGAL_TRANSITION"
    with pytest.raises(grpc.RpcError) as err:
        env.admin("Adjudicate", admin_pb2.AdjudicateRequest(tenant=TENANT, workspace=WORKSPACE, candidate_id=cand,
                                                             decision="maybe", reason_ref="r:x", event_id=new_event_id()))
    assert code_of(err.value) == "INVALID_SCHEMA"
    out = env.admin("Adjudicate", admin_pb2.AdjudicateRequest(tenant=TENANT, workspace=WORKSPACE, candidate_id=cand,
                                                              decision="reject", reason_ref="r:x", event_id=new_event_id()))
    assert out["outcome"]["status"] == "rejected"
    with pytest.raises(grpc.RpcError) as err:
        env.admin("InspectCandidate", admin_pb2.InspectRequest(tenant="globex", workspace=WORKSPACE, candidate_id=cand))
    assert code_of(err.value) == "NOT_FOUND"


def test_export_journal_and_audit_by_cursor_range(env):
    env.record("export one")
    env.record("export two")
    full = env.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="journal"))
    assert [e["cursor"] for e in full["items"]] == ["1", "2", "3", "4"]
    part = env.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="journal",
                                                       from_cursor="2", to_cursor="3"))
    assert part["items"] == full["items"][1:3]
    for a, b in zip(full["items"], full["items"][1:], strict=False):
        assert b["prev_digest"] == a["event_digest"]
    audit = env.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="audit"))
    assert {r["tenant"] for r in audit["items"]} == {TENANT}
    with pytest.raises(grpc.RpcError) as err:
        env.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="journal", from_cursor="01"))
    assert code_of(err.value) == "INVALID_SCHEMA"


def test_verify_detects_a_tampered_journal_row(tmp_path, clock, stores):
    env = start_env(stores, tmp_path / "core", clock)
    try:
        env.record("verify me")
        env.record("verify me too")
        report = env.admin("Verify", env.scope_req(tenant="", workspace=""))
        assert report["ok"] is True and report["audit"]["ok"] is True
    finally:
        env.stop()
    stores.tamper(tmp_path / "core", "UPDATE journal SET to_state = 'historical' WHERE cursor = 2")
    env = start_env(stores, tmp_path / "core", clock, activate=False)
    try:
        with pytest.raises(grpc.RpcError) as err:
            env.admin("Verify", env.scope_req())
        assert code_of(err.value) == "JOURNAL_CORRUPT"
        report = env.admin("Verify", env.scope_req(report_only=True))
        assert report["ok"] is False
        assert report["scopes"][0]["problems"] == [{"cursor": "2", "problem": "event_digest"}]
        assert report["audit"]["ok"] is True
    finally:
        env.stop()


def test_verify_detects_a_tampered_audit_row(tmp_path, clock, stores):
    env = start_env(stores, tmp_path / "core", clock)
    env.record("audit chain")
    env.stop()
    chain = scope_chain("acme", "main")
    stores.tamper(tmp_path / "core", f"UPDATE audit SET outcome = 'ok-forged' WHERE chain = '{chain}' AND seq = 2")
    env = start_env(stores, tmp_path / "core", clock, activate=False)
    try:
        report = env.admin("Verify", env.scope_req(report_only=True))
        assert report["audit"]["problems"] == [{"chain": chain, "seq": 2, "problem": "row_digest"}]
        with pytest.raises(grpc.RpcError) as err:
            env.admin("Verify", env.scope_req(tenant="", workspace=""))
        assert code_of(err.value) == "JOURNAL_CORRUPT"
    finally:
        env.stop()


def test_duckdb_is_importable_for_tampering():
    assert duckdb.__version__
