"""Reconciliation families end to end over gRPC (SPEC §9; issue 18): the policy answers for each
current family member at admission and the core applies the answer in the admission's transaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.rpc.server import RunningCore
from tests.support.core_support import Client, capture_args, now_ms
from tests.support.governance_support import Host, consent, start_with_bundle

FAMILY = {"family_refs": ["family:store-choice"]}


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[RunningCore]]:
    running: list[RunningCore] = []
    yield running
    for r in running:
        r.stop()


def _core(started, stores, tmp_path, **kw) -> tuple[RunningCore, Client, Host]:
    core = start_with_bundle(tmp_path, stores, edit=consent("family:store-choice", "family:other"), **kw)
    started.append(core)
    return core, Client(core), Host(core)


def _remember(c: Client, text: str, *, t: int, family=FAMILY) -> dict:
    cap = c.call("capture", capture_args(text, t=t, reconciliation=family))
    return c.admit(cap["candidate_id"])["outcome"]


def test_newer_decision_supersedes_the_older_member_in_the_admission_transaction(started, stores, tmp_path) -> None:
    core, c, host = _core(started, stores, tmp_path)
    old = _remember(c, "We store memory in SQLite.", t=now_ms() - 120_000)
    new = _remember(c, "We store memory in DuckDB instead of SQLite.", t=now_ms() - 60_000)
    assert old["status"] == new["status"] == "accepted"
    old_view = host.history(old["record_id"])
    assert old_view["records"][0]["state"] == "historical"
    assert old_view["records"][0]["successor_id"] == new["record_id"]
    supersede = [e for e in old_view["events"] if e["operation"] == "supersede"]
    assert len(supersede) == 1
    # The member's event directly follows the newcomer's accept event: same transaction.
    assert int(supersede[0]["cursor"]) == int(new["cursor"]) + 1
    assert supersede[0]["successor"] == new["record_id"] and supersede[0]["reason_ref"] == "reconciliation"
    assert host.state(new["record_id"]) == "accepted_current"
    assert c.fails("get", {"record_id": old["record_id"], "purpose_ref": c.purpose_ref}) == Code.NOT_FOUND
    assert [r["record"]["record_id"] for r in c.search("SQLite")["records"]] == [new["record_id"]]
    # The journal event names the reconciliation decision (path and revision), never text.
    with core.core.store.read() as tx:
        ev = [e for e in tx.events(Scope("acme", "alpha"), 0, None) if e.operation == "supersede"][0]
    assert ev.body["decisions"][0]["path"] == "engram/reconciliation/decision"
    assert "SQLite" not in str(ev.body)


def test_members_outside_the_family_or_scope_are_untouched(started, stores, tmp_path) -> None:
    core, c, host = _core(started, stores, tmp_path, scopes=(("acme", "alpha"), ("acme", "beta"), ("globex", "alpha")))
    t = now_ms() - 120_000
    other_family = _remember(c, "A decision in another family.", t=t, family={"family_refs": ["family:other"]})
    no_family = c.admit(c.capture("A decision naming no family.")["candidate_id"])["outcome"]
    beta = _remember(Client(core, workspace="beta"), "Same family in workspace beta.", t=t)
    globex = _remember(Client(core, tenant="globex"), "Same family in tenant globex.", t=t)
    newer = _remember(c, "The newer decision of the family.", t=now_ms() - 1000)
    assert newer["status"] == "accepted"
    assert host.state(other_family["record_id"]) == "accepted_current"
    assert host.state(no_family["record_id"]) == "accepted_current"
    assert host.state(beta["record_id"], workspace="beta") == "accepted_current"
    assert host.state(globex["record_id"], tenant="globex") == "accepted_current"


def test_older_newcomer_goes_to_adjudication_and_host_accept_keeps_the_member(started, stores, tmp_path) -> None:
    core, c, host = _core(started, stores, tmp_path)
    current = _remember(c, "The current decision.", t=now_ms() - 60_000)
    late = _remember(c, "An older decision captured late.", t=now_ms() - 3_600_000)
    assert late["status"] == "pending_adjudication" and "record_id" not in late
    assert host.state(current["record_id"]) == "accepted_current"
    from engram_core.api import admin_pb2

    listed = host.call("ListAdjudication", admin_pb2.ScopeRequest(tenant="acme", workspace="alpha"))
    assert [x["reasons"] for x in listed["candidates"]] == [["OLDER_THAN_MEMBER"]]
    accepted = host.adjudicate(late["candidate_id"])
    assert accepted["outcome"]["status"] == "accepted"
    # Adjudicated: the default rule keeps a member newer than the newcomer.
    assert host.state(current["record_id"]) == "accepted_current"
    assert host.state(accepted["outcome"]["record_id"]) == "accepted_current"


DISPUTE_ALL = """package engram.reconciliation

decision := {
	"admission": "proceed",
	"members": [{"record_id": m.record_id, "action": "dispute"} | some m in input.members],
	"reasons": [],
}
"""


def test_a_policy_author_can_make_newcomers_dispute_members(started, stores, tmp_path) -> None:
    core, c, host = _core(started, stores, tmp_path, files={"engram/reconciliation/reconciliation.rego": DISPUTE_ALL,
                                                    "engram/reconciliation/reconciliation_test.rego": None})
    first = _remember(c, "First claim.", t=now_ms() - 60_000)
    second = _remember(c, "Conflicting claim.", t=now_ms() - 30_000)
    view = host.history(first["record_id"])
    assert view["records"][0]["state"] == "accepted_disputed"
    dispute = [e for e in view["events"] if e["operation"] == "dispute"]
    assert len(dispute) == 1 and dispute[0]["disputed_by"] == second["record_id"]
    # A third newcomer sees both (one disputed already: it stays disputed, no second event).
    third = _remember(c, "A third claim.", t=now_ms() - 10_000)
    assert host.state(first["record_id"]) == host.state(second["record_id"]) == "accepted_disputed"
    assert len([e for e in host.history(first["record_id"])["events"] if e["operation"] == "dispute"]) == 1
    assert host.state(third["record_id"]) == "accepted_current"


WRONG_MEMBERS = """package engram.reconciliation

decision := {
	"admission": "proceed",
	"members": [{"record_id": "mem_notamember", "action": "supersede"}],
	"reasons": [],
}
"""


def test_an_answer_about_other_records_fails_closed_and_changes_nothing(started, stores, tmp_path) -> None:
    core, c, host = _core(started, stores, tmp_path, files={"engram/reconciliation/reconciliation.rego": WRONG_MEMBERS,
                                                    "engram/reconciliation/reconciliation_test.rego": None})
    cap = c.call("capture", capture_args("Newcomer under a broken policy.", reconciliation=FAMILY))
    assert c.fails("request_admission", {"candidate_id": cap["candidate_id"],
                                         "idempotency_key": "adm-broken-policy-0001"}) == Code.POLICY_UNAVAILABLE
    with core.core.store.read() as tx:
        assert tx.candidate(Scope("acme", "alpha"), cap["candidate_id"]).state == "pending"
        assert tx.scope_records(Scope("acme", "alpha")) == []


def test_members_changed_after_the_decision_is_policy_stale(started, stores, tmp_path, monkeypatch) -> None:
    """The answer was given for a set of members; if another change moved that set before the
    commit, applying the old answer would be wrong: POLICY_STALE, and the retry decides again."""
    from engram_core.services.reconciliation import Reconciler

    core, c, host = _core(started, stores, tmp_path)
    first = _remember(c, "First decision.", t=now_ms() - 120_000)
    cap = c.call("capture", capture_args("Second decision.", t=now_ms() - 60_000, reconciliation=FAMILY))
    original = Reconciler.decide

    def decide_then_race(self, ctx, **kw):
        plan = original(self, ctx, **kw)
        host.transition("dispute", first["record_id"])  # the member moves between decision and commit
        return plan

    monkeypatch.setattr(Reconciler, "decide", decide_then_race)
    args = {"candidate_id": cap["candidate_id"], "idempotency_key": "adm-stale-members-0001"}
    assert c.fails("request_admission", args) == Code.POLICY_STALE
    assert host.state(first["record_id"]) == "accepted_disputed"
    monkeypatch.setattr(Reconciler, "decide", original)
    out = c.call("request_admission", args)["outcome"]
    assert out["status"] == "accepted"
    assert host.state(first["record_id"]) == "historical"


def test_concurrent_newcomers_leave_exactly_one_current_decision(started, stores, tmp_path) -> None:
    """Admissions into one family race; each decision is applied only to the member set it saw
    (else POLICY_STALE and the client retries), so the family never ends with two current
    decisions: the newest is current, the others historical or waiting for a host."""
    import threading

    core, c, host = _core(started, stores, tmp_path)
    base = now_ms() - 600_000
    caps = [c.call("capture", capture_args(f"Queue decision version {i}.", t=base + i * 1000, reconciliation=FAMILY))
            for i in range(6)]
    outcomes: dict[int, dict] = {}
    stale = [0]

    def admit(i: int) -> None:
        args = {"candidate_id": caps[i]["candidate_id"], "idempotency_key": f"adm-race-{i:04d}-{now_ms()}"}
        for _ in range(50):
            try:
                outcomes[i] = Client(core).call("request_admission", args)["outcome"]
                return
            except Exception as exc:  # Failed carries the code
                if getattr(exc, "code", None) != Code.POLICY_STALE:
                    raise
                stale[0] += 1

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outcomes) == 6
    with core.core.store.read() as tx:
        current = [r.record_id for r in tx.scope_records(Scope("acme", "alpha"), ("accepted_current", "accepted_disputed"))]
    assert current == [outcomes[5]["record_id"]]  # the newest valid time wins, alone
    for i in range(5):
        assert outcomes[i]["status"] in ("accepted", "pending_adjudication")
        if outcomes[i]["status"] == "accepted":
            assert host.state(outcomes[i]["record_id"]) == "historical"
