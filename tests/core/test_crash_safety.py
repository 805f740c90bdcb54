"""SIGKILL mid-workload loses no acknowledged write and leaves no half-applied one (SPEC §7), on
each engine: the core is killed and restarted over the same store and key directory (each
`engram serve` forked from a process that has imported Engram once: tests/support/forked_core.py)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.store.chain import GENESIS, audit_digest_of, event_digest_of
from tests.support.core_engines import EngineStores, rows
from tests.support.core_support import Client, Failed, activate, capture_args
from tests.support.crash_harness import Acked, CoreProcess, run_workload
from tests.support.forked_core import ForkedCoreProcess

KILL_POINTS = 3


class _Proc:
    """Adapter so conftest.Client can talk to a subprocess core."""

    def __init__(self, proc: CoreProcess) -> None:
        self.address = proc.address
        self.host_key_path = proc.data_dir / "host.key"


def verify_store(stores: EngineStores, data_dir) -> None:
    """Chains verify and no mutation is half-applied, read straight from the store (its core stopped)."""
    with stores.open_store(data_dir) as store:  # postings_count opens sealed projections: the vault is needed
        with store.read() as tx:
            for scope in tx.scopes():
                prev = GENESIS
                for e in tx.events(Scope(scope.tenant, scope.workspace), 1, None):
                    doc = {"tenant": e.tenant, "workspace": e.workspace, "cursor": str(e.cursor),
                           "event_id": e.event_id, "operation": e.operation, "target": e.target,
                           "from_state": e.from_state, "to_state": e.to_state, "at_ms": e.at_ms, "body": e.body,
                           "prev_digest": e.prev_digest}
                    assert e.prev_digest == prev and event_digest_of(doc) == e.event_digest
                    prev = e.event_digest
                assert prev == scope.last_event_digest
            prev: dict[str, str] = {}  # each audit chain on its own
            for row in tx.audit_rows(None, 0, None):
                chain = row.get("chain", "")
                assert row["prev_digest"] == prev.get(chain, GENESIS) and audit_digest_of(row) == row["row_digest"]
                prev[chain] = row["row_digest"]
            live = tx.live_key_slots()
            owners = set(live.values())
            for (cid, state) in rows(tx, "SELECT candidate_id, state FROM candidates"):
                has_key = f"candidate:{cid}" in owners
                assert has_key == (state in ("pending", "pending_adjudication")), (cid, state)
            for (rid, state, body) in rows(tx, "SELECT record_id, state, sealed_body IS NOT NULL FROM records"):
                if state == "tombstoned":
                    assert not body and f"record:{rid}" not in owners and tx.postings_count(rid) == 0
                else:
                    assert body and f"record:{rid}" in owners and tx.postings_count(rid) > 0
            # every journal event of a candidate/record matches its current state
            n_candidates = rows(tx, "SELECT count(*) FROM candidates")[0][0]
            n_capture_events = rows(tx, "SELECT count(*) FROM journal WHERE operation = 'capture'")[0][0]
            assert n_candidates == n_capture_events


@pytest.mark.timeout(600)
def test_sigkill_mid_workload_loses_nothing_acknowledged(stores: EngineStores, tmp_path) -> None:
    rng = random.Random(20261130)
    data = tmp_path / "data"
    proc = ForkedCoreProcess(data, stores)
    acked = Acked()
    try:
        for point in range(KILL_POINTS):
            proc.start()
            if point == 0:
                activate(_Proc(proc))  # type: ignore[arg-type]
            client = Client(_Proc(proc))  # type: ignore[arg-type]
            stop = threading.Event()
            worker = threading.Thread(target=run_workload, args=(client, acked, stop, rng, capture_args))
            worker.start()
            time.sleep(rng.uniform(0.3, 1.0))  # a kill mid-workload, a few mutations into it
            proc.kill()
            stop.set()
            worker.join(timeout=30)
            client.channel.close()
        verify_store(stores, data)
        proc.start()
        client = Client(_Proc(proc))  # type: ignore[arg-type]
        assert acked.captures, "workload acknowledged nothing"
        for args, result in acked.captures:
            again = client.call("capture", args)
            assert again["status"] == "duplicate_exact" and again["candidate_id"] == result["candidate_id"]
        for args, result in acked.admissions:
            again = client.call("request_admission", args)
            assert again["replayed"] is True and again["outcome"] == result["outcome"]
        forgotten = {args["record_id"] for args, _ in acked.forgets}
        for args, result in acked.forgets:
            assert client.call("forget", args, grant=True)["receipt"] == result["receipt"]
            assert client.fails("get", {"record_id": args["record_id"], "purpose_ref": client.purpose_ref}) == Code.NOT_FOUND
        for args, result in acked.withdrawals:
            assert client.call("withdraw", args, grant=True)["receipt"] == result["receipt"]
        accepted = [r["outcome"]["record_id"] for _, r in acked.admissions if r["outcome"]["status"] == "accepted"]
        for rid in accepted:
            if rid in forgotten:
                continue
            if rid in acked.forget_sent:  # forget in flight at a kill: done or not, never half-done
                try:
                    assert client.get(rid)["record"]["record_id"] == rid
                except Failed as gone:
                    assert gone.code == Code.NOT_FOUND, (rid, gone.code)
                continue
            assert client.get(rid)["record"]["record_id"] == rid
        client.channel.close()
    finally:
        proc.stop()
