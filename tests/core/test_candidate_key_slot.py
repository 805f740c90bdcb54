"""Candidates carry their data key's slot (migration 8): an admission opens the envelope without
looking the slot up in data_keys, a store made before the migration gains the slots of its live
candidates, and a slot left in a withdrawn candidate's row opens nothing."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.crypto.sealing import seal
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS
from tests.support.core_engines import one, rows
from tests.support.core_support import Client


def _slot_rows(ana: Client, candidate_id: str) -> tuple[int | None, list[int]]:
    """(the candidate row's key_slot, the data_keys slots of the candidate's key)."""
    with ana.core.core.store.read() as tx:
        row = one(tx, "SELECT key_slot FROM candidates WHERE candidate_id = ?", [candidate_id])
        keys = [int(r[0]) for r in rows(tx, "SELECT slot FROM data_keys WHERE owner = ?", [f"candidate:{candidate_id}"])]
    return (None if row is None or row[0] is None else int(row[0])), keys


def test_a_capture_names_its_slot_and_a_withdrawal_leaves_a_number_that_opens_nothing(ana: Client) -> None:
    admitted = ana.capture("The heron note: a capture whose row names its key slot.")
    slot, keys = _slot_rows(ana, admitted["candidate_id"])
    assert slot is not None and keys == [slot]
    assert ana.admit(admitted["candidate_id"])["outcome"]["status"] == "accepted"

    withdrawn = ana.capture("The egret note: captured, then withdrawn.")
    slot, keys = _slot_rows(ana, withdrawn["candidate_id"])
    assert keys == [slot]
    vault = ana.core.core.vault
    assert vault.data_key(slot, f"candidate:{withdrawn['candidate_id']}") is not None
    w = {"candidate_id": withdrawn["candidate_id"], "idempotency_key": "withdraw-egret-0001", "reason_ref": "r:egret"}
    ana.call("withdraw", w, grant=True)
    after, keys = _slot_rows(ana, withdrawn["candidate_id"])
    assert after == slot and keys == []  # the row keeps the number; the ledger of live keys does not
    assert vault.data_key(slot, f"candidate:{withdrawn['candidate_id']}") is None


def test_migration_8_gives_the_live_candidates_of_an_older_store_their_slots(tmp_path: Path) -> None:
    vault = FileKeyVault(tmp_path)
    con = duckdb.connect(str(tmp_path / "engram.duckdb"))
    con.execute(LEDGER_DDL)
    for m in MIGRATIONS[:7]:
        con.execute(m.sql)
        con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, ?)", [m.version, m.name, m.checksum, 0])
    now = int(time.time() * 1000)
    live_slot, key = vault.new_data_key("candidate:cand_live")
    for cid, state, envelope in (("cand_live", "pending", seal(key, b"{}", kind="candidate", owner="cand_live")),
                                 ("cand_gone", "withdrawn", None)):
        con.execute(
            "INSERT INTO candidates VALUES (?, 'acme', 'alpha', 'agent', 'a1', 's1', ?, 'sha256:p', 'sha256:r', "
            "'asserted', '{}', ?, ?, 1, NULL)", [cid, state, envelope, now])
    con.execute("INSERT INTO data_keys VALUES ('candidate:cand_live', ?, ?)", [live_slot, now])
    con.execute("CHECKPOINT")
    con.close()

    store = open_duckdb_store(tmp_path, keys=vault)
    try:
        applied = [row["version"] for row in store.migration_ledger()]
        assert 8 in applied and applied[-1] == MIGRATIONS[-1].version  # 8 and every later one
        with store.read() as tx:
            live, gone = tx.candidate(Scope("acme", "alpha"), "cand_live"), tx.candidate(Scope("acme", "alpha"), "cand_gone")
        assert live is not None and live.key_slot == live_slot
        assert gone is not None and gone.key_slot is None  # no live key: nothing to name
    finally:
        store.close()
