"""Group commit (store/duckdb/group_commit.py) on a real DuckDB file: members that share one
COMMIT, a member whose checks fail leaving the others whole, a batch that cannot commit
refusing every member and leaving nothing, and members reading what earlier members of the
same batch wrote.

Batches are made deterministic: each member holds its ``with`` block open until the next is
queued on the writer lock, so they join one batch in order."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.services.maintenance import check_audit
from engram_core.store.chain import scope_chain
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.kernel import KernelTx as DuckDBTx
from engram_core.store.kernel import StoreKernel as DuckDBStore
from engram_core.store.port import AuditRow, IdempotencyRow

T, W = "acme", "alpha"


@pytest.fixture()
def store(tmp_path: Path):
    s = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    commits: list[int] = []
    s.engine.observers.on_commit = lambda _seconds, transactions: commits.append(transactions)
    s.commits = commits  # type: ignore[attr-defined]
    yield s
    if s.is_open():
        s.close()


def _event(tx: DuckDBTx, target: str) -> int:
    return tx.append_event(Scope(T, W), event_id=f"evt_{target}", operation="capture", target=target, from_state="",
                           to_state="pending", at_ms=1, body={}).cursor


def _batch(store: DuckDBStore, bodies: list[Callable[[DuckDBTx], object]]) -> list[object]:
    """Run ``bodies`` in order as members of one batch: each holds the writer lock until the
    next one is queued behind it, so the next joins the same batch."""
    results: list[object] = [None] * len(bodies)
    entered = [threading.Event() for _ in bodies]

    def run(i: int) -> None:
        try:
            with store.write(batched=True) as tx:
                entered[i].set()
                deadline = time.monotonic() + 10
                while i < len(bodies) - 1 and store.engine._waiting < 1 and time.monotonic() < deadline:
                    time.sleep(0.001)
                results[i] = bodies[i](tx)
        except EngramError as exc:
            results[i] = exc

    threads = []
    for i in range(len(bodies)):
        if i:
            assert entered[i - 1].wait(10)
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join(10)
    return results


def _journal(store: DuckDBStore) -> list[str]:
    with store.read() as tx:
        return [e.target for e in tx.events(Scope(T, W), 1, None)]


def test_members_share_one_commit_and_survive_a_reopen(store: DuckDBStore, tmp_path: Path) -> None:
    cursors = _batch(store, [lambda tx, n=n: _event(tx, f"c{n}") for n in range(5)])
    assert cursors == [1, 2, 3, 4, 5]  # the chain runs through the batch
    assert store.commits == [5]  # type: ignore[attr-defined]
    store.close()
    reopened = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    try:
        with reopened.read() as tx:
            events = tx.events(Scope(T, W), 1, None)
            assert [e.target for e in events] == ["c0", "c1", "c2", "c3", "c4"]
            assert all(e.prev_digest == p.event_digest for p, e in zip(events, events[1:], strict=False))
            assert tx.scope(Scope(T, W)).last_cursor == 5  # type: ignore[union-attr]
    finally:
        reopened.close()


def test_a_member_failing_its_checks_leaves_the_others_whole(store: DuckDBStore) -> None:
    def fails_after_preparing(tx: DuckDBTx) -> None:
        _event(tx, "bad")  # prepared, never joined
        raise EngramError(Code.POLICY_STALE, "checks failed")

    results = _batch(store, [lambda tx: _event(tx, "a"), fails_after_preparing, lambda tx: _event(tx, "b")])
    assert isinstance(results[1], EngramError) and results[1].code == Code.POLICY_STALE
    assert results[0] == 1 and results[2] == 2  # the failed member's cursor was never taken
    assert _journal(store) == ["a", "b"]


def test_a_batch_that_cannot_commit_refuses_every_member_and_leaves_nothing(store: DuckDBStore) -> None:
    # Two members put the same data key owner: the batch's multi-row INSERT violates the key.
    def put(tx: DuckDBTx, target: str) -> None:
        _event(tx, target)
        tx.put_data_key("record:same", 7, 1)

    results = _batch(store, [lambda tx: put(tx, "x"), lambda tx: put(tx, "y"), lambda tx: _event(tx, "z")])
    assert all(isinstance(r, EngramError) and r.code == Code.STORE_UNAVAILABLE for r in results), results
    assert _journal(store) == []
    with store.read() as tx:
        assert tx.data_key_slot("record:same") is None
    assert store.commits == []  # type: ignore[attr-defined]
    assert _event_alone(store, "after") == 1  # the writer goes on


def _event_alone(store: DuckDBStore, target: str) -> int:
    with store.write(batched=True) as tx:
        return _event(tx, target)


def test_members_read_what_earlier_members_of_their_batch_wrote(store: DuckDBStore) -> None:
    row = IdempotencyRow("engram_memory_capture", "cand_1", "sha256:" + "0" * 64, {"status": "committed_pending"})

    def first(tx: DuckDBTx) -> None:
        tx.idempotency_put(Scope(T, W), "agent", "key-1", row, 1)
        tx.put_data_key("candidate:cand_1", 3, 1)
        assert tx.use_confirmation("grant-1", Scope(T, W), 1)

    def second(tx: DuckDBTx) -> tuple[object, ...]:
        return (tx.idempotency_get(Scope(T, W), "agent", "key-1"), tx.data_key_slot("candidate:cand_1"),
                tx.use_confirmation("grant-1", Scope(T, W), 1), tx.drop_data_key("candidate:cand_1", 2, "accepted"),
                tx.data_key_slot("candidate:cand_1"))

    results = _batch(store, [first, second])
    assert results[1] == (row, 3, False, 3, None)  # a grant is spent once, even within one batch
    with store.read() as tx:
        assert tx.idempotency_get(Scope(T, W), "agent", "key-1") == row
        assert tx.data_key_slot("candidate:cand_1") is None
        assert tx.key_destruction("candidate:cand_1").at_ms == 2


def test_a_promoted_member_that_fails_takes_its_batch_down_retriably(store: DuckDBStore) -> None:
    def promoted_then_fails(tx: DuckDBTx) -> None:
        _event(tx, "p")
        tx.events(Scope(T, W), 1, None)  # reads the journal it has a pending row in: its writes go in now
        raise EngramError(Code.POLICY_STALE, "too late")

    results = _batch(store, [lambda tx: _event(tx, "a"), promoted_then_fails])
    assert isinstance(results[0], EngramError) and results[0].code == Code.STORE_UNAVAILABLE
    assert isinstance(results[1], EngramError) and results[1].code == Code.POLICY_STALE
    assert _journal(store) == []
    assert _event_alone(store, "next") == 1


def test_an_exclusive_transaction_commits_the_open_batch_first(store: DuckDBStore) -> None:
    release, out = threading.Event(), {}

    def member() -> None:
        with store.write(batched=True) as tx:
            release.wait(10)
            out["a"] = _event(tx, "a")

    def exclusive() -> None:
        with store.write() as tx:  # maintenance: a transaction of its own
            out["b"] = _event(tx, "b")

    first = threading.Thread(target=member)
    first.start()
    while store.engine._batch is None:
        time.sleep(0.001)
    second = threading.Thread(target=exclusive)
    second.start()
    while store.engine._waiting < 1:
        time.sleep(0.001)
    release.set()
    first.join(10)
    second.join(10)
    assert out == {"a": 1, "b": 2}
    assert store.commits == [1, 1]  # type: ignore[attr-defined]
    assert _journal(store) == ["a", "b"]


def test_readers_never_see_a_batch_before_its_commit(store: DuckDBStore) -> None:
    seen: list[list[str]] = []

    def look(tx: DuckDBTx) -> int:
        cursor = _event(tx, "b")
        seen.append(_journal(store))  # another cursor, while the batch is open
        return cursor

    _batch(store, [lambda tx: _event(tx, "a"), look])
    assert seen == [[]]
    assert _journal(store) == ["a", "b"]


def test_candidate_changes_within_a_batch_read_as_they_will_commit(store: DuckDBStore) -> None:
    from engram_core.store.port import CandidateRow

    row = CandidateRow("cand_1", T, W, "agent", "a1", "s1", "pending", "sha256:p", "sha256:r", "asserted",
                       {"payload_bytes": 1}, b"sealed", 1, 1)

    def insert(tx: DuckDBTx) -> None:
        tx.insert_candidate(row)

    def accept(tx: DuckDBTx) -> str:
        assert tx.candidate(Scope(T, W), "cand_1").state == "pending"  # type: ignore[union-attr]
        tx.set_candidate_state("cand_1", "accepted", decision={"status": "accepted"}, drop_envelope=True)
        return tx.candidate(Scope(T, W), "cand_1").state  # type: ignore[union-attr]

    def look(tx: DuckDBTx) -> tuple[object, ...]:
        c = tx.candidate(Scope(T, W), "cand_1")
        return c.state, c.decision, c.sealed_envelope, tx.candidate(Scope("other", W), "cand_1")  # type: ignore[union-attr]

    results = _batch(store, [insert, accept, look])
    assert results[1] == "accepted"
    assert results[2] == ("accepted", {"status": "accepted"}, None, None)  # another tenant sees nothing
    with store.read() as tx:
        c = tx.candidate(Scope(T, W), "cand_1")
        assert (c.state, c.decision, c.sealed_envelope) == ("accepted", {"status": "accepted"}, None)  # type: ignore[union-attr]


def test_store_questions_from_other_threads_never_collide_with_the_writers_commit(store: DuckDBStore) -> None:
    """`engram serve` asked the store for its migration ledger on the writer's connection while the
    first calls committed on it: DuckDB refused one of them (the COMMIT then answered
    MUTATION_OUTCOME_UNKNOWN, or the start-up summary killed the server)."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            try:
                assert store.migration_ledger()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        for n in range(150):
            _event_alone(store, f"e{n}")
    except EngramError as exc:
        errors.append(exc)
    finally:
        stop.set()
        asker.join(10)
    assert errors == []
    assert len(_journal(store)) == 150


def _row(n: int) -> AuditRow:
    return AuditRow(at_ms=n, audit_id=f"aud_{n:024d}", tenant=T, workspace=W, principal="user:ana", agent_id="a1",
                    operation="engram_memory_search", outcome="ok", target_digest="", decisions=[])


def test_a_reads_audit_row_does_not_wait_for_the_writers_and_the_chain_stays_whole(store: DuckDBStore) -> None:
    """A read's audit row used to take the writer lock (and commit any open batch first): every
    search waited behind the writers. Now it waits only for a commit in progress, and the batch's
    rows take their places after it."""
    inside, release, spooled = threading.Event(), threading.Event(), threading.Event()

    def member() -> None:
        with store.write(batched=True) as tx:
            _event(tx, "w")
            tx.append_audit(_row(1))
            inside.set()
            release.wait(20)

    writer = threading.Thread(target=member)
    writer.start()
    assert inside.wait(10)
    reader = threading.Thread(target=lambda: (store.append_audit(_row(2)), spooled.set()))
    reader.start()
    assert spooled.wait(10), "the read's audit row waited for the writer"
    release.set()
    writer.join(10)
    reader.join(10)
    with store.read() as tx:  # a snapshot moves the spool into the table first
        rows = tx.audit_rows(None, 1, None)
        heads = tx.audit_heads()
    # The read's row is on this process's writer chain, the mutation's on its scope's chain.
    chains = {r["audit_id"]: r["chain"] for r in rows}
    assert chains == {_row(1).audit_id: scope_chain(T, W), _row(2).audit_id: store.writer_chain}
    assert check_audit(rows, heads) == []


def test_concurrent_reads_and_group_commits_keep_every_audit_chain_dense(store: DuckDBStore, tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def reads(k: int) -> None:
        try:
            for n in range(300):
                store.append_audit(_row(100_000 * (k + 1) + n))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def writes(k: int) -> None:
        try:
            for n in range(40):
                with store.write(batched=True) as tx:
                    _event(tx, f"w{k}-{n}")
                    tx.append_audit(_row(10 * k + n))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reads, args=(k,)) for k in range(2)]
    threads += [threading.Thread(target=writes, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    store.close()
    reopened = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    try:
        with reopened.read() as tx:
            rows = tx.audit_rows(None, 1, None)
            heads = tx.audit_heads()
        assert len(rows) == 2 * 300 + 4 * 40
        assert check_audit(rows, heads) == []
        assert {r["chain"] for r in rows} == {scope_chain(T, W), store.writer_chain}
    finally:
        reopened.close()


def test_a_failing_member_commits_the_batch_even_with_writers_queued(store: DuckDBStore) -> None:
    """A member that fails may have failed because of what the batch holds uncommitted (a
    family member admitted by an earlier member: POLICY_STALE), and its caller's retry decides
    again from committed state. So its failure commits the earlier members at once, writers
    queued or not: left open while writers queued, the batch made such retries fail against it
    again and again (a livelock seen under load: five admissions into one family, 250
    POLICY_STALE, one admitted)."""
    release, first_done = threading.Event(), threading.Event()
    seen_first_done: list[bool] = []
    threads: list[threading.Thread] = []

    def first() -> None:
        with store.write(batched=True) as tx:  # holds the writer lock until released
            _event(tx, "first")
            assert release.wait(20)
        first_done.set()

    def queued_after() -> None:
        with store.write(batched=True) as tx:
            # Holding the writer lock: the first member must have its answer meanwhile (if the
            # batch stayed open behind this writer it never would; the wait is for a loaded
            # machine's scheduler).
            seen_first_done.append(first_done.wait(15))
            _event(tx, "after")

    def failing() -> None:
        # The only writer waiting when the first member lets go, so it is the next to hold the
        # lock (the writer lock is not FIFO: two waiters could be served in either order); it
        # queues the next writer itself and fails only once that writer waits.
        with contextlib.suppress(EngramError), store.write(batched=True):
            threads.append(threading.Thread(target=queued_after))
            threads[-1].start()
            _wait_for(lambda: store.engine._waiting >= 1)
            raise EngramError(Code.POLICY_STALE, "decided on what the batch changed")

    threads.append(threading.Thread(target=first))
    threads[0].start()
    _wait_for(lambda: store.engine._waiting == 0 and store.engine._batch is not None)  # the first member is in
    failer = threading.Thread(target=failing)
    failer.start()
    _wait_for(lambda: store.engine._waiting >= 1)
    release.set()
    failer.join(20)
    for t in threads:
        t.join(20)
    assert seen_first_done == [True]
    assert _journal(store) == ["first", "after"]


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.001)
