"""Group commit on PostgreSQL (PostgresEngine._member): the batched writes of one scope on one
core share a transaction and a COMMIT, and a member that fails takes nothing of the others with
it. On a real cluster (tests/pg_cluster.py), through the store kernel as the services use it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import Database, wait_until
from store_checks import T, W, event
from store_targets import PostgresTarget

from engram_core.errors import Code, EngramError
from engram_core.services.maintenance import check_journal
from engram_core.store.port import IdempotencyRow

P = "user:ana"


@pytest.fixture
def target(tmp_path: Path, pg_database: Database) -> Iterator[PostgresTarget]:
    made = PostgresTarget(tmp_path, pg_database)
    yield made
    made.close_all()


def _queued(store: Any, n: int) -> bool:
    lane = store.engine._lanes.get((T, W))
    return lane is not None and lane.queued == n


def _members(store: Any, bodies: list[Callable[[Any], None]]) -> tuple[list[BaseException | None], list[int]]:
    """Run ``bodies`` as batched writes of one scope: the first holds its turn until all the
    others are queued behind it, so that they make one batch. Each one's error (or None), and
    the transactions each COMMIT carried."""
    commits: list[int] = []
    store.engine.on_commit = lambda seconds, transactions: commits.append(transactions)
    go = threading.Event()
    errors: list[BaseException | None] = [None] * len(bodies)

    def member(i: int) -> None:
        try:
            with store.write(batched=True, scope=(T, W)) as tx:
                if i == 0:
                    assert go.wait(30)
                bodies[i](tx)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[i] = exc

    first = threading.Thread(target=member, args=(0,))
    first.start()
    assert wait_until(lambda: _queued(store, 0) and store.engine._lanes[(T, W)].busy, 10)
    others = [threading.Thread(target=member, args=(i,)) for i in range(1, len(bodies))]
    for t in others:
        t.start()
    assert wait_until(lambda: _queued(store, len(bodies) - 1), 10)
    go.set()
    for t in [first, *others]:
        t.join(60)
    return errors, commits


def _journal_verifies(store: Any) -> None:
    with store.read() as tx:
        scope, events = tx.scope(T, W), tx.events(T, W, 0, None)
    assert scope is not None and check_journal(scope, events) == []


def _idem(tx: Any, key: str) -> None:
    tx.idempotency_put(T, W, P, key, IdempotencyRow("engram_memory_capture", key, "sha256:" + "0" * 64,
                                                    {"status": "committed_pending"}), 1)


def test_the_writes_of_one_scope_share_one_commit_and_keep_the_journal_dense(target: PostgresTarget) -> None:
    store = target.open()
    errors, commits = _members(store, [lambda tx, n=n: (event(tx, f"m{n}"), _idem(tx, f"k{n}")) for n in range(8)])
    assert errors == [None] * 8
    assert commits == [8]  # one COMMIT for the eight
    with store.read() as tx:
        events = tx.events(T, W, 0, None)
        assert sorted(e.target for e in events) == [f"m{n}" for n in range(8)]
        assert [e.cursor for e in events] == list(range(1, 9))
        assert all(tx.idempotency_get(T, W, P, f"k{n}") is not None for n in range(8))
    _journal_verifies(store)
    with store.write() as tx:  # and the scope's next write follows on
        assert event(tx, "after") == 9


def test_a_member_that_fails_is_undone_alone(target: PostgresTarget) -> None:
    store = target.open()

    def fails_after_writing(tx: Any) -> None:
        event(tx, "doomed")
        _idem(tx, "k-doomed")
        tx.idempotency_get(T, W, P, "k-doomed")  # its writes reach the server before it fails
        raise EngramError(Code.POLICY_STALE, "changed meanwhile")

    def refused_by_the_database(tx: Any) -> None:
        event(tx, "refused")
        _idem(tx, "k0")  # the first member's key: the primary key refuses it
        tx.idempotency_get(T, W, P, "k-probe")

    bodies: list[Callable[[Any], None]] = [
        lambda tx: (event(tx, "m0"), _idem(tx, "k0")),
        fails_after_writing,
        lambda tx: (event(tx, "m2"), _idem(tx, "k2")),
        refused_by_the_database,
        lambda tx: (event(tx, "m4"), _idem(tx, "k4")),
    ]
    errors, commits = _members(store, bodies)
    assert [type(e).__name__ if e else None for e in errors] == [None, "EngramError", None, "EngramError", None]
    assert errors[1].code == Code.POLICY_STALE  # type: ignore[union-attr]
    assert errors[3].code == Code.STORE_UNAVAILABLE  # type: ignore[union-attr]
    assert commits == [3]
    with store.read() as tx:
        events = tx.events(T, W, 0, None)
        # (members queued behind the first take their turns in any order)
        assert sorted(e.target for e in events) == ["m0", "m2", "m4"] and [e.cursor for e in events] == [1, 2, 3]
        assert tx.idempotency_get(T, W, P, "k-doomed") is None
    _journal_verifies(store)


def test_a_first_member_that_fails_leaves_the_batch_to_the_next(target: PostgresTarget) -> None:
    store = target.open()

    def first(tx: Any) -> None:
        event(tx, "first")
        raise EngramError(Code.POLICY_STALE, "no")

    errors, commits = _members(store, [first, lambda tx: event(tx, "second"), lambda tx: event(tx, "third")])
    assert errors[0] is not None and errors[1:] == [None, None]
    assert sum(commits) == 2  # the next member opened a batch of its own
    with store.read() as tx:
        assert sorted(e.target for e in tx.events(T, W, 0, None)) == ["second", "third"]


def test_a_batch_whose_commit_is_refused_answers_every_member(target: PostgresTarget) -> None:
    store = target.open()

    def duplicate_at_commit(tx: Any) -> None:
        event(tx, "m2")
        _idem(tx, "k-twice")
        _idem(tx, "k-twice")  # refused by the primary key only when sent: with the batch's COMMIT

    errors, commits = _members(store, [lambda tx: event(tx, "m0"), lambda tx: event(tx, "m1"), duplicate_at_commit])
    assert commits == []
    assert all(isinstance(e, EngramError) and e.code == Code.STORE_UNAVAILABLE for e in errors)
    with store.read() as tx:
        assert tx.events(T, W, 0, None) == []
    with store.write() as tx:
        assert event(tx, "next") == 1


def test_writes_of_another_scope_do_not_wait_for_a_batch(target: PostgresTarget) -> None:
    store = target.open()
    inside = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with store.write(batched=True, scope=(T, W)) as tx:
            event(tx, "held")
            inside.set()
            assert release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        with store.write(batched=True, scope=(T, "other")) as tx:
            event(tx, "elsewhere", workspace="other")
        assert time.monotonic() - started < 5
    finally:
        release.set()
        t.join(30)
    with store.read() as tx:
        assert [e.target for e in tx.events(T, W, 0, None)] == ["held"]
        assert [e.target for e in tx.events(T, "other", 0, None)] == ["elsewhere"]
