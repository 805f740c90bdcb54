"""What the PostgreSQL engine guarantees beyond the conformance suite, on a real cluster
(tests/support/pg_cluster.py): migrations under the advisory lock, the ledger refusing a newer database,
the scope lock (and that without it the guarantee breaks), round trips under the lock counted on
the wire, one effect per idempotency key across processes, commit outcomes, and surviving a
database restart, and group commit per scope (a failed member undone alone)."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.services.maintenance import check_journal
from engram_core.store.chain import scope_chain
from engram_core.store.conformance.support import T, W, audit_row, candidate, event
from engram_core.store.port import IdempotencyRow
from engram_core.store.postgres import engine as engine_module
from engram_core.store.postgres.engine import PostgresEngine, PostgresEngineTx
from engram_core.store.postgres.migrations import MIGRATIONS, Migration
from tests.support.pg_cluster import Database, PgCluster, wait_until
from tests.support.pg_race import idempotent_effects
from tests.support.pg_wire import RoundTripProxy
from tests.support.store_targets import PostgresTarget

P = "user:ana"


@pytest.fixture
def target(tmp_path: Path, pg_database: Database) -> Iterator[PostgresTarget]:
    made = PostgresTarget(tmp_path, pg_database)
    yield made
    made.close_all()


def ledger(db: Database) -> list[tuple[int, str]]:
    with db.connect() as con:
        return [(int(v), c) for v, c in con.execute("SELECT version, checksum FROM schema_migrations ORDER BY version")]


# -- migrations ----------------------------------------------------------------------------------------------------
def test_engines_racing_on_an_empty_database_apply_each_migration_once(pg_database: Database) -> None:
    engines: list[PostgresEngine] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        try:
            barrier.wait(30)
            engines.append(PostgresEngine(pg_database.conninfo, pool_size=1))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert errors == []
        applied = sorted(v for e in engines for v in e.migrations_applied_at_open)
        assert applied == [m.version for m in MIGRATIONS]  # each once, by one of the four
        assert ledger(pg_database) == [(m.version, m.checksum) for m in MIGRATIONS]
    finally:
        for e in engines:
            e.close()


def test_an_engine_older_than_the_ledger_refuses_to_open(pg_database: Database) -> None:
    newer = (*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "a newer engine's", "CREATE TABLE newer_thing (x INTEGER);"))
    PostgresEngine(pg_database.conninfo, migrations=newer, pool_size=1).close()
    with pytest.raises(EngramError) as refused:
        PostgresEngine(pg_database.conninfo, pool_size=1)
    assert refused.value.code == Code.MIGRATION_LEDGER_INVALID and "newer engine" in refused.value.detail
    PostgresEngine(pg_database.conninfo, migrations=newer, pool_size=1).close()  # the newer one still opens


def test_a_ledger_that_disagrees_with_the_code_is_refused(pg_database: Database) -> None:
    PostgresEngine(pg_database.conninfo, pool_size=1).close()
    with pytest.raises(EngramError) as pending:  # a migration the code has and the ledger lacks, not applied
        PostgresEngine(pg_database.conninfo, pool_size=1, migrate=False,
                       migrations=(*MIGRATIONS, Migration(len(MIGRATIONS) + 1, "pending", "SELECT 1;")))
    assert pending.value.code == Code.MIGRATION_LEDGER_INVALID
    with pg_database.connect() as con:
        con.execute("UPDATE schema_migrations SET checksum = 'sha256:other' WHERE version = 1")
    with pytest.raises(EngramError) as other:
        PostgresEngine(pg_database.conninfo, pool_size=1)
    assert other.value.code == Code.MIGRATION_LEDGER_INVALID and "does not match" in other.value.detail
    with pg_database.connect() as con:  # every later version recorded, with its checksum, but not 1
        con.execute("DELETE FROM schema_migrations WHERE version = 1")
    with pytest.raises(EngramError) as gap:
        PostgresEngine(pg_database.conninfo, pool_size=1)
    assert gap.value.code == Code.MIGRATION_LEDGER_INVALID and "gaps" in gap.value.detail


def test_a_password_in_the_connection_string_is_refused() -> None:
    with pytest.raises(ValueError, match="PGPASSFILE"):
        PostgresEngine("postgresql://engram:secret@127.0.0.1:1/engram")
    with pytest.raises(ValueError, match="PGPASSFILE"):
        PostgresEngine("host=127.0.0.1 port=1 dbname=engram password=secret")


# -- the scope lock --------------------------------------------------------------------------------------------------
class _UnlockedTx(PostgresEngineTx):
    """The engine with its scope lock taken out (the scope row read without FOR UPDATE): what the
    lock test must catch."""

    def _touch(self, scope: Scope) -> Any:
        lock = super()._touch(scope)
        for st in self._pending:
            st.sql = st.sql.replace(" FOR UPDATE", "")
        return lock


class _UnlockedEngine(PostgresEngine):
    tx_class = _UnlockedTx


def backends_waiting_on_a_lock(db: Database) -> int:
    with db.connect() as con:
        return int(con.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'engram-core' AND wait_event_type = 'Lock'").fetchone()[0])  # type: ignore[index]


def second_writer_waits(target: PostgresTarget) -> bool:
    """Core A holds a write transaction on the scope (its first statement made); core B starts one
    on the same scope. True when B waits on a lock until A commits (and then follows A's head);
    False when B got through while A held the scope."""
    a, b = target.open(), target.open()
    with a.write() as tx:
        event(tx, "setup")
    done = threading.Event()
    cursor: list[int] = []

    def second() -> None:
        with b.write() as tx2:
            cursor.append(event(tx2, "b"))
        done.set()

    held = a.write()
    tx = held.__enter__()
    try:
        event(tx, "a")
        t = threading.Thread(target=second)
        t.start()
        waited = wait_until(lambda: done.is_set() or backends_waiting_on_a_lock(target.database) > 0, 30)
        blocked = waited and not done.is_set()
        if blocked:
            assert not done.wait(0.5)  # still there while A holds the scope
    finally:
        try:
            held.__exit__(None, None, None)
        except EngramError:
            pass  # without the lock, A's commit collides with the cursor B took
    t.join(60)
    if blocked:
        assert cursor == [3]  # B allocated its cursor from the head A committed
    return blocked


def test_a_second_writer_of_a_scope_waits_for_the_first_to_commit(target: PostgresTarget) -> None:
    assert second_writer_waits(target)
    store = target.open()
    with store.read() as tx:
        scope, events = tx.scope(Scope(T, W)), tx.events(Scope(T, W), 0, None)
    assert [e.target for e in events] == ["setup", "a", "b"] and check_journal(scope, events) == []  # type: ignore[arg-type]


def test_without_for_update_the_second_writer_gets_through(tmp_path: Path, pg_database: Database) -> None:
    """The lock test is not vacuous: with the scope row read but not locked, B runs while A holds
    the scope, allocates the cursor A took, and A's commit fails on the journal's key."""
    broken = PostgresTarget(tmp_path, pg_database, engine_class=_UnlockedEngine)
    try:
        assert not second_writer_waits(broken)
    finally:
        broken.close_all()


def test_writers_of_different_scopes_do_not_wait_for_each_other(target: PostgresTarget) -> None:
    """No global lock: while A holds scope (acme, alpha), B commits in (globex, beta)."""
    a, b = target.open(), target.open()
    with a.write() as tx:
        event(tx, "a")
        with b.write() as other:
            assert event(other, "b", tenant="globex", workspace="beta") == 1
        with b.read() as snap:
            assert [e.target for e in snap.events(Scope("globex", "beta"), 0, None)] == ["b"]


# -- round trips under the scope lock ---------------------------------------------------------------------------------
@pytest.fixture
def proxied(tmp_path: Path, pg_database: Database) -> Iterator[tuple[Any, RoundTripProxy, RoundTripProxy]]:
    """A store whose engine (one connection) and key vault reach the database through proxies
    that count round trips."""
    from engram_core.store.kernel import StoreKernel
    from engram_core.store.postgres.keyvault import PgKeyVault

    PostgresEngine(pg_database.conninfo, pool_size=1).close()  # migrated, outside the count
    engine_wire, vault_wire = RoundTripProxy(pg_database.conninfo), RoundTripProxy(pg_database.conninfo)
    vault = PgKeyVault(vault_wire.conninfo, tmp_path, pool_size=1)
    store = StoreKernel(PostgresEngine(engine_wire.conninfo, pool_size=1), vault, spool_dir=None)
    store.vault = vault  # type: ignore[attr-defined]
    try:
        yield store, engine_wire, vault_wire
    finally:
        store.close()
        vault.close()
        engine_wire.close()
        vault_wire.close()


def capture_shaped(store: Any, n: int, *, grant: bool) -> tuple[int, int]:
    """A capture's write transaction as services/memory.py makes it (replay check, grant, event,
    candidate, data key, idempotency outcome, audit row); the round trips the engine and the vault
    made from its first statement to its COMMIT's answer."""
    engine_wire, vault_wire = store.wires
    slot, _ = store.vault.new_data_key(f"candidate:cand_rt{n}", durable=False)  # before the transaction
    engine_wire.reset()
    vault_wire.reset()
    key = f"key-rt-{n:04d}"
    with store.write(batched=True) as tx:
        assert tx.idempotency_get(Scope(T, W), P, key) is None
        if grant:
            assert tx.use_confirmation(f"grant-rt-{n}", Scope(T, W), 1)
        cursor = event(tx, f"cand_rt{n}")
        tx.insert_candidate(candidate(f"cand_rt{n}", cursor=cursor))
        tx.put_data_key(f"candidate:cand_rt{n}", slot, 1)
        tx.idempotency_put(Scope(T, W), P, key, IdempotencyRow("engram_memory_capture", f"cand_rt{n}", "sha256:" + "0" * 64,
                                                        {"status": "committed_pending"}), 1)
        tx.append_audit(audit_row(n))
    return engine_wire.round_trips, vault_wire.round_trips


def test_a_capture_holds_its_scope_lock_for_at_most_three_round_trips(proxied: Any) -> None:
    store, engine_wire, vault_wire = proxied
    store.wires = (engine_wire, vault_wire)
    # The scope's first capture (scope row and audit chain created), later ones, and ones with a grant.
    counts = [capture_shaped(store, n, grant=n % 2 == 1) for n in range(6)]
    assert all(v == 0 for _, v in counts)  # the vault has nothing to do while the scope is held
    engine = [e for e, _ in counts]
    assert max(engine) <= 3, engine
    # As the engine's docstring counts them: [lock + replay check], [grant], [writes + COMMIT].
    assert engine == [2, 3, 2, 3, 2, 3], engine
    with store.read() as tx:
        events = tx.events(Scope(T, W), 0, None)
        heads = tx.audit_heads()
    assert [e.cursor for e in events] == list(range(1, 7)) and heads[scope_chain(T, W)][0] == 6


def test_the_round_trip_count_sees_a_statement_that_waits_for_its_answer(proxied: Any) -> None:
    """The counter is not vacuous: each read inside the transaction is one more round trip."""
    store, engine_wire, _ = proxied
    engine_wire.reset()
    with store.write() as tx:
        for n in range(4):
            tx.idempotency_get(Scope(T, W), P, f"key-probe-{n}")
        event(tx, "probe")
    assert engine_wire.round_trips == 5


def test_reads_ahead_go_with_the_scope_lock_in_one_round_trip_and_answer_as_the_reads_would(proxied: Any) -> None:
    store, engine_wire, _ = proxied
    with store.write() as tx:
        event(tx, "ahead-0")
        tx.idempotency_put(Scope(T, W), P, "key-ahead-1", IdempotencyRow("engram_memory_capture", "c", "sha256:" + "1" * 64,
                                                                 {"status": "x"}), 1)
    engine_wire.reset()
    with store.write() as tx:
        keys = [f"key-ahead-{n}" for n in range(4)]
        tx.read_ahead(*[lambda k=k: tx.idempotency_get(Scope(T, W), P, k) for k in keys], lambda: tx.scope(Scope(T, W)))
        assert engine_wire.round_trips == 1  # the lock and the five reads
        got = [tx.idempotency_get(Scope(T, W), P, k) for k in keys]
        scope = tx.scope(Scope(T, W))
        assert engine_wire.round_trips == 1  # answered from what came back
        assert [g is not None for g in got] == [False, True, False, False] and got[1].outcome == {"status": "x"}
        assert scope is not None and scope.last_cursor == 1
        assert tx.idempotency_get(Scope(T, W), P, keys[1]) is not None  # asked again: read again
        assert engine_wire.round_trips == 2
        event(tx, "ahead-1")
    assert engine_wire.round_trips == 3  # with the COMMIT
    with store.write() as tx, pytest.raises(RuntimeError, match="for reads"):
        tx.read_ahead(lambda: event(tx, "ahead-2"))


def test_each_mutation_holds_its_scope_lock_for_at_most_three_round_trips(tmp_path: Path,
                                                                       pg_database: Database) -> None:
    """Capture, admission, withdrawal and forget as the services make them, through a core: each
    write transaction's round trips from its first statement (which takes the scope lock) to
    its COMMIT, as the engine counts them (the proxied tests above check that count on the wire)."""

    from engram_core.app.composition import start_core
    from tests.support.core_support import Client, activate

    counted: list[int] = []

    class Counted(PostgresEngineTx):
        def commit(self) -> None:
            super().commit()
            if self._writing:
                counted.append(self.round_trips)

    running = start_core(tmp_path / "core", store_url=pg_database.conninfo, semantic=False)
    try:
        running.core.store.engine.tx_class = Counted
        activate(running)
        c = Client(running)
        for _ in range(2):  # the scope's first writes and later ones
            counted.clear()
            cap = c.capture(f"We chose PostgreSQL for the shared store, take {len(counted)}-{time.monotonic()}")
            rid = c.admit(cap["candidate_id"])["outcome"]["record_id"]
            gone = c.capture(f"A candidate taken back {time.monotonic()}")
            c.call("withdraw", {"candidate_id": gone["candidate_id"], "idempotency_key": f"wd-{gone['candidate_id']}",
                                "reason_ref": "reason:changed-mind"}, grant=True)
            c.call("forget", {"record_id": rid, "idempotency_key": f"fg-{rid}", "reason_ref": "reason:asked"}, grant=True)
            # capture [lock + replay], [writes + COMMIT]; admission the same; withdrawal and forget
            # [lock + target + replay (+ derivatives)], [grant], [writes + COMMIT].
            assert counted == [2, 2, 2, 3, 3], counted
    finally:
        running.stop()


def test_a_context_claim_reads_the_trust_version_in_its_own_round_trip(proxied: Any) -> None:
    """What host-key trust across cores costs a call that spends its context: nothing more than its
    nonce claim (one round trip, as before); the calls that spend none read the version in one."""
    store, engine_wire, _ = proxied
    store.claim_context("k1:lane0:warm", 1_800_000_060_000)  # the pool's connection made, outside the count
    engine_wire.reset()
    claim = store.claim_context("k1:lane0:rt", 1_800_000_060_000)
    assert claim.claimed and claim.host_keys_version is not None
    assert engine_wire.round_trips == 1
    engine_wire.reset()
    assert store.host_keys_version() == claim.host_keys_version
    assert engine_wire.round_trips == 1


def test_a_context_claim_carries_the_calls_quota_read_and_held_back_adds(proxied: Any) -> None:
    """A call's quota counts on a shared store cost no round trip of their own: the claim's
    round trip sends the held-back adds and reads the buckets, and the counts it answers are
    those ``usage`` would answer (the adds included, read as they were before them)."""
    store, engine_wire, _ = proxied
    now = [1_800_000_000_000]
    counters, other_core = store.usage_counters(lambda: now[0]), store.usage_counters(lambda: now[0])
    store.claim_context("k1:lane0:qwarm", 1_800_000_060_000)  # the pool's connection made, outside the count
    for _ in range(3):
        counters.add(Scope(T, W), P, "searches")
    counters.add(Scope(T, W), "someone-else", "captures")
    engine_wire.reset()
    read = counters.begin_read(Scope(T, W), P)
    claim = store.claim_context("k1:lane0:quota", 1_800_000_060_000, usage=read)
    assert engine_wire.round_trips == 1
    assert claim.claimed and claim.usage is not None
    usage = counters.finish_read(read, claim.usage)
    assert usage["principal"]["minute"]["searches"] == 3 and usage["scope"]["minute"]["captures"] == 1
    assert usage == other_core.usage(Scope(T, W), P)  # the adds reached the database with the claim
    replay = store.claim_context("k1:lane0:quota", 1_800_000_060_000, usage=other_core.begin_read(Scope(T, W), P))
    assert not replay.claimed and replay.usage is not None


def test_a_claims_quota_adds_commit_in_a_transaction_of_their_own(proxied: Any, pg_database: Database) -> None:
    """The held-back adds ride on the claim's round trip but not in its transaction: the claim's
    is durable, and the scope's bucket rows must not stay locked through its WAL flush (two
    transactions: the rows carry different xmins)."""
    store, _, _ = proxied
    now = [1_800_000_000_000]
    counters = store.usage_counters(lambda: now[0])
    counters.add(Scope(T, W), P, "searches")
    claim = store.claim_context("k1:lane0:apart", 1_800_000_060_000, usage=counters.begin_read(Scope(T, W), P))
    assert claim.claimed
    with pg_database.connect() as con:
        claim_tx = con.execute("SELECT xmin::text FROM context_nonce_claims WHERE ref = %s",
                               ["k1:lane0:apart"]).fetchone()[0]  # type: ignore[index]
        bucket_txs = {r[0] for r in con.execute("SELECT xmin::text FROM usage_buckets WHERE metric = 'searches'")}
    assert bucket_txs and claim_tx not in bucket_txs


def test_usage_adds_lock_bucket_rows_in_one_order_whatever_order_they_were_counted_in(
        pg_database: Database) -> None:
    """Two adds that lock the same bucket rows in different orders deadlock, and PostgreSQL fails
    one of them (a call answered STORE_UNAVAILABLE). An add locks its rows in key order whatever
    order its caller counted them in: here another transaction holds the first row and then asks
    for the second, which an add counted first; the add must wait for the first row without
    holding the second."""
    engine = PostgresEngine(pg_database.conninfo, pool_size=2)
    try:
        first, second = ("user:a", "minute", 0, "m_a", 1), ("user:a", "minute", 0, "m_b", 1)
        engine.shared.add_usage([first, second])  # both rows exist
        failures: list[BaseException] = []

        def add_in_reverse() -> None:
            try:
                engine.shared.add_usage([second, first])
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        with pg_database.connect() as other:
            other.execute("SET lock_timeout = '5s'")
            other.execute("BEGIN")
            other.execute("UPDATE usage_buckets SET amount = amount WHERE metric = 'm_a'")
            adder = threading.Thread(target=add_in_reverse)
            adder.start()
            assert wait_until(lambda: other.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()").fetchone()[0] == 1, timeout=10)  # type: ignore[index]
            # In the counted order the add would hold m_b now, and this would deadlock with it.
            other.execute("UPDATE usage_buckets SET amount = amount WHERE metric = 'm_b'")
            other.execute("COMMIT")
            adder.join(timeout=10)
        assert not adder.is_alive() and failures == []
        with pg_database.connect() as con:
            amounts = dict(con.execute("SELECT metric, amount FROM usage_buckets").fetchall())
        assert amounts == {"m_a": 2, "m_b": 2}
    finally:
        engine.close()


# -- one effect per idempotency key, across processes ------------------------------------------------------------------
def test_two_cores_sending_the_same_key_at_once_have_one_effect_every_time(target: PostgresTarget,
                                                                          pg_cluster: PgCluster) -> None:
    rounds = 200
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=idempotent_effects, args=(target.database.conninfo, str(target.key_dir),
                                                          str(pg_cluster.passfile), name, rounds, barrier, results))
             for name in ("core-a", "core-b")]
    for p in procs:
        p.start()
    outcomes: dict[str, list[str]] = {}
    deadline = time.monotonic() + 300
    while len(outcomes) < len(procs) and time.monotonic() < deadline:
        try:
            name, outcome = results.get(timeout=1)
            outcomes[name] = outcome
        except queue.Empty:
            assert all(p.exitcode in (None, 0) for p in procs), [p.exitcode for p in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    a, b = outcomes["core-a"], outcomes["core-b"]
    for n in range(rounds):
        pair = sorted([a[n], b[n]])
        # Exactly one effect, and the other core replayed that core's outcome.
        assert pair in (["effect", "replay:core-a"], ["effect", "replay:core-b"]), (n, pair)
        assert (a[n] == "effect") == (b[n] == "replay:core-a")
    store = target.open()
    with store.read() as tx:
        events = tx.events(Scope(T, W), 0, None)
        scope = tx.scope(Scope(T, W))
    assert Counter(e.target for e in events) == {f"key-race-{n:04d}": 1 for n in range(rounds)}
    assert check_journal(scope, events) == []  # type: ignore[arg-type]
    # Both cores won some rounds: the race was a race, not one core always first.
    assert 0 < sum(x == "effect" for x in a) < rounds


# -- commit outcomes -----------------------------------------------------------------------------------------------------
def test_a_statement_refused_at_commit_is_a_definite_rollback(target: PostgresTarget) -> None:
    store = target.open()
    row = IdempotencyRow("engram_memory_capture", "cand_x", "sha256:" + "0" * 64, {"status": "committed_pending"})
    with pytest.raises(EngramError) as refused:
        with store.write() as tx:
            event(tx, "doomed")
            tx.idempotency_put(Scope(T, W), P, "key-twice", row, 1)
            tx.idempotency_put(Scope(T, W), P, "key-twice", row, 1)  # the primary key refuses it, at COMMIT
    assert refused.value.code == Code.STORE_UNAVAILABLE
    with store.read() as tx:
        assert tx.events(Scope(T, W), 0, None) == [] and tx.idempotency_get(Scope(T, W), P, "key-twice") is None
        assert tx.scope(Scope(T, W)) is None  # the scope row it created to lock is gone with it
    with store.write() as tx:
        assert event(tx, "next") == 1


def _slow_commit(db: Database, seconds: float) -> None:
    """Make COMMIT of a transaction that wrote a journal row take ``seconds`` (a deferred trigger)."""
    with db.connect() as con:
        con.execute(f"""
            CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON journal DEFERRABLE INITIALLY DEFERRED
              FOR EACH ROW EXECUTE FUNCTION slow_commit();""")


def test_a_connection_lost_during_commit_is_an_unknown_outcome_that_a_retry_settles(target: PostgresTarget) -> None:
    store = target.open()
    _slow_commit(target.database, 30)
    row = IdempotencyRow("engram_memory_capture", "cand_x", "sha256:" + "0" * 64, {"status": "committed_pending"})

    def kill_the_committer() -> None:
        def committing() -> bool:
            with target.database.connect() as con:
                return bool(con.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'engram-core' "
                    "AND query = 'COMMIT' AND state = 'active'").fetchone()[0])  # type: ignore[index]
        assert wait_until(committing, 30)
        with target.database.connect() as con:
            con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                        "'engram-core' AND query = 'COMMIT' AND state = 'active'")

    killer = threading.Thread(target=kill_the_committer)
    killer.start()
    with pytest.raises(EngramError) as unknown:
        with store.write() as tx:
            if tx.idempotency_get(Scope(T, W), P, "key-lost") is None:
                event(tx, "lost")
                tx.idempotency_put(Scope(T, W), P, "key-lost", row, 1)
    killer.join(60)
    assert unknown.value.code == Code.MUTATION_OUTCOME_UNKNOWN
    with target.database.connect() as con:
        con.execute("DROP TRIGGER slow_commit ON journal")
    # The retry with the same key decides: here the commit never happened, so it takes effect once.
    with store.write() as tx:
        assert tx.idempotency_get(Scope(T, W), P, "key-lost") is None
        assert event(tx, "retried") == 1
        tx.idempotency_put(Scope(T, W), P, "key-lost", row, 1)
    with store.read() as tx:
        assert [e.target for e in tx.events(Scope(T, W), 0, None)] == ["retried"]


def test_the_cores_carry_on_after_the_database_restarts(target: PostgresTarget, pg_cluster: PgCluster) -> None:
    """Pooled connections die with the server; the next calls find new ones (no core restart),
    including a transaction whose only round trip is its COMMIT (a standalone audit row)."""
    store = target.open()
    with store.write() as tx:
        event(tx, "before")
    pg_cluster.restart("immediate")  # a crash: recovery from the WAL
    store.append_audit(audit_row(1))  # a write transaction with no read: its COMMIT is its first round trip
    with store.write() as tx:
        event(tx, "after")
    with store.read() as tx:
        assert [e.target for e in tx.events(Scope(T, W), 0, None)] == ["before", "after"]
        assert len(tx.audit_rows(None, 0, None)) == 1


def test_a_scope_only_looked_at_is_not_created(target: PostgresTarget) -> None:
    """Locking a scope never written inserts its row to lock it; the row goes with the commit, so
    (as on DuckDB) a scope exists once something was written to it."""
    store = target.open()
    with store.write() as tx:
        assert tx.scope(Scope(T, W)) is None
        assert tx.idempotency_get(Scope(T, W), P, "key-none") is None
        tx.set_meta("looked", "yes")
    with store.read() as tx:
        assert tx.scope(Scope(T, W)) is None and tx.scopes() == [] and tx.meta("looked") == "yes"
    with pg_database_connect(target) as con:
        assert con.execute("SELECT count(*) FROM scopes").fetchone()[0] == 0  # type: ignore[index]


def pg_database_connect(target: PostgresTarget) -> psycopg.Connection:
    return target.database.connect()


# -- the start-up summary on a large store ----------------------------------------------------------------------------
def test_the_start_up_summary_counts_a_large_table_by_its_estimate_not_a_scan(proxied: Any, pg_database: Database,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import engram_core.store.postgres.engine as pg_engine

    store, _, _ = proxied
    for n in range(12):
        store.append_audit(audit_row(100 + n))
    exact = store.engine.describe()
    assert exact["audit_rows"] == 12 and isinstance(exact["records"], dict)
    with pg_database.connect() as con:
        con.execute("ANALYZE audit")
    monkeypatch.setattr(pg_engine, "EXACT_COUNTS_UP_TO", 10)
    estimated = store.engine.describe()
    assert estimated["audit_rows"] == "~12"
    assert estimated["records"] == {} and estimated["scopes"] == exact["scopes"]  # small tables: still exact


# -- usage counters every core adds to ------------------------------------------------------------------------------------
def test_usage_counts_are_one_count_across_cores_and_a_cores_adds_ride_on_its_next_read(
        proxied: Any, pg_database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cores' counters over one database (usage_counters.QuotaCounters, shared): a core reads
    its own adds at once, sent with that read (one round trip for both); another core sees them
    once they were sent, by a read or at the latest FLUSH_AFTER_S later."""
    import engram_core.store.usage_counters as usage_counters
    from engram_core.store.usage_counters import FLUSH_AFTER_S, QuotaCounters

    store, engine_wire, _ = proxied
    # A's flusher must not send the adds on its own before A's read (a loaded machine may take
    # longer than the interval between the adds and the read): A's adds ride on that read here.
    monkeypatch.setattr(usage_counters, "FLUSH_AFTER_S", 600.0)
    now = [1_800_000_000_000]
    other = PostgresEngine(pg_database.conninfo, pool_size=1)
    try:
        a = QuotaCounters(lambda: now[0], shared=store.engine.shared)
        b = QuotaCounters(lambda: now[0], shared=other.shared)
        a.usage(Scope(T, W), P)  # the connection made, outside the count
        for _ in range(3):
            a.add(Scope(T, W), P, "searches")
        engine_wire.reset()
        seen = a.usage(Scope(T, W), P)
        assert engine_wire.round_trips == 1  # the three adds and the read, one statement
        assert seen["principal"]["minute"]["searches"] == 3 and seen["scope"]["hour"]["searches"] == 3  # type: ignore[index]
        assert b.usage(Scope(T, W), P)["principal"]["minute"]["searches"] == 3  # type: ignore[index]
        monkeypatch.setattr(usage_counters, "FLUSH_AFTER_S", FLUSH_AFTER_S)  # B's flusher starts with its add
        b.add(Scope(T, W), "user:bo", "gets")  # B's add, no read of B's after it: its flusher sends it
        assert wait_until(lambda: a.usage(Scope(T, W), P)["scope"]["minute"]["gets"] == 1, timeout=10 * FLUSH_AFTER_S + 5)  # type: ignore[index]
        assert a.usage(Scope(T, W), P)["principal"]["minute"]["gets"] == 0  # type: ignore[index]  (bo's, not ana's)
        now[0] += 61_000  # the minute window moves past them; the hour keeps them
        later = b.usage(Scope(T, W), P)
        assert later["principal"]["minute"]["searches"] == 0 and later["principal"]["hour"]["searches"] == 3  # type: ignore[index]
    finally:
        other.close()


def test_a_read_waits_for_the_adds_its_flusher_is_still_sending(
        proxied: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core's flusher took its held-back adds and is sending them when a read of the same
    core begins: the read must count them (it finds them neither held back nor, until that
    round trip commits, in the database). Seen in a full run under load: a principal's fourth
    capture admitted under a limit of three. The real shared usage of the store, its add round
    trip held open until the read has begun."""
    import engram_core.store.usage_counters as usage_counters
    from engram_core.store.usage_counters import QuotaCounters

    store, _, _ = proxied
    real = store.engine.shared
    sending, release = threading.Event(), threading.Event()

    class HeldAdds:
        def add_usage(self, rows: list[Any]) -> None:
            sending.set()
            assert release.wait(10)
            real.add_usage(rows)

        def usage_buckets(self, wanted: Any, *, adding: Any = ()) -> Any:
            return real.usage_buckets(wanted, adding=adding)

    monkeypatch.setattr(usage_counters, "FLUSH_AFTER_S", 0.0)
    counters = QuotaCounters(lambda: 1_800_000_000_000, shared=HeldAdds())
    for _ in range(3):
        counters.add(Scope(T, W), P, "captures")
    assert sending.wait(10)  # the flusher holds the three adds, its round trip not committed
    seen: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: seen.update(counters.usage(Scope(T, W), P)))
    reader.start()
    time.sleep(0.3)  # the read, begun, would have answered by now had it not waited
    release.set()
    reader.join(10)
    assert seen["principal"]["minute"]["captures"] == 3


# -- group commit per scope (PostgresEngine._member) --------------------------------------------------------------------
# The batched writes of one scope on one core share a transaction and a COMMIT, and a member that
# fails takes nothing of the others with it; through the store kernel as the services use it.
def _queued(store: Any, n: int) -> bool:
    lane = store.engine._lanes.get(Scope(T, W))
    return lane is not None and lane.queued == n


def _members(store: Any, bodies: list[Callable[[Any], None]]) -> tuple[list[BaseException | None], list[int]]:
    """Run ``bodies`` as batched writes of one scope: the first holds its turn until all the
    others are queued behind it, so that they make one batch. Each one's error (or None), and
    the transactions each COMMIT carried."""
    commits: list[int] = []
    store.engine.observers.on_commit = lambda seconds, transactions: commits.append(transactions)
    go = threading.Event()
    errors: list[BaseException | None] = [None] * len(bodies)

    def member(i: int) -> None:
        try:
            with store.write(batched=True, scope=Scope(T, W)) as tx:
                if i == 0:
                    assert go.wait(30)
                bodies[i](tx)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors[i] = exc

    first = threading.Thread(target=member, args=(0,))
    first.start()
    assert wait_until(lambda: _queued(store, 0) and store.engine._lanes[Scope(T, W)].busy, 10)
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
        scope, events = tx.scope(Scope(T, W)), tx.events(Scope(T, W), 0, None)
    assert scope is not None and check_journal(scope, events) == []


def _idem(tx: Any, key: str) -> None:
    tx.idempotency_put(Scope(T, W), P, key, IdempotencyRow("engram_memory_capture", key, "sha256:" + "0" * 64,
                                                    {"status": "committed_pending"}), 1)


def test_the_writes_of_one_scope_share_one_commit_and_keep_the_journal_dense(target: PostgresTarget) -> None:
    store = target.open()
    errors, commits = _members(store, [lambda tx, n=n: (event(tx, f"m{n}"), _idem(tx, f"k{n}")) for n in range(8)])
    assert errors == [None] * 8
    assert commits == [8]  # one COMMIT for the eight
    with store.read() as tx:
        events = tx.events(Scope(T, W), 0, None)
        assert sorted(e.target for e in events) == [f"m{n}" for n in range(8)]
        assert [e.cursor for e in events] == list(range(1, 9))
        assert all(tx.idempotency_get(Scope(T, W), P, f"k{n}") is not None for n in range(8))
    _journal_verifies(store)
    with store.write() as tx:  # and the scope's next write follows on
        assert event(tx, "after") == 9


def test_a_member_that_fails_is_undone_alone(target: PostgresTarget) -> None:
    store = target.open()

    def fails_after_writing(tx: Any) -> None:
        event(tx, "doomed")
        _idem(tx, "k-doomed")
        tx.idempotency_get(Scope(T, W), P, "k-doomed")  # its writes reach the server before it fails
        raise EngramError(Code.POLICY_STALE, "changed meanwhile")

    def refused_by_the_database(tx: Any) -> None:
        event(tx, "refused")
        _idem(tx, "k0")  # the first member's key: the primary key refuses it
        tx.idempotency_get(Scope(T, W), P, "k-probe")

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
        events = tx.events(Scope(T, W), 0, None)
        # (members queued behind the first take their turns in any order)
        assert sorted(e.target for e in events) == ["m0", "m2", "m4"] and [e.cursor for e in events] == [1, 2, 3]
        assert tx.idempotency_get(Scope(T, W), P, "k-doomed") is None
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
        assert sorted(e.target for e in tx.events(Scope(T, W), 0, None)) == ["second", "third"]


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
        assert tx.events(Scope(T, W), 0, None) == []
    with store.write() as tx:
        assert event(tx, "next") == 1


def test_writes_of_another_scope_do_not_wait_for_a_batch(target: PostgresTarget) -> None:
    store = target.open()
    inside = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with store.write(batched=True, scope=Scope(T, W)) as tx:
            event(tx, "held")
            inside.set()
            assert release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        with store.write(batched=True, scope=Scope(T, "other")) as tx:
            event(tx, "elsewhere", workspace="other")
        assert time.monotonic() - started < 5
    finally:
        release.set()
        t.join(30)
    with store.read() as tx:
        assert [e.target for e in tx.events(Scope(T, W), 0, None)] == ["held"]
        assert [e.target for e in tx.events(Scope(T, "other"), 0, None)] == ["elsewhere"]


# -- plans -------------------------------------------------------------------------------------------------------
# A statement psycopg has run a few times on a connection is prepared, and the server may then keep a
# generic plan, chosen without the parameters' values. For a read by key within a scope such a plan
# could take a (tenant, workspace, ...) index and filter the whole scope: it did for the catch-up's
# records (1.3 ms at 5,000 records, growing with the scope, against 0.1 through the key).
E = engine_module
TOP = E.MAX_BIGINT
BY_KEY: dict[str, tuple[str, list[Any], dict[str, str]]] = {
    "record": (E._RECORD_BY_ID, ["mem_000007", T, W], {"records": "records_pkey"}),
    "records": (E._RECORDS_BY_ID, [["mem_000007", "mem_000011"], T, W], {"records": "records_pkey"}),
    "candidate": (E._CANDIDATE_BY_ID, ["cand_000007", T, W], {"candidates": "candidates_pkey"}),
    "events between": (E._EVENTS_BETWEEN, [T, W, 19_990, TOP], {"journal": "journal_pkey"}),
    "event by id": (E._EVENT_BY_ID, [T, W, "evt_000007"], {"journal": "journal_event_id"}),
    "events with records": (E._EVENTS_WITH_RECORDS, [T, W, 19_990, TOP],
                        {"journal": "journal_pkey", "records": "records_pkey", "projections": "projections_pkey",
                         "vault_keys": "vault_keys_pkey"}),
    # The joins below are checked with statistics only: without them the planner estimates one row
    # for every condition and may read them through a scope's index; autovacuum gives a table
    # statistics within a minute of its growth, and a restore (so a migrate-store) ends with ANALYZE.
    "payload standing": (E._PAYLOAD_STANDING, [T, W, "p7"] * 2, {"records": "records_payload",
                                                                 "tombstones": "tombstones_pkey"}),
    "family members": (E._FAMILY_MEMBERS, [T, W, ["fam_7"], ["accepted_current"], T, W],
                       {"record_families": "record_families_pkey", "records": "records_pkey"}),
    "derivatives": (E._DERIVATIVES, [T, W, "mem_000007", T, W],
                    {"record_sources": "record_sources_pkey", "records": "records_pkey"}),
}

ANALYZED_ONLY = {"payload standing", "family members", "derivatives"}


def _fill(con: psycopg.Connection, n: int) -> None:
    """``n`` rows of each kind in the scope and as many in another (the plans, not the content,
    are under test: rows are written directly)."""
    for tenant, workspace, prefix in ((T, W, ""), ("globex", "beta", "o")):
        con.execute("INSERT INTO scopes VALUES (%s, %s, true, '[]', 0, %s, '')", [tenant, workspace, n])
        con.execute("INSERT INTO journal SELECT %s, %s, i, %s || 'evt_' || lpad(i::text, 6, '0'), 'admit', "
                    "%s || 'mem_' || lpad(i::text, 6, '0'), '', 'accepted_current', i, "
                    "'{\"record_id\": \"' || %s || 'mem_' || lpad(i::text, 6, '0') || '\"}', '', '' "
                    "FROM generate_series(1, %s) i", [tenant, workspace, prefix, prefix, prefix, n])
        con.execute("INSERT INTO vault_keys (owner, version, generation, wrapped) SELECT 'record:' || %s || 'mem_' "
                    "|| lpad(i::text, 6, '0'), 1, 1, '\\x00' FROM generate_series(1, %s) i", [prefix, n])
        con.execute(f"INSERT INTO records ({E.RECORD_COLS}) SELECT %s || 'mem_' || lpad(i::text, 6, '0'), %s, %s, "
                    "'cand', 'd', 'p' || i, 'accepted_current', 'asserted', 'p', 'a', 1, NULL, NULL, 'r', 1, i, i, "
                    "NULL, '\\x00', i, 's', 1 FROM generate_series(1, %s) i", [prefix, tenant, workspace, n])
        con.execute("INSERT INTO projections SELECT %s || 'mem_' || lpad(i::text, 6, '0'), %s, %s, '\\x00' "
                    "FROM generate_series(1, %s) i", [prefix, tenant, workspace, n])
        con.execute("INSERT INTO record_families SELECT %s, %s, 'fam_' || (i %% 1000), %s || 'mem_' || "
                    "lpad(i::text, 6, '0'), 'fact' FROM generate_series(1, %s) i", [tenant, workspace, prefix, n])
        con.execute("INSERT INTO record_sources SELECT %s, %s, %s || 'mem_' || lpad((i / 2 + 1)::text, 6, '0'), "
                    "%s || 'mem_' || lpad(i::text, 6, '0') FROM generate_series(1, %s) i",
                    [tenant, workspace, prefix, prefix, n])
        con.execute("INSERT INTO tombstones SELECT %s, %s, 'gone' || i, %s || 'mem_gone' || i, i, i "
                    "FROM generate_series(1, %s) i", [tenant, workspace, prefix, n])
        con.execute(f"INSERT INTO candidates ({E._CANDIDATE_COLS}) SELECT %s || 'cand_' || lpad(i::text, 6, '0'), "
                    "%s, %s, 'p', 'a', 's', 'pending', 'p', 'd', 'asserted', '{}', NULL, 1, i, NULL, NULL "
                    "FROM generate_series(1, %s) i", [prefix, tenant, workspace, n])


def generic_plan(con: psycopg.Connection, name: str, sql: str, params: list[Any]) -> str:
    """The plan the server keeps for ``sql`` once it stops planning per call (forced here)."""
    con.execute("SET plan_cache_mode = force_generic_plan")
    parts = sql.split("%s")
    assert len(parts) == len(params) + 1
    con.execute(f"PREPARE {name} AS " + "".join(p + (f"${i + 1}" if i < len(params) else "")
                                          for i, p in enumerate(parts)).replace("%%", "%"))
    literals = [con.execute("SELECT quote_literal(%s::text)", [p if not isinstance(p, list) else
                                                               "{" + ",".join(p) + "}"]).fetchone()[0]
                for p in params]
    return "\n".join(r[0] for r in con.execute(f"EXPLAIN EXECUTE {name}({', '.join(literals)})"))


def scans(plan: str) -> list[tuple[str, str | None]]:
    """(table, index or None for a sequential scan) of every scan of a table in ``plan``."""
    found: list[tuple[str, str | None]] = []
    heap = ""
    for line in plan.splitlines():
        words = line.replace("->", "").split()
        if "Seq Scan on" in line:
            found.append((words[words.index("on") + 1], None))
        elif "Bitmap Heap Scan on" in line:
            heap = words[words.index("on") + 1]
        elif "Bitmap Index Scan on" in line:
            found.append((heap, words[words.index("on") + 1]))
        elif "Scan using" in line:
            found.append((words[words.index("on") + 1], words[words.index("using") + 1]))
    return found


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "analyzed"])
def test_reads_by_key_within_a_scope_keep_to_their_index_in_a_generic_plan(pg_database: Database,
                                                                          analyzed: bool) -> None:
    PostgresEngine(pg_database.conninfo, pool_size=1).close()  # the schema
    with pg_database.connect(prepare_threshold=None) as con:
        _fill(con, 20_000)
        if analyzed:
            con.execute("ANALYZE")
        for n, (name, (sql, params, indexes)) in enumerate(BY_KEY.items()):
            if name in ANALYZED_ONLY and not analyzed:
                continue
            plan = generic_plan(con, f"q{n}", sql, params)
            used = [(table, index) for table, index in scans(plan) if table in indexes]
            assert {table for table, _ in used} == set(indexes), (name, plan)
            assert all(index == indexes[table] for table, index in used), (name, plan)


def test_a_cores_sessions_keep_generic_plans_for_the_statements_they_prepare(target: PostgresTarget) -> None:
    """What the plans above are checked under is what the core runs with: planning the catch-up's
    statement per call cost 0.3 ms of a 0.6 ms read with nothing new (2026-12-05)."""
    store = target.open()
    conn = store.engine.getconn()
    try:
        assert conn.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
    finally:
        store.engine.putconn(conn)
