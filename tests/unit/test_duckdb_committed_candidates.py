"""The DuckDB writer's copy of candidates it committed (store/duckdb/candidate_cache.py): a
write transaction reads a candidate from it only as committed and unchanged by its batch, so
every read answers what the table would."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.duckdb.candidate_cache import CommittedCandidates
from engram_core.store.kernel import StoreKernel
from engram_core.store.port import CandidateRow

T, W = "acme", "alpha"


@pytest.fixture()
def store(tmp_path: Path):
    s = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    yield s
    if s.is_open():
        s.close()


def _row(cid: str, envelope: bytes = b"sealed") -> CandidateRow:
    return CandidateRow(cid, T, W, "p", "a", "s", "pending", "pd", "rd", "asserted", {}, envelope, 1, 1)


def _read(store: StoreKernel, cid: str, *, batched: bool = True) -> CandidateRow | None:
    with store.write(batched=batched) as tx:
        return tx.candidate(Scope(T, W), cid)


def _from_table(store: StoreKernel, cid: str) -> CandidateRow | None:
    with store.read() as tx:
        return tx.candidate(Scope(T, W), cid)


def test_a_write_reads_a_committed_candidate_as_the_table_holds_it(store: StoreKernel) -> None:
    with store.write(batched=True) as tx:
        tx.insert_candidate(_row("c1"))
    assert store.engine.committed_candidate("c1") == _from_table(store, "c1") == _row("c1")
    with store.write(batched=True) as tx:
        tx.set_candidate_state("c1", "admitted", decision={"why": "ok"}, drop_envelope=True)
    copy = store.engine.committed_candidate("c1")
    assert copy is not None and copy.state == "admitted" and copy.sealed_envelope is None
    assert copy == _from_table(store, "c1") == _read(store, "c1")
    assert _read(store, "c1") is not None and _read(store, "c1").tenant == T  # type: ignore[union-attr]
    with store.write(batched=True) as tx:
        assert tx.candidate(Scope("other", W), "c1") is None  # the scope is checked as for a row read


def test_a_batch_that_fails_leaves_the_copy_as_committed(store: StoreKernel) -> None:
    with store.write(batched=True) as tx:
        tx.insert_candidate(_row("c1"))
    with pytest.raises(RuntimeError), store.write(batched=True) as tx:
        tx.set_candidate_state("c1", "rejected", drop_envelope=True)
        tx.insert_candidate(_row("c2"))
        raise RuntimeError("the member's checks fail")
    assert store.engine.committed_candidate("c1") == _from_table(store, "c1") == _row("c1")
    assert store.engine.committed_candidate("c2") is None and _read(store, "c2") is None


def test_a_candidate_changed_through_sql_is_read_from_the_table(store: StoreKernel) -> None:
    with store.write(batched=True) as tx:
        tx.insert_candidate(_row("c1"))
    with store.write(batched=True) as tx:
        tx.set_candidate_trust_class("c1", "signed")
        assert tx.candidate(Scope(T, W), "c1").trust_class == "signed"  # type: ignore[union-attr]
    assert store.engine.committed_candidate("c1") is None
    assert _read(store, "c1").trust_class == "signed"  # type: ignore[union-attr]
    with store.write(batched=True) as tx:  # read once more: the copy holds it again only after a write
        tx.insert_candidate(_row("c3"))
    with store.write() as tx:  # a transaction of its own
        tx.set_candidate_trust_class("c3", "earned")
    assert store.engine.committed_candidate("c3") is None
    assert _read(store, "c3").trust_class == "earned"  # type: ignore[union-attr]


def test_the_copy_is_bounded_by_rows_and_by_envelope_bytes() -> None:
    copy = CommittedCandidates(max_rows=3, max_bytes=100)
    copy.committed({c: _row(c, b"x" * 10) for c in ("a", "b", "c", "d")}, [])
    assert [copy.get(c) is not None for c in "abcd"] == [False, True, True, True]
    copy.committed({"e": _row("e", b"x" * 95)}, [])
    assert [copy.get(c) is not None for c in "bcde"] == [False, False, False, True]
    copy.committed({}, [("e", "rejected", None, True)])
    assert copy.get("e").sealed_envelope is None and copy.get("e").state == "rejected"  # type: ignore[union-attr]
    copy.committed({}, [("zz", "admitted", None, False)])  # a change to a row it does not hold
    assert copy.get("zz") is None


def test_a_member_reads_what_an_earlier_member_of_its_batch_changed_even_once_flushed(store: StoreKernel) -> None:
    from tests.unit.test_group_commit import _batch

    with store.write(batched=True) as tx:
        tx.insert_candidate(_row("c1"))  # committed: the writer holds its copy

    def admit(tx) -> None:  # type: ignore[no-untyped-def]
        tx.set_candidate_state("c1", "admitted", decision={"why": "ok"}, drop_envelope=True)

    def look(tx) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
        tx.candidates_in_state(Scope(T, W), "admitted")  # a query of the table: the batch's changes flushed first
        c = tx.candidate(Scope(T, W), "c1")
        return c.state, c.decision, c.sealed_envelope

    assert _batch(store, [admit, look])[1] == ("admitted", {"why": "ok"}, None)


def test_a_latest_reader_reads_the_copy_and_a_snapshot_reader_its_snapshot(store: StoreKernel) -> None:
    with store.write(batched=True) as tx:
        tx.insert_candidate(_row("c1"))
    with store.read() as snap:
        assert snap.candidate(Scope(T, W), "c1").state == "pending"  # type: ignore[union-attr]
        with store.write(batched=True) as tx:
            tx.set_candidate_state("c1", "admitted", drop_envelope=True)
        assert snap.candidate(Scope(T, W), "c1").state == "pending"  # type: ignore[union-attr]  # its snapshot
        with store.read(snapshot=False) as latest:
            c = latest.candidate(Scope(T, W), "c1")
            assert (c.state, c.sealed_envelope) == ("admitted", None)  # type: ignore[union-attr]
            assert latest.candidate(Scope("other", W), "c1") is None
    with store.read() as fresh:
        assert fresh.candidate(Scope(T, W), "c1") == store.engine.committed_candidate("c1")
