"""Races (issue 7 items 2 and 7, SPEC §7, §8): many clients on the same idempotency
key, the same candidate (admit vs withdraw), the same record (forget vs dispute)
and the same confirmation grant. Exactly one effect each; losers get the
contract's answer; never INTERNAL / MUTATION_OUTCOME_UNKNOWN; never a deadlock
(every call finishes within its deadline)."""

# ruff: noqa: B023 -- race() runs every lambda before the loop advances, so loop variables are current

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from tests.support.core_engines import EngineStores, rows
from tests.support.core_support import Client, Failed, capture_args
from tests.support.reliability_crash import HostAdmin, activate_scope
from tests.support.reliability_support import scaled

RACERS = 8
ROUNDS = scaled(4, 40)


@pytest.fixture(scope="module")
def core(module_stores: EngineStores, tmp_path_factory):
    running = module_stores.start_core(tmp_path_factory.mktemp("races"), semantic=False, max_workers=32)
    activate_scope(running)
    yield running
    running.stop()


def race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Start every call at the same instant; each result is a value or the contract Code."""
    barrier = threading.Barrier(len(calls))

    def run(fn: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return fn()
        except Failed as f:
            assert f.code not in (Code.MUTATION_OUTCOME_UNKNOWN, Code.STORE_UNAVAILABLE), f.err
            return f.code

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(run, fn) for fn in calls]
        return [f.result(timeout=60) for f in futures]  # a deadlock would time out here


def journal_ops(core, target: str) -> list[str]:
    with core.core.store.read() as tx:
        return [r[0] for r in rows(tx, "SELECT operation FROM journal WHERE target = ? ORDER BY cursor", [target])]


def test_same_idempotency_key_on_every_mutation_makes_one_effect(core) -> None:
    clients = [Client(core) for _ in range(RACERS)]
    for n in range(ROUNDS):
        args = capture_args(f"Race on one capture key {n} puffin.", key=f"race-cap-key-{n:04d}-xxxxxxxx")
        caps = race([lambda c=c: c.call("capture", args) for c in clients])
        assert all(isinstance(c, dict) for c in caps), (n, caps)
        assert Counter(c["status"] for c in caps) == {"committed_pending": 1, "duplicate_exact": RACERS - 1}
        assert len({(c["candidate_id"], c["cursor"], c["transaction_receipt_digest"]) for c in caps}) == 1
        cid = caps[0]["candidate_id"]
        adm = {"candidate_id": cid, "idempotency_key": f"race-adm-key-{n:04d}-xxxxxxxx"}
        outs = race([lambda c=c: c.call("request_admission", adm) for c in clients])
        assert all(isinstance(o, dict) for o in outs), (n, outs)
        assert Counter(o["replayed"] for o in outs) == {False: 1, True: RACERS - 1}
        assert len({repr(o["outcome"]) for o in outs}) == 1
        rid = outs[0]["outcome"]["record_id"]
        fg = {"record_id": rid, "idempotency_key": f"race-fg-key-{n:04d}-xxxxxxxx", "reason_ref": "reason:race"}
        # each racer brings its own fresh grant (a host approving each retry)
        grants = [c.grant("forget", fg) for c in clients]
        outs = race([lambda c=c, g=g: c.call("forget", fg, grant=g) for c, g in zip(clients, grants, strict=True)])
        assert all(isinstance(o, dict) for o in outs), (n, outs)
        assert Counter(o["replayed"] for o in outs) == {False: 1, True: RACERS - 1}
        assert len({repr(o["receipt"]) for o in outs}) == 1
        assert journal_ops(core, cid) == ["capture", "accept"] and journal_ops(core, rid) == ["tombstone"]


def test_admit_races_withdraw_and_host_reject(core) -> None:
    ana = Client(core)
    clients = [Client(core) for _ in range(RACERS)]
    host = HostAdmin(core)
    for n in range(ROUNDS):
        cid = ana.capture(f"Race admit against withdraw {n} gannet.")["candidate_id"]
        calls: list[Callable[[], Any]] = []
        for i, c in enumerate(clients):
            if i % 3 == 0:
                calls.append(lambda c=c, i=i: c.call("request_admission", {"candidate_id": cid,
                                                                           "idempotency_key": f"r-adm-{n}-{i}-xxxxxxxxxxxx"}))
            elif i % 3 == 1:
                w = {"candidate_id": cid, "idempotency_key": f"r-wd-{n}-{i}-xxxxxxxxxxxxx", "reason_ref": "reason:race"}
                calls.append(lambda c=c, w=w: c.call("withdraw", w, grant=True))
            else:
                calls.append(lambda i=i: host.transition({"operation": "reject", "target": cid,
                                                           "event_id": f"r-rej-{n}-{i}-xxxxxxxxxxxx",
                                                           "reason_ref": "reason:race"}))
        results = race(calls)
        ops = journal_ops(core, cid)
        assert ops[0] == "capture" and len(ops) == 2 and ops[1] in ("accept", "withdraw", "reject"), ops
        winners = [r for r in results if isinstance(r, dict) and (
            r.get("outcome", {}).get("status") == "accepted" or r.get("receipt"))]
        accepted_reports = [r for r in results if isinstance(r, dict) and "outcome" in r]
        if ops[1] == "accept":
            # later admissions report the standing outcome; withdraw/reject lose with the lifecycle's answer
            assert all(r["outcome"]["status"] in ("accepted", "duplicate_exact") for r in accepted_reports)
            assert sum(1 for r in accepted_reports if r["outcome"]["status"] == "accepted") == 1
            assert not [r for r in results if isinstance(r, dict) and "receipt" in r]
        else:
            assert len([r for r in winners if "receipt" in r]) == 1
            assert not [r for r in accepted_reports if r["outcome"]["status"] == "accepted"]
        losers = {r for r in results if isinstance(r, Code)}
        assert losers <= {Code.ILLEGAL_TRANSITION, Code.ALREADY_TERMINAL}, losers
    host.close()


def test_forget_races_dispute_on_the_same_record(core) -> None:
    ana = Client(core)
    host = HostAdmin(core)
    for n in range(ROUNDS * 2):
        rid = ana.remember(f"Race forget against dispute {n} shearwater.")
        fg = {"record_id": rid, "idempotency_key": f"r-fgd-{n}-xxxxxxxxxxxxxx", "reason_ref": "reason:race"}
        grant = ana.grant("forget", fg)
        results = race([
            lambda: ana.call("forget", fg, grant=grant),
            lambda: host.transition({"operation": "dispute", "target": rid, "event_id": f"r-dsp-{n}-xxxxxxxxxxxxx",
                                     "reason_ref": "reason:race"}),
        ])
        ops = journal_ops(core, rid)
        # forget always wins eventually (tombstone is legal from accepted_disputed); a dispute after it is terminal
        assert ops in (["accept", "tombstone"], ["accept", "dispute", "tombstone"]) or ops[-1] == "tombstone", ops
        assert isinstance(results[0], dict) and results[0]["receipt"]["to_state"] == "tombstoned"
        if ops == ["tombstone"] or "dispute" not in ops:
            assert results[1] == Code.ALREADY_TERMINAL, results[1]
        else:
            assert results[1]["receipt"]["to_state"] == "accepted_disputed"
            assert results[0]["receipt"]["from_state"] == "accepted_disputed"
        assert ana.fails("get", {"record_id": rid, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND
    host.close()


def test_one_grant_used_twice_at_once_has_one_effect(core) -> None:
    ana = Client(core)
    for n in range(ROUNDS * 2):
        rid = ana.remember(f"Race one grant twice {n} skua.")
        args = {"record_id": rid, "idempotency_key": f"r-grant-a-{n}-xxxxxxxxxx", "reason_ref": "reason:race"}
        grant = ana.grant("forget", args)  # bound to tool, target and digest; not to the idempotency key
        other = {**args, "idempotency_key": f"r-grant-b-{n}-xxxxxxxxxx"}
        results = race([lambda: ana.call("forget", args, grant=grant), lambda: ana.call("forget", other, grant=grant)])
        wins = [r for r in results if isinstance(r, dict)]
        assert len(wins) == 1 and wins[0]["replayed"] is False
        assert [r for r in results if isinstance(r, Code)][0] in (Code.GATE_FAILED, Code.ALREADY_TERMINAL)
        assert journal_ops(core, rid) == ["tombstone"]
    # a withdraw grant raced the same way
    for n in range(ROUNDS):
        cid = ana.capture(f"Race one withdraw grant {n} fulmar.")["candidate_id"]
        w = {"candidate_id": cid, "idempotency_key": f"r-wgrant-a-{n}-xxxxxxxxx", "reason_ref": "reason:race"}
        grant = ana.grant("withdraw", w)
        results = race([lambda: ana.call("withdraw", w, grant=grant),
                        lambda: ana.call("withdraw", {**w, "idempotency_key": f"r-wgrant-b-{n}-xxxxxxxxx"}, grant=grant)])
        assert sum(isinstance(r, dict) for r in results) == 1
        assert [r for r in results if isinstance(r, Code)][0] in (Code.GATE_FAILED, Code.ALREADY_TERMINAL)
        assert journal_ops(core, cid) == ["capture", "withdraw"]


def test_same_key_admission_that_finds_the_key_destroyed_replays(core) -> None:
    """The same-key admission race, made deterministic: a racer read the candidate as pending,
    then another racer with the same idempotency key admitted it and destroyed the candidate's
    key before this one unsealed the envelope. Its answer is the replay of the winner's outcome
    (SPEC §7), not ILLEGAL_TRANSITION."""
    from engram_core.contract.tools import ADMISSION_TOOL
    from engram_core.services.core import CallRecord
    from engram_core.services.memory import MemoryService
    from engram_core.services.pipeline import prepare
    from engram_core.trust.hostctx import verify_context

    ana = Client(core)
    cid = ana.capture("Race, made deterministic: the same-key puffin admission.")["candidate_id"]
    with core.core.store.read() as tx:
        stale = tx.candidate(Scope(ana.tenant, ana.workspace), cid)
    assert stale is not None and stale.state == "pending"
    adm = {"candidate_id": cid, "idempotency_key": "same-key-stale-admission-0001"}
    won = ana.call("request_admission", adm)
    assert won["replayed"] is False and won["outcome"]["status"] == "accepted"
    memory = MemoryService(core.core)
    ctx = verify_context(ana.context(), core.core.trusted, now_ms=core.core.now_ms())
    late = memory.mutations.admit(ctx, stale, CallRecord(), guard=prepare(ctx, ADMISSION_TOOL, adm).guard)
    assert late == {**won, "replayed": True}


@pytest.mark.parametrize("tool", ["forget", "withdraw"])
def test_same_key_winner_committing_between_the_pre_checks_replays(core, tool, monkeypatch) -> None:
    """The same-key forget race of the soak (one of 8 racers answered ALREADY_TERMINAL), made
    deterministic: the winner, with the same idempotency key, commits while the loser runs its
    pre-checks (target, then stored outcome, each on the latest committed state:
    ``pipeline.gated_precondition``). The loser's answer is the winner's outcome replayed
    (SPEC §7), never the lifecycle's refusal of it."""
    from engram_core.services import pipeline
    from engram_core.services.memory import MemoryService
    from engram_core.trust.hostctx import verify_context

    ana = Client(core)
    if tool == "forget":
        target = {"record_id": ana.remember(f"Race, made deterministic: the pre-checked {tool} tern.")}
    else:
        target = {"candidate_id": ana.capture(f"Race, made deterministic: the pre-checked {tool} tern.")["candidate_id"]}
    args = {**target, "idempotency_key": f"same-key-pre-check-{tool}-0001", "reason_ref": "reason:race"}
    won: list[dict[str, Any]] = []

    precheck = pipeline.guarded_outcome
    raced: list[bool] = []

    def winner_commits_meanwhile(tx, ctx, guard):
        prior = precheck(tx, ctx, guard)
        if not raced:  # the loser's read of the key: the winner (not raced again) commits right after it
            raced.append(True)
            won.append(ana.call(tool, args, grant=True))
        return prior

    monkeypatch.setattr(pipeline, "guarded_outcome", winner_commits_meanwhile)
    ctx = verify_context(ana.context(), core.core.trusted, now_ms=core.core.now_ms())
    late = getattr(MemoryService(core.core), tool)(ctx, args, ana.grant(tool, args))
    assert won[0]["replayed"] is False and late == {**won[0], "replayed": True}
