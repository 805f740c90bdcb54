"""Group commit through the real service: concurrent agents' captures and admissions share
COMMITs, every acknowledged answer is in the file after the core stops, each idempotency key
has one effect, and the journal chain and audit chain stay whole."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.services.maintenance import check_audit, check_journal
from engram_core.store.duckdb import open_duckdb_store
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate, capture_args

CLIENTS = 12
PAIRS = 4


@pytest.mark.duckdb_only(reason="DuckDB's group commit (one writer, transactions batched into a COMMIT); "
                                "PostgreSQL commits each transaction on its own connection")
def test_concurrent_pairs_share_commits_and_every_acknowledged_one_is_durable(stores: EngineStores, tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = stores.start_core(data)
    activate(running)
    store = running.core.store
    batches: list[int] = []
    observe = store.engine.observers.on_commit

    def record(seconds: float, transactions: int = 1) -> None:
        batches.append(transactions)
        if observe is not None:
            observe(seconds, transactions)

    store.engine.observers.on_commit = record
    acknowledged: dict[str, str] = {}  # record id -> candidate id
    replays: list[tuple[str, str]] = []
    errors: list[BaseException] = []

    def agent(n: int) -> None:
        client = Client(running)
        try:
            for i in range(PAIRS):
                args = capture_args(f"Agent {n} decided item {i}: use queue q{n}-{i} because of ordering.",
                                    key=f"capture-key-{n:04d}-{i:04d}")
                cap = client.call("capture", args)
                again = client.call("capture", args)  # a retry with the same key: the same answer
                assert again["candidate_id"] == cap["candidate_id"]
                out = client.admit(cap["candidate_id"], key=f"admission-key-{n:04d}-{i:04d}")["outcome"]
                assert out["status"] == "accepted", out
                acknowledged[out["record_id"]] = cap["candidate_id"]
                again = client.admit(cap["candidate_id"], key=f"admission-key-{n:04d}-{i:04d}")
                replays.append((cap["candidate_id"], again["outcome"]["record_id"]))
        except BaseException as exc:  # reported below: a thread's assertion must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(acknowledged) == CLIENTS * PAIRS
    assert all(acknowledged[rid] == cid for cid, rid in replays)
    assert max(batches) > 1, "no COMMIT carried more than one transaction"
    assert sum(batches) >= CLIENTS * PAIRS * 2  # captures and admissions (replays commit only their audit row)
    running.stop()

    reopened = open_duckdb_store(data, keys=FileKeyVault(data))
    try:
        with reopened.read() as tx:
            rows = tx.records(Scope("acme", "alpha"), list(acknowledged))
            assert set(rows) == set(acknowledged)
            assert all(rows[rid].state == "accepted_current" for rid in rows)
            scope = tx.scope(Scope("acme", "alpha"))
            events = tx.events(Scope("acme", "alpha"), 1, None)
            audit = tx.audit_rows(None, 1, None)
            heads = tx.audit_heads()
        assert scope is not None and scope.last_cursor == len(events) == CLIENTS * PAIRS * 2
        assert check_journal(scope, events) == []
        assert check_audit(audit, heads) == []
        assert len(audit) >= 1 + CLIENTS * PAIRS * 2  # activation, each capture and admission
    finally:
        reopened.close()
