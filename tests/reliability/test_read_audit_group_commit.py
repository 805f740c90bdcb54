"""Group commit of the reads' audit rows (issue 63): rows appended while another read's row is
being synced share one ``fdatasync``, and each read still returns only once its own row is
durable (docs/reliability.md, "Audit rows of reads").

The drills hold the first sync until the other readers have queued their rows, so the grouping
is forced rather than hoped for: nothing here depends on how fast anything runs."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable

import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.services.maintenance import check_audit
from engram_core.store import audit_spool
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.kernel import StoreKernel
from tests.reliability.test_read_audit_spool import _heads, _row, _table

pytestmark = pytest.mark.duckdb_only(reason="the audit spool is the DuckDB store's; PostgreSQL has none")

READERS = 6
_fdatasync = os.fdatasync


def _until(done: Callable[[], bool], what: str) -> None:
    """Wait for another thread's progress (a deadline only against a hang, never a measurement)."""
    deadline = time.monotonic() + 30
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.001)


class _Syncs:
    """``fdatasync`` of the spool that holds its first call until ``store`` has ``waiting`` rows
    queued behind it, records how many lines each call made durable, and fails the calls
    numbered in ``failing``."""

    def __init__(self, store: StoreKernel, waiting: int, failing: frozenset[int] = frozenset()) -> None:
        self.store, self.waiting, self.failing = store, waiting, failing
        self.lines: list[int] = []  # lines in the spool file at each successful sync
        self.calls = 0

    def __call__(self, fd: int) -> None:
        if fd != self.store._spool._fd:  # another file of the process (os is patched as a whole)
            _fdatasync(fd)
            return
        self.calls += 1
        if self.calls == 1:
            _until(lambda: len(self.store._queue) >= self.waiting, f"{self.waiting} rows queued")
        if self.calls in self.failing:
            raise OSError(errno.EIO, "Input/output error")
        _fdatasync(fd)
        self.lines.append(self.store._spool.path.read_bytes().count(b"\n"))


def _read_concurrently(store: StoreKernel, first: int) -> tuple[str | Exception, dict[int, str | Exception]]:
    """Row ``first`` appended on one thread and, once its sync has begun, ``READERS`` more on
    threads of their own; each row's digest or error."""
    out: dict[int, str | Exception] = {}

    def append(i: int) -> None:
        try:
            out[i] = store.append_audit(_row(i))
        except Exception as exc:
            out[i] = exc

    leader = threading.Thread(target=append, args=(first,))
    leader.start()
    _until(lambda: _syncing(store), "the first row's sync")  # its caller holds the audit lock meanwhile
    others = [threading.Thread(target=append, args=(first + 1 + i,)) for i in range(READERS)]
    for t in others:
        t.start()
    for t in [leader, *others]:
        t.join(60)
        assert not t.is_alive()
    return out.pop(first), out


def _syncing(store: StoreKernel) -> bool:
    syncs = audit_spool.os.fdatasync
    return isinstance(syncs, _Syncs) and syncs.calls >= 1


def test_reads_queued_behind_a_sync_share_the_next_one(tmp_path, monkeypatch) -> None:
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        syncs = _Syncs(store, waiting=READERS)
        monkeypatch.setattr(audit_spool.os, "fdatasync", syncs)
        first, rest = _read_concurrently(store, 0)
        monkeypatch.undo()
        # One sync for the first row, one for the six queued behind it (the code before: seven).
        assert syncs.calls == 2 and syncs.lines == [1, 1 + READERS]
        rows = _table(store)
        assert not check_audit(rows, _heads(store))
        assert [r["seq"] for r in rows] == list(range(1, 2 + READERS))
        digests = {r["audit_id"]: r["row_digest"] for r in rows}
        assert first == digests["aud_spool_0"]
        assert rest == {i: digests[f"aud_spool_{i}"] for i in range(1, 1 + READERS)}
    finally:
        store.close()


def test_a_failed_group_sync_fails_every_read_in_it_and_leaves_the_chain(tmp_path, monkeypatch) -> None:
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        syncs = _Syncs(store, waiting=READERS, failing=frozenset({2}))
        monkeypatch.setattr(audit_spool.os, "fdatasync", syncs)
        first, rest = _read_concurrently(store, 0)
        assert isinstance(first, str)
        assert all(isinstance(e, EngramError) and e.code is Code.STORE_UNAVAILABLE for e in rest.values())
        assert len({id(e) for e in rest.values()}) == READERS  # each caller raises its own error
        monkeypatch.undo()
        later = store.append_audit(_row(50))
        rows = _table(store)
        assert not check_audit(rows, _heads(store))
        # The failed batch left nothing: the next row follows the first.
        assert [(r["seq"], r["audit_id"]) for r in rows] == [(1, "aud_spool_0"), (2, "aud_spool_50")]
        assert rows[1]["row_digest"] == later
    finally:
        store.close()


def test_a_row_that_cannot_be_chained_fails_alone(tmp_path, monkeypatch) -> None:
    """A row whose decisions are not canonical JSON fails its own call; the rows in its batch
    are written as if it had not been there."""
    store = open_duckdb_store(tmp_path, keys=None)
    try:
        syncs = _Syncs(store, waiting=READERS)
        monkeypatch.setattr(audit_spool.os, "fdatasync", syncs)
        bad = _row(3)
        object.__setattr__(bad, "decisions", [{"score": float("nan")}])
        real_row = _row
        rows_by_index = {3: bad}
        monkeypatch.setattr("tests.reliability.test_read_audit_group_commit._row",
                            lambda i: rows_by_index.get(i) or real_row(i))
        first, rest = _read_concurrently(store, 0)
        monkeypatch.undo()
        assert isinstance(first, str) and isinstance(rest.pop(3), ValueError)
        assert all(isinstance(d, str) for d in rest.values())
        rows = _table(store)
        assert not check_audit(rows, _heads(store))
        assert [r["seq"] for r in rows] == list(range(1, 1 + READERS))
        assert "aud_spool_3" not in {r["audit_id"] for r in rows}
    finally:
        store.close()
