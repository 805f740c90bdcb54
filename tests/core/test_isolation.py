"""Tenant/workspace isolation (SPEC §2): out of scope is indistinguishable from unknown."""

from __future__ import annotations

import grpc

from tests.support.core_support import PURPOSE, Client


def _detail(c: Client, op: str, args: dict, **kw) -> tuple:
    try:
        c.call(op, args, **kw)
    except Exception as f:
        err: grpc.RpcError = f.err  # type: ignore[attr-defined]
        return (f.code, err.code(), err.details())
    raise AssertionError("succeeded")


def test_other_tenant_and_workspace_see_nothing(core) -> None:
    ana = Client(core)
    rid = ana.remember("Isolation: the acme alpha secret plan uses the pelican bus.")
    cap = ana.capture("Isolation: pending candidate of acme alpha.")
    unknown_rid = "mem_" + "c" * 52
    unknown_cid = "cand_" + "d" * 26
    for other in (Client(core, tenant="globex"), Client(core, workspace="beta")):
        assert other.search("pelican bus")["records"] == []
        a = _detail(other, "get", {"record_id": rid, "purpose_ref": PURPOSE})
        b = _detail(other, "get", {"record_id": unknown_rid, "purpose_ref": PURPOSE})
        assert a == b and a[0].value == "NOT_FOUND"
        args = lambda r: {"record_id": r, "idempotency_key": "iso-forget-000001", "reason_ref": "r:x"}  # noqa: E731
        assert _detail(other, "forget", args(rid), grant=True) == _detail(other, "forget", args(unknown_rid), grant=True)
        w = lambda c: {"candidate_id": c, "idempotency_key": "iso-withdraw-0001", "reason_ref": "r:x"}  # noqa: E731
        assert _detail(other, "withdraw", w(cap["candidate_id"]), grant=True) == \
            _detail(other, "withdraw", w(unknown_cid), grant=True)
        adm = lambda c: {"candidate_id": c, "idempotency_key": "iso-admit-000001"}  # noqa: E731
        assert _detail(other, "request_admission", adm(cap["candidate_id"])) == \
            _detail(other, "request_admission", adm(unknown_cid))
    # and nothing changed for the owner
    assert ana.get(rid)["record"]["record_id"] == rid


def test_cursors_are_per_scope(core) -> None:
    g = Client(core, tenant="globex")
    first = g.capture("Cursor density: globex capture one.")
    second = g.capture("Cursor density: globex capture two.")
    assert int(second["cursor"]) == int(first["cursor"]) + 1
