"""The PostgreSQL engine (SPEC §10): several cores over one database, any core serving any scope.

The engine gives the guarantees of ``engram_core/store/engine.py`` with other processes writing
the same database (``sole_writer`` False), so it keeps no copy of anything another process can
change: scope rows, audit chain heads, idempotency keys, grants, payload digests and record
links are read from the database inside each transaction. Its transaction is ``tx.py`` (its own
statements ``statements.py``); the SQL it shares with DuckDB, ``engram_core/store/sql/``.

## Isolation and locking: READ COMMITTED, the scope row locked at first touch

A write transaction runs at READ COMMITTED. Its first statement about a scope ``(tenant,
workspace)`` is preceded, in the same round trip, by ``INSERT INTO scopes ... ON CONFLICT DO
NOTHING`` and ``SELECT ... FOR UPDATE`` of that scope's row, so from then until COMMIT no other
transaction, in this process or another, changes the scope: every other writer of the scope
queues on the row lock. Each statement of READ COMMITTED reads the latest committed state when
it starts, so everything read after the lock (an idempotency key absent, a lifecycle state, a
grant unused, the journal head) still holds at COMMIT; the journal head comes from the locked
row itself, so each scope's cursors stay dense and its chain unforked.

Why not SERIALIZABLE: measured on this 2-core machine, READ COMMITTED with ``FOR UPDATE`` on the
scope row gave 877 transactions/s on one hot scope and 2,879/s spread over scopes, against 412/s
for SERIALIZABLE with 6,690 serialization failures to retry. Transactions here are short and
always about one known scope, which is the case a row lock serves exactly, while SERIALIZABLE's
predicate tracking aborts and re-runs whole mutations (each re-run re-decides policy). What
READ COMMITTED alone would not give (two writers reading the same head) the row lock gives;
unique constraints (idempotency keys, used grants, tombstones, journal cursors, audit seqs)
stay the last arbiters: a second insert of a key never commits, whatever a caller checked.

A scope row that a transaction created only to lock it (a write transaction that looked at a
scope never written) is deleted again before COMMIT, so, as on DuckDB, a scope exists once
something was written to it. Statements that name only an id (a record's or candidate's state)
come after the transaction read that row through its scope in every service; for one that did
not, the engine locks the row's scope in the same round trip as the write.

Audit chains: each chain's head is a row of ``audit_heads``, locked ``FOR UPDATE`` by the
transaction that extends the chain; the head of a scope's chain is locked together with the
scope row (same round trip), so a mutation's audit row costs no round trip of its own.

## Round trips under a scope lock

Writes are buffered and sent, with the COMMIT, in one pipeline (psycopg's
``Connection.pipeline()``); a read sends the buffered writes before it in the same pipeline
(so it sees them: no overlay to keep), and the lock statements travel with the first statement
about the scope. A capture is then two round trips under its scope lock (three with a grant to
consume): ``[BEGIN, lock scope, lock audit head, read idempotency key]``, ``[insert event, move
head, insert candidate, data key, idempotency outcome, audit row, audit head, COMMIT]``
(tests/store/test_postgres_engine.py counts them on the wire). Every read a service makes inside
the transaction is one more, unless it was read ahead (``read_ahead``): the services name the
reads they make before their first write (target, replay check, payload standing, a forget's
derivatives), and those go with the lock statements in the first round trip. An admission is
then two (``[lock, target, replay check, payload standing]``, ``[writes, COMMIT]``), a withdrawal
and a forget three (their grant's insert-if-absent between: an insert is not read ahead). A long transaction's buffer is sent early once it
holds ``FLUSH_STATEMENTS`` statements or has not reached the server for ``FLUSH_IDLE_S`` (so the
server's idle-in-transaction timeout, which frees the locks of a core that died mid-transaction,
never fires on a live one).

## Commit outcome

A statement's error before COMMIT (the server answered, the connection is fine) rolled back
everything: STORE_UNAVAILABLE, retriable. A connection lost (or a fatal error) while the
pipeline holding COMMIT was in flight leaves the outcome unknown: MUTATION_OUTCOME_UNKNOWN, and
a retry with the same idempotency key gets the definitive answer (SPEC §7).

## Reads

``read(snapshot=True)`` is a ``REPEATABLE READ READ ONLY`` transaction (one snapshot from its
first statement to its end); ``read(snapshot=False)`` runs each statement on its own in
autocommit (the latest committed state). Neither takes a connection until its first statement,
so a search that reads only the in-memory index costs the pool nothing.

## Connections

A bounded ``psycopg_pool.ConnectionPool`` (``pool_size``): a replica needs at most one
connection per gRPC worker thread running a transaction, plus a few for the index build, the
audit mover and maintenance: connections per replica at most its gRPC workers + 4 (the default,
20, is ``engram serve``'s 16 workers + 4; the key vault has a pool of its own, 4 by default, used
outside the engine's transactions, and leader leases one session of their own, ``leases.py``). A
replica never holds more, and a caller waiting longer than ``pool_timeout_s`` for one is refused,
STORE_UNAVAILABLE. A connection idle for ``IDLE_CHECK_S``,
or one the server wrote to while idle (it closed it), is checked before use (one empty query), so
a database restarted meanwhile costs no caller an error. The engine opens from a libpq connection
string or service name; a password in it is refused (``PGPASSFILE`` or the libpq environment
carry it, never a command line or a string that ends up in a process listing or a log).

``checkpoint()`` is a no-op: PostgreSQL keeps deleted rows (dead tuples, the WAL, dumps)
whatever a CHECKPOINT does, which is why only sealed bytes and wrapped keys ever reach it and a
forget shreds by destroying keys (SPEC §10), not by rewriting pages.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import WrappedKey
from engram_core.observability import tracing
from engram_core.store.engine import CommitHooks, EngineCapabilities, ScopeChanges, StoreObservers, TxEffects
from engram_core.store.port import (
    Event,
    RecordRow,
    ScopeRow,
)
from engram_core.store.postgres.leases import LeaderLeases
from engram_core.store.postgres.migrations import MIGRATION_LOCK, MIGRATIONS, Migration, run_migrations
from engram_core.store.postgres.pool import Pool, failure
from engram_core.store.postgres.shared_state import PgSharedState
from engram_core.store.postgres.statements import (
    CANDIDATE_BY_ID,
    DERIVATIVES,
    EVENT_BY_ID,
    EVENT_WIDTH,
    EVENTS_BETWEEN,
    EVENTS_WITH_RECORDS,
    FAMILY_MEMBERS,
    MAX_BIGINT,
    PAYLOAD_STANDING,
    RECORD_BY_ID,
    RECORD_COLS_R,
    RECORDS_BY_ID,
    Statement,
    unflushed,
)
from engram_core.store.postgres.tx import SCHEMA_VERSION, PostgresEngineTx
from engram_core.store.sql.codecs import (
    CANDIDATE_COLS,
    RECORD_COLS,
    RECORD_WIDTH,
    SCOPE_COLS,
    event_of,
    record_of,
    scope_of,
)
from engram_core.store.sql.hooks import HeldHooks

# The engine and its transaction; and the statements test_postgres_engine.py checks the plans of.
__all__ = ["EXACT_COUNTS_UP_TO", "MAX_BIGINT", "RECORD_COLS", "SCHEMA_VERSION", "PostgresEngine", "PostgresEngineTx"]
# The statements test_postgres_engine.py checks the plans of, by their names before the split.
_CANDIDATE_BY_ID, _CANDIDATE_COLS, _DERIVATIVES, _EVENT_BY_ID = CANDIDATE_BY_ID, CANDIDATE_COLS, DERIVATIVES, EVENT_BY_ID
_EVENTS_BETWEEN, _EVENTS_WITH_RECORDS, _FAMILY_MEMBERS = EVENTS_BETWEEN, EVENTS_WITH_RECORDS, FAMILY_MEMBERS
_PAYLOAD_STANDING, _RECORD_BY_ID, _RECORDS_BY_ID = PAYLOAD_STANDING, RECORD_BY_ID, RECORDS_BY_ID
OPEN_CHUNK = 4096  # rows fetched per round trip while the search index is built
BATCH_MEMBERS = 32  # a scope's batch commits at this size even with members queued (bounds latency)
EXACT_COUNTS_UP_TO = 1_000_000  # rows (planner estimate) up to which the start-up summary counts exactly
log = logging.getLogger(__name__)


class _IndexScan:
    """What the search index is built from, streamed through server-side cursors of one
    REPEATABLE READ snapshot (``OPEN_CHUNK`` rows a round trip)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def _stream(self, name: str, sql: str) -> Iterator[tuple[Any, ...]]:
        self._conn.execute(f"DECLARE {name} NO SCROLL CURSOR FOR {sql}")
        try:
            while rows := self._conn.execute(f"FETCH {OPEN_CHUNK} FROM {name}").fetchall():
                yield from rows
        finally:
            self._conn.execute(f"CLOSE {name}")

    def indexed_rows(self) -> Iterator[tuple[Any, ...]]:
        # Document order (``doc``): within a scope the order records were admitted in, which the
        # index's local document numbers and neighbourhoods follow.
        return self._stream("engram_index_rows", f"SELECT {RECORD_COLS_R} FROM records r WHERE EXISTS "
                            "(SELECT 1 FROM projections p WHERE p.record_id = r.record_id) ORDER BY r.doc")

    def projection_blobs(self) -> Iterator[tuple[str, bytes]]:
        return self._stream("engram_index_blobs", "SELECT record_id, sealed FROM projections")  # type: ignore[return-value]

    def scopes(self) -> dict[tuple[str, str], ScopeRow]:
        return {(r[0], r[1]): scope_of(r) for r in self._conn.execute(f"SELECT {SCOPE_COLS} FROM scopes").fetchall()}


@dataclass
class _Batch:
    """One scope's open group commit on this core: its transaction and the members in it."""

    tx: PostgresEngineTx
    members: list[TxEffects] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass
class _Lane:
    """One scope's batched writers on this core: one at a time is ``busy``; ``queued`` wait for
    their turn on ``turns`` (a condition on the engine's lanes lock)."""

    scope: Scope
    turns: threading.Condition
    busy: bool = False
    queued: int = 0
    batch: _Batch | None = None


class PostgresEngine(HeldHooks):
    """The PostgreSQL engine (``engine.Engine``): a pool of connections to one database.

    ``conninfo``: a libpq connection string, URL (``postgresql://user@host:port/db``) or
    ``service=NAME``; no password in it (``PGPASSFILE``). ``pool_size``: connections at most
    (see the module docstring). ``migrate``: apply pending migrations (else a pending one is
    MIGRATION_LEDGER_INVALID). ``migrations``: the code's migrations (tests give a newer list).
    ``idle_in_transaction_timeout_s``: the server ends a session that holds a transaction open
    without a statement this long (a core that died mid-transaction frees its scope locks);
    ``lock_timeout_s``: a writer waiting this long for a scope is refused (STORE_UNAVAILABLE)."""

    # Other cores write the same database: no audit spool (a read's row goes to the database at
    # once, every core's rows in one place), and each scope's index is loaded on its first read
    # (every read checks the scope's head anyway). A destroyed key's KEK generation is read from
    # vault_keys in the destroying transaction, after its data_keys row is deleted (which holds off
    # a concurrent re-wrap: keyvault.PgKeyVault.rewrap); the vault's rows are in this database.
    capabilities = EngineCapabilities(sole_writer=False, spools_audit=False, lazy_scopes=True,
                                      records_key_generations=True, holds_key_vault=True)
    tx_class: type[PostgresEngineTx] = PostgresEngineTx  # (tests put a deliberately broken one here)

    def __init__(self, conninfo: str, *, pool_size: int = 20, migrate: bool = True,
                 migrations: tuple[Migration, ...] = MIGRATIONS, connect_timeout_s: float = 30.0,
                 pool_timeout_s: float = 30.0, idle_in_transaction_timeout_s: float = 60.0,
                 lock_timeout_s: float = 30.0) -> None:
        self._migrations = migrations
        self._hooks: CommitHooks | None = None
        # Observability (``StoreObservers``): seconds per COMMIT round trip, transactions (1);
        # (seconds waited for a write transaction's first scope lock, seconds it was held until
        # COMMIT or ROLLBACK returned), once per write transaction that locked a scope.
        self.observers = StoreObservers()
        self.shared = PgSharedState(self)  # nonce claims, trust version, leases, pins, usage
        self._lanes: dict[Scope, _Lane] = {}  # group commit, per scope (``_member``)
        self._lanes_lock = threading.Lock()
        self._lock_timeout_s = lock_timeout_s
        self._local = threading.local()
        self._open = False
        self._pool = Pool(conninfo, name="engram-store", size=pool_size, connect_timeout_s=connect_timeout_s,
                          timeout_s=pool_timeout_s, settings=[
                              f"SET idle_in_transaction_session_timeout = {int(idle_in_transaction_timeout_s * 1000)}",
                              f"SET lock_timeout = {int(lock_timeout_s * 1000)}",
                              "SET application_name = 'engram-core'",
                              # Statements run often are prepared (psycopg, after 5 runs); a custom plan per
                              # call cost the catch-up's statement 0.3 ms of planning each time. The hot
                              # statements are written to keep to their keys in a generic plan (tested).
                              "SET plan_cache_mode = force_generic_plan"])
        self.location = self._pool.location
        # The jobs one core at a time runs (Store.leader_lease): a session of their own, opened at
        # the first tick (offline tools never open it).
        self.leases = LeaderLeases(conninfo, connect_timeout_s=connect_timeout_s)
        self._open = True
        try:
            self.migrations_applied_at_open = self.check_migrations(apply=migrate)
        except BaseException:
            self.close()
            raise

    # -- connections ----------------------------------------------------------------------------------------------------
    def getconn(self) -> psycopg.Connection:
        return self._pool.get()

    def putconn(self, conn: psycopg.Connection) -> None:
        self._pool.put(conn)


    def discard(self, conn: psycopg.Connection) -> None:
        self._pool.discard(conn)

    def reload(self) -> None:
        """Nothing: the engine keeps no copy of anything another core can change."""

    # -- migrations -----------------------------------------------------------------------------------------------------
    def check_migrations(self, *, apply: bool) -> list[int]:
        """Verify the ledger against the code and apply what is missing (``apply``), holding the
        migration advisory lock: engines opening one database together apply each migration once,
        the second waiting for the first and then finding it applied."""
        conn = self.getconn()
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK])
            try:
                return self._migrate_locked(conn, apply=apply)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK])
        except psycopg.Error as exc:
            raise EngramError(Code.STORE_UNAVAILABLE, f"migration failed: {failure(exc)}") from None
        finally:
            self.putconn(conn)

    def _migrate_locked(self, conn: psycopg.Connection, *, apply: bool) -> list[int]:
        return run_migrations(conn, self._migrations, apply=apply)  # no DDL when nothing is pending

    def migrate(self) -> list[int]:
        return self.check_migrations(apply=True)

    def schema_version(self) -> int:
        return max(m.version for m in self._migrations)

    def migration_code(self) -> list[dict[str, Any]]:
        return [{"version": m.version, "name": m.name, "checksum": m.checksum} for m in self._migrations]

    def migration_ledger(self) -> list[dict[str, Any]]:
        with self.read(snapshot=False) as tx:
            rows = tx.query("SELECT version, name, checksum, applied_at_ms FROM schema_migrations ORDER BY version")
        return [{"version": r[0], "name": r[1], "checksum": r[2], "applied_at_ms": r[3]} for r in rows]

    # -- transactions ---------------------------------------------------------------------------------------------------
    def _require_open(self) -> None:
        if not self._open:
            raise EngramError(Code.STORE_UNAVAILABLE, "store closed")

    def autocommit(self, statements: Sequence[tuple[str, Sequence[Any], bool]]) -> list[list[tuple[Any, ...]]]:
        """Statements on their own, outside any transaction of the caller's, in one round trip
        (the shared state's: ``shared_state.py``): each ``(sql, params, durable)`` committed in a
        transaction of its own, in order; ``durable`` False: committed with ``synchronous_commit =
        off`` (``unflushed``), for rows a database crash may take back without harm. The rows of each."""
        self._require_open()
        out: list[list[tuple[Any, ...]]] = [[] for _ in statements]
        batch: list[Statement] = []
        for i, (sql, params, durable) in enumerate(statements):
            statement = Statement(sql, params, on_rows=out[i].extend)
            batch += [statement] if durable else unflushed(statement)
        with self.read(snapshot=False) as tx:
            try:
                tx.send(batch)
            except psycopg.Error as exc:
                raise tx.store_error(exc) from None
        return out

    def in_write(self) -> bool:
        return getattr(self._local, "writing", False)

    @contextmanager
    def write(self, *, batched: bool = False, effects: TxEffects | None = None,
              scope: Scope | None = None) -> Iterator[PostgresEngineTx]:
        """A read-write transaction. ``batched`` with its ``scope``: a member of that scope's batch
        on this core (group commit, below); otherwise a transaction of its own."""
        self._require_open()
        effects = effects if effects is not None else TxEffects()
        if batched and scope is not None:
            with tracing.span("engram.store.transaction"):
                yield from self._member(scope, effects)
            return
        hooks = self._hooks
        assert hooks is not None, "the store kernel sets the commit hooks"
        tx = self.tx_class(self, "write")
        with tracing.span("engram.store.transaction"):
            try:
                self._local.writing = True
                try:
                    yield tx
                except BaseException:
                    tx.rollback()
                    hooks.rolled_back([effects])
                    raise
                finally:
                    self._local.writing = False
                try:
                    hooks.prepare([effects], tx, hooks.before_flush([effects]))
                except BaseException as exc:
                    tx.rollback()
                    hooks.rolled_back([effects])
                    raise exc if isinstance(exc, EngramError) else EngramError(
                        Code.STORE_UNAVAILABLE, f"commit refused: {type(exc).__name__}") from None
                self._commit(tx, [effects])
            finally:
                self._observe_lock(tx)
                tx.release()

    def _commit(self, tx: PostgresEngineTx, effects: list[TxEffects]) -> None:
        """COMMIT ``tx`` for ``effects`` (one transaction's, or a batch's members'), and tell the
        hooks; raises what the members are answered when it cannot."""
        hooks = self._hooks
        assert hooks is not None
        started = time.perf_counter()
        try:
            tx.commit()
        except EngramError as exc:
            if exc.code == Code.MUTATION_OUTCOME_UNKNOWN:
                hooks.commit_unknown()
            else:
                tx.rollback()
                hooks.rolled_back(effects)
            raise
        if self.observers.on_commit is not None:
            self.observers.on_commit(time.perf_counter() - started, len(effects))
        hooks.committed(effects, tx.scope_changes())

    def _observe_lock(self, tx: PostgresEngineTx) -> None:
        if tx.locked_at is not None and self.observers.on_scope_lock is not None:
            self.observers.on_scope_lock(tx.lock_wait_s, time.perf_counter() - tx.locked_at)

    # -- group commit, per scope -----------------------------------------------------------------------------------
    # The writes of one scope queue on its row lock whichever core makes them, and each paid its
    # own lock round trip and COMMIT (a WAL flush) while the others waited: under load the lock's
    # hold, not the database, bounded a scope's writes (measured: 3 ms held alone, 17 ms with 16
    # writers, most of it this process's other threads holding the interpreter between the
    # holder's round trips). So on each core the batched writes of one scope take turns in one
    # transaction: the first member opens it (and takes the lock), each later one runs after a
    # SAVEPOINT, and the member that finds nobody queued behind it (or the BATCH_MEMBERS-th)
    # commits for all. A member that fails is rolled back to its savepoint and answered alone;
    # the others go on. Nothing is acknowledged before the batch's COMMIT returned; a COMMIT that
    # fails answers every member alike (refused, or MUTATION_OUTCOME_UNKNOWN).
    def _turn(self, scope: Scope) -> _Lane:
        """Wait for this core's turn to write ``scope`` (STORE_UNAVAILABLE after the lock timeout)."""
        with self._lanes_lock:
            lane = self._lanes.get(scope)
            if lane is None:
                lane = self._lanes[scope] = _Lane(scope, threading.Condition(self._lanes_lock))
            lane.queued += 1
            try:
                deadline = time.monotonic() + self._lock_timeout_s
                while lane.busy:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise EngramError(Code.STORE_UNAVAILABLE, "timed out waiting for the scope's writers")
                    lane.turns.wait(left)
                lane.busy = True
            finally:
                lane.queued -= 1
            return lane

    def _end_turn(self, lane: _Lane, *, settle: bool) -> None:
        """End a member's turn. ``settle``: commit the open batch first unless a member is queued
        (or the batch is full); decided and released under the lanes lock, so that a member that
        gives up waiting cannot leave a batch nobody commits."""
        with self._lanes_lock:
            now = lane.batch is not None and settle and (
                lane.queued == 0 or len(lane.batch.members) >= BATCH_MEMBERS)
            if not now:
                self._free(lane)
                return
        try:
            self._settle(lane)
        finally:
            with self._lanes_lock:
                self._free(lane)

    def _free(self, lane: _Lane) -> None:
        """The turn is free (under the lanes lock); a lane nobody waits for is forgotten."""
        lane.busy = False
        if lane.queued:
            lane.turns.notify()
        elif lane.batch is None:
            del self._lanes[lane.scope]

    def _member(self, scope: Scope, effects: TxEffects) -> Iterator[PostgresEngineTx]:
        hooks = self._hooks
        assert hooks is not None, "the store kernel sets the commit hooks"
        lane = self._turn(scope)
        settle = False
        try:
            batch = lane.batch
            if batch is None:
                batch = lane.batch = _Batch(self.tx_class(self, "write"))
                mark = None
            else:
                try:
                    mark = batch.tx.member_begin(len(batch.members) + 1)
                except BaseException as exc:
                    self._abandon(lane, [effects], exc)
                    raise
            tx = batch.tx
            self._local.writing = True
            try:
                yield tx
                failure: BaseException | None = None
            except BaseException as exc:
                failure = exc
            finally:
                self._local.writing = False
            if failure is None:
                try:
                    hooks.prepare([effects], tx, hooks.before_flush([effects]))
                except BaseException as exc:
                    failure = exc if isinstance(exc, EngramError) else EngramError(
                        Code.STORE_UNAVAILABLE, f"commit refused: {type(exc).__name__}")
            if failure is not None:
                if mark is None or not tx.member_undo(mark):
                    self._abandon(lane, [effects], failure)  # the first member, or a batch that cannot go on
                else:
                    hooks.rolled_back([effects])
                    settle = True  # the members before it, if nobody comes after
                raise failure
            batch.members.append(effects)
            settle = True
        finally:
            self._end_turn(lane, settle=settle)
        batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def _settle(self, lane: _Lane) -> None:
        """Commit the lane's open batch and answer its members (on the lane's turn)."""
        batch, lane.batch = lane.batch, None
        assert batch is not None
        if not batch.members:  # its only member failed: nothing to commit
            batch.tx.rollback()
            batch.tx.release()
            batch.done.set()
            return
        try:
            self._commit(batch.tx, batch.members)
        except EngramError as exc:
            batch.error = exc
        except BaseException as exc:  # noqa: BLE001 - a hook failed after COMMIT: the members' writes stand
            log.exception("after a batch's COMMIT")
            batch.error = EngramError(Code.MUTATION_OUTCOME_UNKNOWN, f"after commit: {type(exc).__name__}")
        finally:
            self._observe_lock(batch.tx)
            batch.tx.release()
            batch.done.set()

    def _abandon(self, lane: _Lane, extra: list[TxEffects], cause: BaseException) -> None:
        """Roll the lane's open batch back: its members are refused, retriably (on the lane's turn).
        ``cause``: what made the batch unable to go on, named in the members' (logged) detail."""
        batch, lane.batch = lane.batch, None
        assert batch is not None and self._hooks is not None
        batch.tx.rollback()
        self._hooks.rolled_back([*batch.members, *extra])
        self._observe_lock(batch.tx)
        batch.tx.release()
        why = (f"{cause.code.value}: {cause.detail}" if isinstance(cause, EngramError) else type(cause).__name__)
        batch.error = EngramError(Code.STORE_UNAVAILABLE, f"write batch rolled back ({why}): retry")
        batch.done.set()

    def commit_answered(self) -> None:
        """Nothing to do: every write is answered at its COMMIT."""

    @contextmanager
    def read(self, *, snapshot: bool = True, as_writer: bool = False) -> Iterator[PostgresEngineTx]:
        """A reader: one REPEATABLE READ snapshot, or (``snapshot=False``) each statement on the
        latest committed state. Its connection is taken at its first statement."""
        self._require_open()
        tx = self.tx_class(self, "snapshot" if snapshot else "latest")
        try:
            yield tx
        finally:
            if snapshot:
                tx.rollback()
            tx.release()

    @contextmanager
    def index_scan(self) -> Iterator[_IndexScan]:
        self._require_open()
        conn = self.getconn()
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield _IndexScan(conn)
            conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            self.discard(conn)
            raise EngramError(Code.STORE_UNAVAILABLE, f"index scan failed: {failure(exc)}") from None
        except BaseException:
            self.discard(conn)  # left inside its transaction: not handed out again
            raise
        self.putconn(conn)

    def scope_now(self, scope: Scope) -> ScopeRow | None:
        with self.read(snapshot=False) as tx:
            return tx.scope(scope)

    def changes_since(self, scope: Scope, after: int) -> ScopeChanges:
        """The scope row, the journal after ``after``, and the rows, sealed projections and
        wrapped data keys of the records those events name, in one round trip of two statements
        (the second reads each event with its records). Each statement sees the latest commit, so
        the events may go past the row's head: the index is then newer than the row, which
        ``StoreKernel.committed_scope`` allows. (The records were a second round trip after the
        events until 2026-12-05; a snapshot, the events, the rows and each projection one after
        the other were five before that.)"""
        with self.read(snapshot=False) as tx:
            try:
                head: list[list[tuple[Any, ...]]] = []
                journal: list[list[tuple[Any, ...]]] = []
                tx.send([Statement(f"SELECT {SCOPE_COLS} FROM scopes WHERE tenant = %s AND workspace = %s",
                                     [scope.tenant, scope.workspace], on_rows=head.append),
                          Statement(EVENTS_WITH_RECORDS, [scope.tenant, scope.workspace, after + 1, MAX_BIGINT],
                                     on_rows=journal.append)])
            except psycopg.Error as exc:
                raise tx.store_error(exc) from None
        if not head[0]:
            return ScopeChanges(None, [], {}, {})
        row = scope_of(head[0][0])
        events: list[Event] = []
        rows: dict[str, RecordRow] = {}
        blobs: dict[str, bytes] = {}
        keys: dict[int, WrappedKey] = {}
        for r in journal[0]:
            if not events or events[-1].cursor != int(r[2]):
                events.append(event_of(r))
            found = r[EVENT_WIDTH:]
            if found[0] is None or found[1] != scope.tenant or found[2] != scope.workspace:
                continue  # the event names no record (or none of this scope's)
            rec = rows[found[0]] = record_of(found)
            if found[RECORD_WIDTH] is not None:
                blobs[rec.record_id] = found[RECORD_WIDTH]
            if found[RECORD_WIDTH + 1] is not None:
                keys[int(rec.key_slot)] = WrappedKey(found[RECORD_WIDTH + 1], int(found[RECORD_WIDTH + 2]),  # type: ignore[arg-type]
                                                     int(found[RECORD_WIDTH + 3]), bytes(found[RECORD_WIDTH + 4]))
        return ScopeChanges(row, events, rows, blobs, keys)

    # -- the store as a whole -------------------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """A no-op: see the module docstring (a forget shreds by key destruction, not by pages)."""

    def analyze(self) -> None:
        """ANALYZE every table. Tables filled by one restore have no statistics until
        autovacuum's next pass (up to a minute away): the planner then takes each scope to hold
        one row and answered a lookup by record id from the scope's index, reading the whole
        scope (6 ms per lookup at 10k records, against 0.05 ms by the primary key)."""
        self._require_open()
        with self.read(snapshot=False) as tx:
            try:
                tx.send([Statement("ANALYZE")])
            except psycopg.Error as exc:
                raise tx.store_error(exc) from None

    def describe(self) -> dict[str, Any]:
        """The start-up summary. Exact counts scan their tables, so a table the planner's
        statistics put above ``EXACT_COUNTS_UP_TO`` rows is reported by that estimate instead
        (``"~N"``; records and candidates then without their split by state): a core over a very
        large store starts without reading it all."""
        with self.read() as tx:
            estimates = {name: float(n) for name, n in tx.query(
                "SELECT relname, reltuples FROM pg_class WHERE relkind = 'r' AND relnamespace = "
                "current_schema()::regnamespace AND relname = ANY(%s)", [["records", "candidates", "audit"]])}
            counts = tx.counts({t: n for t, n in estimates.items() if n > EXACT_COUNTS_UP_TO})
        return {"engine": "postgresql", "store": self.location, "migrations_applied": self.migrations_applied_at_open,
                **counts}

    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        if not self._open and self._pool.closed:
            return
        self._open = False
        self.leases.close()
        self._pool.close()
