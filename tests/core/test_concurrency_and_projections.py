"""Concurrency of the idempotency guard and forget's same-transaction projection removal."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from tests.support.core_engines import one
from tests.support.core_support import Client, capture_args


def test_sixteen_concurrent_identical_captures_make_one_candidate(ana: Client) -> None:
    args = capture_args("Concurrency: sixteen identical captures of the tern note.", key="concurrent-capture-key-01")
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: ana.call("capture", args), range(16)))
    assert len({r["candidate_id"] for r in results}) == 1
    assert sum(r["status"] == "committed_pending" for r in results) == 1
    with ana.core.core.store.read() as tx:
        n = one(tx, "SELECT count(*) FROM candidates WHERE candidate_id = ?", [results[0]["candidate_id"]])[0]
        events = one(tx, "SELECT count(*) FROM journal WHERE target = ?", [results[0]["candidate_id"]])[0]
    assert n == 1 and events == 1


def test_admit_races_withdraw_exactly_one_effect(ana: Client) -> None:
    for i in range(3):
        cap = ana.capture(f"Race {i}: admit versus withdraw of the plover note.")
        cid = cap["candidate_id"]
        w = {"candidate_id": cid, "idempotency_key": f"race-withdraw-{i:04d}", "reason_ref": "r:x"}
        grant = ana.grant("withdraw", w)

        def admit(cid: str = cid, i: int = i) -> str:
            try:
                return ana.admit(cid, key=f"race-admit-{i:06d}")["outcome"]["status"]
            except Exception as f:
                return f.code.value  # type: ignore[attr-defined]

        def withdraw(w: dict = w, grant: bytes = grant) -> str:
            try:
                ana.call("withdraw", w, grant=grant)
                return "withdrawn"
            except Exception as f:
                return f.code.value  # type: ignore[attr-defined]

        with ThreadPoolExecutor(2) as pool:
            a, b = pool.submit(admit), pool.submit(withdraw)
            outcomes = {a.result(), b.result()}
        assert outcomes in ({"accepted", Code.ILLEGAL_TRANSITION.value}, {"withdrawn", Code.ALREADY_TERMINAL.value}), outcomes


def test_forget_removes_postings_in_same_transaction(ana: Client) -> None:
    rid = ana.remember("Projection: the cormorant index has 12 shards.")
    store = ana.core.core.store
    with store.read() as tx:
        assert tx.postings_count(rid) > 0
        journal_before = one(tx, "SELECT count(*) FROM journal")[0]
    ana.call("forget", {"record_id": rid, "idempotency_key": "proj-forget-00001", "reason_ref": "r:x"}, grant=True)
    with store.read() as tx:
        assert tx.postings_count(rid) == 0
        row = one(tx, "SELECT state, sealed_body FROM records WHERE record_id = ?", [rid])
        assert row == ("tombstoned", None)
        assert tx.data_key_slot(f"record:{rid}") is None
        # exactly one journal event carried the state change, postings and key together
        assert one(tx, "SELECT count(*) FROM journal")[0] == journal_before + 1


def test_forgotten_body_key_is_zeroed(ana: Client) -> None:
    rid = ana.remember("Shredding: the gannet token rotation is weekly.")
    core = ana.core.core
    with core.store.read() as tx:
        slot = tx.data_key_slot(f"record:{rid}")
    assert core.vault.data_key(slot, f"record:{rid}") is not None
    ana.call("forget", {"record_id": rid, "idempotency_key": "shred-forget-0001", "reason_ref": "r:x"}, grant=True)
    assert core.vault.data_key(slot, f"record:{rid}") is None


def test_admission_that_lost_the_race_to_withdraw_is_already_terminal_not_blob_missing(ana: Client) -> None:
    """Admission read the candidate as pending, then a withdraw destroyed its key before the
    envelope was unsealed: the answer is the lifecycle's, deterministically."""
    import pytest

    from engram_core.contract.errors import EngramError
    from engram_core.services.core import CallRecord
    from engram_core.services.memory import MemoryService
    from engram_core.trust.hostctx import verify_context

    cap = ana.capture("Race, made deterministic: the stale plover candidate.")
    core = ana.core.core
    with core.store.read() as tx:
        stale = tx.candidate(Scope("acme", "alpha"), cap["candidate_id"])
    assert stale is not None and stale.state == "pending"
    w = {"candidate_id": cap["candidate_id"], "idempotency_key": "stale-withdraw-0001", "reason_ref": "r:x"}
    ana.call("withdraw", w, grant=True)
    ctx = verify_context(ana.context(), core.trusted, now_ms=core.now_ms())
    with pytest.raises(EngramError) as err:
        MemoryService(core).mutations.admit(ctx, stale, CallRecord(), guard=None)
    assert err.value.code == Code.ALREADY_TERMINAL
