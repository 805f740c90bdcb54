"""A group commit's flush (store/duckdb/group_commit.py) on a real DuckDB file with the engine's
schema: the pending writes of distinct tables go as one statement, and a write that must see
another's row (an update or delete after an insert of its table) still does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.store.chain import GENESIS
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.duckdb.group_commit import ROWS_PER_STATEMENT, Batch
from engram_core.store.port import CandidateRow, Event
from engram_core.store.sql.codecs import CANDIDATE_COLS, candidate_values, event_values

T, W = "acme", "alpha"


class Counted:
    """The connection, counting the statements a flush sends."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.sent: list[str] = []

    def execute(self, sql: str, params: Any = None) -> duckdb.DuckDBPyConnection:
        self.sent.append(sql)
        return self.con.execute(sql, params)


@pytest.fixture()
def con(tmp_path: Path):
    open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path)).close()  # the schema, migrated
    con = duckdb.connect(str(tmp_path / "engram.duckdb"))
    con.execute("INSERT INTO scopes VALUES (?, ?, false, '[]', 0, 0, ?)", [T, W, GENESIS])
    yield Counted(con)
    con.close()


def _candidate(cid: str) -> CandidateRow:
    return CandidateRow(cid, T, W, "p", "a", "s", "pending", "pd", "rd", "tc", {}, b"sealed", 1, 1)


def _event(cursor: int) -> Event:
    return Event(T, W, cursor, f"evt{cursor}", "capture", "c1", "", "pending", 1, {}, GENESIS, f"d{cursor}")


def _capture_shape(batch: Batch, cid: str, cursor: int) -> None:
    p = batch.pending
    p.add_row("journal", "INSERT", "", event_values(_event(cursor)))
    p.add_row("idempotency", "INSERT", "", [T, W, "p", f"k{cid}", "capture", cid, "rd", "{}", 1])
    p.add_row("candidates", "INSERT", f" ({CANDIDATE_COLS})", candidate_values(_candidate(cid)))
    p.add_row("data_keys", "INSERT", "", [f"candidate:{cid}", 7, 1])
    p.note(("head", T, W, cursor, f"d{cursor}"))


def test_a_captures_writes_to_five_tables_are_one_statement(con: Counted) -> None:
    batch = Batch()
    _capture_shape(batch, "c1", 1)
    batch.flush(con)  # type: ignore[arg-type]
    assert len(con.sent) == 1 and con.sent[0].startswith("BEGIN TRANSACTION; WITH ")  # the batch's transaction too
    con.execute("COMMIT")
    c = con.con
    assert c.execute("SELECT count(*) FROM journal").fetchone() == (1,)
    assert c.execute("SELECT key FROM idempotency").fetchall() == [("kc1",)]
    assert c.execute("SELECT state FROM candidates WHERE candidate_id = 'c1'").fetchall() == [("pending",)]
    assert c.execute("SELECT slot FROM data_keys").fetchall() == [(7,)]
    assert c.execute("SELECT last_cursor, last_event_digest FROM scopes").fetchall() == [(1, "d1")]
    assert not batch.pending.tables()


def test_an_update_or_delete_sees_the_row_inserted_in_the_same_flush(con: Counted) -> None:
    batch = Batch()
    _capture_shape(batch, "c1", 1)
    # The same batch admits it: its state changes and its key goes, after the rows are in.
    batch.pending.set_candidate_state("c1", "admitted", '{"why": 1}', True)
    batch.pending.note(("delete", "data_keys", "owner", "candidate:c1"))
    batch.flush(con)  # type: ignore[arg-type]
    assert len(con.sent) == 2  # the rows, then what must see them
    con.execute("COMMIT")
    c = con.con
    assert c.execute("SELECT state, decision, sealed_envelope FROM candidates").fetchall() == [
        ("admitted", '{"why": 1}', None)]
    assert c.execute("SELECT count(*) FROM data_keys").fetchone() == (0,)


def test_held_updates_wait_for_the_next_flush_and_share_its_statement(con: Counted) -> None:
    batch = Batch()
    _capture_shape(batch, "c1", 1)
    batch.pending.note(("delete", "data_keys", "owner", "candidate:c1"))
    batch.flush(con, hold_overlaps=True)  # type: ignore[arg-type]
    assert len(con.sent) == 1
    assert batch.pending.deletes and "candidate:c1" in batch.pending.dropped_keys  # still pending, still seen
    assert con.con.execute("SELECT count(*) FROM data_keys").fetchone() == (1,)
    batch.pending.add_row("audit", "INSERT", "", [f"scope:{T}/{W}", 1, 1, "a1", T, W, "p", "a", "op", "ok", "t",
                                                  "[]", GENESIS, "r1", ""])
    batch.flush(con)  # type: ignore[arg-type]
    assert len(con.sent) == 2
    con.execute("COMMIT")
    assert con.con.execute("SELECT count(*) FROM data_keys").fetchone() == (0,)
    assert con.con.execute("SELECT count(*) FROM audit").fetchone() == (1,)
    assert not batch.pending.tables() and not batch.pending.dropped_keys


def test_many_rows_of_one_table_and_many_scope_heads_all_land(con: Counted) -> None:
    batch = Batch()
    n = ROWS_PER_STATEMENT * 2 + 3
    for i in range(n):
        batch.pending.add_row("data_keys", "INSERT", "", [f"k{i}", i, 1])
    con.con.execute("INSERT INTO scopes VALUES (?, ?, false, '[]', 0, 0, ?)", [T, "beta", GENESIS])
    batch.pending.note(("head", T, W, 5, "d5"))
    batch.pending.note(("head", T, "beta", 9, "d9"))
    for cid in ("c1", "c2"):
        batch.pending.add_row("candidates", "INSERT", f" ({CANDIDATE_COLS})", candidate_values(_candidate(cid)))
    batch.flush(con)  # type: ignore[arg-type]
    batch.pending.set_candidate_state("c1", "admitted", None, False)
    batch.pending.set_candidate_state("c2", "rejected", None, True)
    batch.flush(con)  # type: ignore[arg-type]
    con.execute("COMMIT")
    c = con.con
    assert c.execute("SELECT count(*), sum(slot) FROM data_keys").fetchone() == (n, n * (n - 1) // 2)
    assert c.execute("SELECT workspace, last_cursor FROM scopes ORDER BY workspace").fetchall() == [
        (W, 5), ("beta", 9)]
    assert c.execute("SELECT candidate_id, state, sealed_envelope IS NULL FROM candidates ORDER BY 1").fetchall() == [
        ("c1", "admitted", False), ("c2", "rejected", True)]


def test_a_batch_begins_its_transaction_with_its_first_write_and_one_that_wrote_nothing_commits_nothing(
        tmp_path: Path) -> None:
    store = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    commits: list[int] = []
    store.engine.observers.on_commit = lambda _seconds, members: commits.append(members)
    try:
        with store.write(batched=True) as tx:
            assert tx.candidate(Scope(T, W), "c1") is None  # a read before any write: the committed state
        assert commits == []
        with store.write(batched=True) as tx:
            tx.insert_candidate(_candidate("c1"))
        assert commits == [1]
        with store.read() as tx:
            assert tx.candidate(Scope(T, W), "c1") == _candidate("c1")
    finally:
        store.close()
