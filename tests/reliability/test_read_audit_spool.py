"""Audit rows of reads (SPEC §1: a call's auditId appears in the audit log) go to the audit
spool: durable before the read answers, on the process's writer chain, moved into the table
in batches, at snapshot reads, at close and at the open after a crash.

DuckDB only: the spool is the DuckDB store's (a file beside it). A PostgreSQL core has none: a
read's row is in the database before the read answers, which the crash soak checks on both
engines (tests/reliability/test_crash_soak.py: every acknowledged read has its row)."""

from __future__ import annotations

import errno

import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.services.maintenance import check_audit
from engram_core.store import audit_spool
from engram_core.store import kernel as store_kernel
from engram_core.store.chain import scope_chain
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.kernel import StoreKernel
from engram_core.store.port import AuditRow
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate
from tests.support.crash_harness import CoreProcess

pytestmark = pytest.mark.duckdb_only(reason="the audit spool is the DuckDB store's; PostgreSQL has none")


class _Proc:
    def __init__(self, proc: CoreProcess) -> None:
        self.address = proc.address
        self.host_key_path = proc.data_dir / "host.key"


def _row(i: int) -> AuditRow:
    return AuditRow(at_ms=1_800_000_000_000 + i, audit_id=f"aud_spool_{i}", tenant="acme", workspace="alpha",
                    principal="user:ana", agent_id="agent-7", operation="engram_memory_search", outcome="ok",
                    target_digest="", decisions=[{"path": "engram/authz", "n": i}])


def _table(store: StoreKernel) -> list[dict]:
    with store.read() as tx:  # a snapshot: the spool is moved first
        return tx.audit_rows(None, 0, None)


def _heads(store: StoreKernel) -> dict[str, tuple[int, str]]:
    with store.read() as tx:
        return tx.audit_heads()


def _abandon(store: StoreKernel) -> None:
    """Let go of a store the way a killed process does: no close, no spool move, no checkpoint."""
    store._mover.shutdown(wait=True)
    store._spool.close()
    store.engine._con.close()
    store.engine._lock_file.close()


def _table_raw(data) -> list[int]:
    """Sequence numbers in the table without moving the spool (a store that does not migrate)."""
    store = open_duckdb_store(data, keys=None, migrate=False)
    try:
        return [r[0] for r in store.engine._con.execute("SELECT seq FROM audit ORDER BY seq").fetchall()]
    finally:
        _abandon(store)


@pytest.mark.timeout(300)
def test_acknowledged_reads_are_in_the_audit_log_after_sigkill(stores: EngineStores, tmp_path) -> None:
    data = tmp_path / "data"
    proc = CoreProcess(data, stores)
    proc.start()
    try:
        activate(_Proc(proc))  # type: ignore[arg-type]
        client = Client(_Proc(proc))  # type: ignore[arg-type]
        rid = client.remember("The audit spool drill keeps this shoveler record.")
        acked = []
        for i in range(25):
            audit_id = f"aud_read_drill_{i:03d}"
            if i % 2:
                client.call("search", {"query": "shoveler", "purpose_ref": client.purpose_ref},
                            context=client.context("search", audit_id=audit_id))
            else:
                client.call("get", {"record_id": rid, "purpose_ref": client.purpose_ref},
                            context=client.context("get", audit_id=audit_id))
            acked.append(audit_id)
        client.channel.close()
    finally:
        proc.kill()  # no close: the spooled rows are moved by the next open
    assert len(_table_raw(data)) < 25  # the reads' rows were still only in the spool
    store = open_duckdb_store(data, keys=None)
    try:
        rows = _table(store)
        assert not check_audit(rows, _heads(store))
        assert {r["audit_id"] for r in rows} >= set(acked)
        assert (data / audit_spool.SPOOL_NAME).stat().st_size == 0
    finally:
        store.close()


def test_spooled_and_transactional_rows_each_keep_a_dense_chain(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(store_kernel, "SPOOL_BATCH", 4)
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        for i in range(6):
            store.append_audit(_row(i))
            if i == 2:
                with store.write() as tx:  # a mutation's row, in its own transaction
                    tx.append_audit(_row(100))
            if i == 3:
                store._mover.submit(lambda: None).result()  # the move the fourth row started
        assert len(store._spool.pending) == 2  # the first four read rows moved as one batch, two since
        rows = _table(store)
        assert not check_audit(rows, _heads(store))
        writer = [r for r in rows if r["chain"] == store.writer_chain]
        assert [r["seq"] for r in writer] == list(range(1, 7))
        assert [(r["seq"], r["audit_id"]) for r in rows if r["chain"] == scope_chain("acme", "alpha")] == [
            (1, "aud_spool_100")]
        assert store._spool.pending == []
    finally:
        store.close()


def test_rows_moved_before_a_crash_cut_the_spool_are_not_duplicated(tmp_path) -> None:
    store = open_duckdb_store(tmp_path, keys=None)
    for i in range(3):
        store.append_audit(_row(i))
    spooled = (tmp_path / audit_spool.SPOOL_NAME).read_bytes()
    store.close()  # moves the rows and truncates the spool
    # As if the process died after the move committed and before the truncation.
    (tmp_path / audit_spool.SPOOL_NAME).write_bytes(spooled)
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        store.append_audit(_row(3))
        rows = _table(store)
        # The first process's three rows once (not twice), then the second process's own chain.
        assert sorted(r["seq"] for r in rows) == [1, 1, 2, 3] and not check_audit(rows, _heads(store))
    finally:
        store.close()


def _died_after_two_reads(data) -> bytes:
    """A store that appended two read rows and then died without close; the spool's bytes."""
    data.mkdir()
    store = open_duckdb_store(data, keys=None)
    store.append_audit(_row(0))
    store.append_audit(_row(1))
    _abandon(store)
    return (data / audit_spool.SPOOL_NAME).read_bytes()


@pytest.mark.parametrize("torn", [b'{"seq": 3, "at_', b"\0" * 40, b'{"seq": 3, "at_ms"\n'])
def test_a_torn_last_append_is_dropped(tmp_path, torn: bytes) -> None:
    data = tmp_path / "data"
    good = _died_after_two_reads(data)
    (data / audit_spool.SPOOL_NAME).write_bytes(good + torn)
    store = open_duckdb_store(data, keys=None)
    try:
        assert [r["seq"] for r in _table(store)] == [1, 2]
        store.append_audit(_row(2))  # continues on a line of its own
        rows = _table(store)
        assert sorted(r["seq"] for r in rows) == [1, 1, 2] and not check_audit(rows, _heads(store))
    finally:
        store.close()


def test_an_unreadable_line_before_the_last_refuses_the_open(tmp_path) -> None:
    data = tmp_path / "data"
    good = _died_after_two_reads(data)
    (data / audit_spool.SPOOL_NAME).write_bytes(b"not json\n" + good)
    with pytest.raises(EngramError) as err:
        open_duckdb_store(data, keys=None)
    assert err.value.code is Code.JOURNAL_CORRUPT


def test_a_failed_spool_write_fails_the_read_and_leaves_the_chain_intact(tmp_path, monkeypatch) -> None:
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        store.append_audit(_row(0))
        head = store._writer_head

        def disk_full(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(audit_spool.os, "write", disk_full)
        with pytest.raises(EngramError) as err:
            store.append_audit(_row(1))
        assert err.value.code is Code.STORE_UNAVAILABLE and store._writer_head == head
        monkeypatch.undo()
        store.append_audit(_row(2))
        rows = _table(store)
        assert [r["audit_id"] for r in rows] == ["aud_spool_0", "aud_spool_2"]
        assert not check_audit(rows, _heads(store))
    finally:
        store.close()


def test_a_read_through_the_service_is_audited_before_it_answers(stores: EngineStores, tmp_path) -> None:
    """The service path: a search's audit row is in the spool file when the answer arrives."""

    running = stores.start_core(tmp_path / "data", semantic=False)
    try:
        activate(running)
        client = Client(running)
        before = (tmp_path / "data" / audit_spool.SPOOL_NAME).stat().st_size
        client.call("search", {"query": "anything", "purpose_ref": client.purpose_ref},
                    context=client.context("search", audit_id="aud_answered_search"))
        spooled = (tmp_path / "data" / audit_spool.SPOOL_NAME).read_bytes()[before:]
        assert b'"audit_id":"aud_answered_search"' in spooled and spooled.endswith(b"\n")
    finally:
        running.stop()


def test_inside_a_write_transaction_the_spool_neither_moves_nor_takes_rows(tmp_path) -> None:
    """Moving the spool is a transaction of its own on the writer's connection: never from inside
    a write transaction (it would end it), and a standalone row there would wait for, or be
    undone with, that transaction."""
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        store.append_audit(_row(0))
        with store.write() as tx:
            tx.append_audit(_row(100))
            with store.read() as snap:  # a snapshot read on the same thread
                snap.scopes()
            assert len(store._spool.pending) == 1
            with pytest.raises(EngramError) as err:
                store.append_audit(_row(1))
            assert err.value.code is Code.STORE_UNAVAILABLE
        rows = _table(store)
        assert sorted(r["audit_id"] for r in rows) == ["aud_spool_0", "aud_spool_100"]
        assert not check_audit(rows, _heads(store))
    finally:
        store.close()
