"""The PostgreSQL engine (SPEC §10): several cores over one database, any core serving any scope.

The engine gives the guarantees of ``engram_core/store/engine.py`` with other processes writing
the same database (``sole_writer`` False), so it keeps no copy of anything another process can
change: scope rows, audit chain heads, idempotency keys, grants, payload digests and record
links are read from the database inside each transaction.

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

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from engram_core.crypto.keyvault import WrappedKey
from engram_core.errors import Code, EngramError
from engram_core.observability import tracing
from engram_core.store.chain import GENESIS, LEGACY_CHAIN, scope_chain
from engram_core.store.engine import CommitHooks, EngineCapabilities, ScopeChanges, StoreObservers, TxEffects
from engram_core.store.port import (
    CandidateRow,
    Event,
    HostKeyRow,
    IdempotencyRow,
    KeyDestruction,
    RecordRow,
    ScopeRow,
    SharedPin,
    iter_chunks,
)
from engram_core.store.postgres.leases import LeaderLeases
from engram_core.store.postgres.migrations import MIGRATION_LOCK, MIGRATIONS, Migration, run_migrations
from engram_core.store.postgres.pool import Pool, failure
from engram_core.store.postgres.shared_state import PgSharedState

SCHEMA_VERSION = max(m.version for m in MIGRATIONS)  # what this engine writes
OPEN_CHUNK = 4096  # rows fetched per round trip while the search index is built
FLUSH_STATEMENTS = 256  # buffered statements sent early (a long maintenance transaction)
FLUSH_IDLE_S = 5.0  # buffered statements sent early once the server has not heard from us this long
MAX_BIGINT = 2**63 - 1
BATCH_MEMBERS = 32  # a scope's batch commits at this size even with members queued (bounds latency)
EXACT_COUNTS_UP_TO = 1_000_000  # rows (planner estimate) up to which the start-up summary counts exactly
log = logging.getLogger(__name__)

RECORD_COLS = (
    "record_id, tenant, workspace, candidate_id, record_digest, payload_digest, state, trust_class, principal, "
    "agent_id, valid_t, valid_t_end, expires_at_ms, derivative_rule, accepted_at_ms, accepted_cursor, "
    "state_cursor, successor_id, sealed_body, key_slot, session, captured_at_ms"
)
RECORD_WIDTH = 22  # columns in RECORD_COLS: a query's extra columns start here


def _qualified(cols: str, alias: str) -> str:
    """``cols`` (a comma-separated column list) each prefixed with ``alias``."""
    return ", ".join(f"{alias}.{c.strip()}" for c in cols.split(","))


_RECORD_COLS_R = _qualified(RECORD_COLS, "r")
_CANDIDATE_COLS = (
    "candidate_id, tenant, workspace, principal, agent_id, session, state, payload_digest, record_digest, "
    "trust_class, facts, sealed_envelope, captured_at_ms, cursor, decision, key_slot"
)
_SCOPE_COLS = "tenant, workspace, activated, tools, authorization_epoch, last_cursor, last_event_digest"
_EVENT_COLS = ("tenant, workspace, cursor, event_id, operation, target, from_state, to_state, at_ms, body, "
               "prev_digest, event_digest")
_EVENT_WIDTH = len(_EVENT_COLS.split(","))  # an events-with-records row's record columns start here
# Reads by key within a scope. psycopg prepares a statement a connection has run a few times, and
# the server may then keep a generic plan, chosen without the parameters' values: for ``record_id
# = $1 AND tenant = $2 AND workspace = $3`` that plan may take a (tenant, workspace, ...) index and
# filter the whole scope (measured: the catch-up's records took 1.3 ms at 5,000 records, growing
# with the scope, where the primary key takes 0.1), and for ``cursor > $3`` it estimates a third of
# the journal and may scan all of it. So the key lookups sit behind a MATERIALIZED fence that leaves
# the planner nothing but the key, the scope checked on the row found, and a journal range is
# bounded on both sides (a generic plan estimates a closed range as narrow). Test:
# test_postgres_engine.py's plans.
_RECORD_BY_ID = (f"WITH r AS MATERIALIZED (SELECT {RECORD_COLS} FROM records WHERE record_id = %s) "
                 "SELECT * FROM r WHERE tenant = %s AND workspace = %s")
_RECORDS_BY_ID = (f"WITH r AS MATERIALIZED (SELECT {RECORD_COLS} FROM records WHERE record_id = ANY(%s)) "
                  "SELECT * FROM r WHERE tenant = %s AND workspace = %s")
_CANDIDATE_BY_ID = (f"WITH c AS MATERIALIZED (SELECT {_CANDIDATE_COLS} FROM candidates WHERE candidate_id = %s) "
                    "SELECT * FROM c WHERE tenant = %s AND workspace = %s")
_EVENTS_BETWEEN = (f"SELECT {_EVENT_COLS} FROM journal WHERE tenant = %s AND workspace = %s AND cursor >= %s "
                   "AND cursor <= %s ORDER BY cursor")
_EVENT_BY_ID = (f"WITH e AS MATERIALIZED (SELECT {_EVENT_COLS} FROM journal WHERE tenant = %s AND workspace = %s "
                "AND event_id = %s) SELECT * FROM e ORDER BY cursor LIMIT 1")  # the fence: not the scope in cursor order
_PAYLOAD_STANDING = (
    "SELECT state, accepted_cursor, record_id, false FROM records "
    "WHERE tenant = %s AND workspace = %s AND payload_digest = %s UNION ALL "
    "SELECT '', 0, record_id, true FROM tombstones WHERE tenant = %s AND workspace = %s AND payload_digest = %s")
_FAMILY_MEMBERS = (
    f"SELECT {_RECORD_COLS_R}, f.primary_kind, array_agg(f.family_ref ORDER BY f.family_ref) "
    "FROM record_families f JOIN records r ON r.record_id = f.record_id "
    "WHERE f.tenant = %s AND f.workspace = %s AND f.family_ref = ANY(%s) AND r.state = ANY(%s) "
    "AND r.tenant = %s AND r.workspace = %s GROUP BY r.record_id, f.primary_kind ORDER BY r.record_id")
_DERIVATIVES = (
    f"SELECT {_RECORD_COLS_R} FROM record_sources s JOIN records r ON r.record_id = s.record_id "
    "WHERE s.tenant = %s AND s.workspace = %s AND s.source_id = %s AND r.tenant = %s AND r.workspace = %s "
    "ORDER BY r.record_id")
# The journal from a cursor on, each event with the records it names (``records_of_event``: a
# record target, an admission body's ``record_id``), their sealed projections and wrapped data keys:
# one row per event and record (one with NULLs for an event that names none). The lateral read is
# fenced (OFFSET 0) so that it stays a lookup by primary key per event whatever the plan; the scope
# of a record found is checked by the caller.
_EVENTS_WITH_RECORDS = (
    f"SELECT {_qualified(_EVENT_COLS, 'j')}, {_qualified(RECORD_COLS, 'c')}, c.sealed, c.owner, "
    "c.version, c.generation, c.wrapped FROM "
    f"(SELECT {_EVENT_COLS} FROM journal WHERE tenant = %s AND workspace = %s AND cursor >= %s AND cursor <= %s) j "
    f"LEFT JOIN LATERAL (SELECT {_RECORD_COLS_R}, p.sealed, v.owner, v.version, v.generation, v.wrapped "
    "FROM records r LEFT JOIN projections p ON p.record_id = r.record_id LEFT JOIN vault_keys v ON v.ref = r.key_slot "
    "WHERE r.record_id = ANY(ARRAY[j.target, j.body::jsonb ->> 'record_id']) OFFSET 0) c ON true ORDER BY j.cursor")
_AUDIT_KEYS = ("chain", "seq", "at_ms", "audit_id", "tenant", "workspace", "principal", "agent_id", "operation",
               "outcome", "target_digest", "decisions", "prev_digest", "row_digest", "context_nonce")
_OPTIONAL_AUDIT = {"chain": LEGACY_CHAIN, "context_nonce": ""}  # absent from a document: this value
_INSERT_AUDIT = f"INSERT INTO audit ({', '.join(_AUDIT_KEYS)}) VALUES ({', '.join(['%s'] * len(_AUDIT_KEYS))})"
# A chain's head moves forward only: a spooled row moved in twice, or restored verbatim, never
# moves it back.
_UPSERT_HEAD = ("INSERT INTO audit_heads (chain, seq, row_digest) VALUES (%s, %s, %s) ON CONFLICT (chain) DO UPDATE "
                "SET seq = EXCLUDED.seq, row_digest = EXCLUDED.row_digest WHERE audit_heads.seq < EXCLUDED.seq")


def record_of(row: Sequence[Any]) -> RecordRow:
    """A ``RecordRow`` from a ``SELECT {RECORD_COLS}`` row (extra trailing columns are ignored)."""
    return RecordRow(*row[:RECORD_WIDTH])


def _candidate(row: Sequence[Any]) -> CandidateRow:
    r = list(row)
    r[10] = json.loads(r[10])
    r[14] = json.loads(r[14]) if r[14] else None
    return CandidateRow(*r)


def _scope(row: Sequence[Any]) -> ScopeRow:
    return ScopeRow(row[0], row[1], row[2], tuple(json.loads(row[3])), int(row[4]), int(row[5]), row[6])


def _event(r: Sequence[Any]) -> Event:
    return Event(r[0], r[1], int(r[2]), r[3], r[4], r[5], r[6], r[7], int(r[8]), json.loads(r[9]), r[10], r[11])


def _audit_values(doc: dict[str, Any]) -> list[Any]:
    return [json.dumps(doc[k], sort_keys=True) if k == "decisions" else doc.get(k, _OPTIONAL_AUDIT[k])
            if k in _OPTIONAL_AUDIT else doc[k] for k in _AUDIT_KEYS]


def _audit_doc(row: Sequence[Any]) -> dict[str, Any]:
    d = dict(zip(_AUDIT_KEYS, row, strict=True))
    d["seq"] = int(d["seq"])
    d["decisions"] = json.loads(d["decisions"])
    # Rows of the one chain before DuckDB's migration 9, and rows without a claimed nonce, never had
    # the field in their digest.
    for key, absent in _OPTIONAL_AUDIT.items():
        if d[key] == absent:
            del d[key]
    return d




def _conflict(exc: BaseException) -> bool:
    """A failure a retry of the whole mutation resolves (deadlock, lock timeout, serialization)."""
    return getattr(exc, "sqlstate", None) in ("40P01", "40001", "55P03")


_NUL_FREE = "\x01engram-hex:"


class _WritesAhead(RuntimeError):
    """A call given to ``read_ahead`` wrote (a caller's mistake, never swallowed)."""


def _frozen(value: Any) -> Any:
    """``value`` (statement parameters) hashable: lists as tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def text_key(key: str) -> str:
    """A key as a PostgreSQL text column can hold it, one to one: a key without NUL (and not
    starting with the marker) is itself; any other is the marker and its UTF-8 bytes in hex, so
    two keys never share a stored form."""
    if "\x00" not in key and not key.startswith(_NUL_FREE):
        return key
    return _NUL_FREE + key.encode("utf-8").hex()


@dataclass
class _Statement:
    sql: str
    params: Sequence[Any] | None = None
    on_rows: Callable[[list[tuple[Any, ...]]], object] | None = None  # called with its rows after the round trip
    many: bool = False  # params is a sequence of parameter rows (executemany)


def _unflushed(statement: _Statement) -> list[_Statement]:
    """``statement`` in a transaction of its own that commits with ``synchronous_commit = off``:
    visible to every core at once, not waiting for the WAL flush (the WAL writer flushes it within
    a few hundred ms). Statements after these in the same pipeline run in a transaction of theirs."""
    return [_Statement("BEGIN"), _Statement("SET LOCAL synchronous_commit = off"), statement, _Statement("COMMIT")]


@dataclass
class _ScopeLock:
    """A scope this write transaction locked: its row as this transaction sees it."""

    row: ScopeRow | None = None  # None until the lock's round trip answered
    known: bool = False
    created: bool = False  # the lock inserted the row (the scope was never written)
    materialized: bool = False  # something was written to it: a created row stays
    dirty: bool = False  # changed here: an UPDATE goes with the next round trip


@dataclass
class _Mark:
    """Where a batch member began (``PostgresEngineTx.member_begin``): its savepoint and what
    the transaction held in memory then, restored if the member fails."""

    savepoint: str
    pending: int  # len(_pending) with the SAVEPOINT statement in it
    round_trips: int
    scopes: dict[tuple[str, str], _ScopeLock]
    heads: dict[str, tuple[int, str]]
    seen: set[str]


class PostgresEngineTx:
    """Persistence over one pooled connection inside one transaction (``engine.EngineTx``).

    ``mode``: "write" (READ COMMITTED, scope rows locked at first touch, writes buffered),
    "snapshot" (REPEATABLE READ READ ONLY) or "latest" (each statement in autocommit)."""

    def __init__(self, engine: PostgresEngine, mode: str) -> None:
        self._engine = engine
        self._mode = mode
        self._writing = mode == "write"
        self._conn: psycopg.Connection | None = None
        self._begun = False
        self._pending: list[_Statement] = []
        self._scopes: dict[tuple[str, str], _ScopeLock] = {}
        self._heads: dict[str, tuple[int, str]] = {}  # audit chain heads locked by this transaction
        self._seen: set[str] = set()  # record and candidate ids read or written through their scope
        self._last_sent = time.monotonic()
        self.round_trips = 0
        self.failed = False
        # Observability: a scope lock is asked for with the next round trip (_locking); when that
        # round trip answered, the lock was held, and for how long it was waited for.
        self._locking = False
        self.locked_at: float | None = None
        self.lock_wait_s = 0.0
        # read_ahead: statements recorded instead of sent, then their answers until asked for.
        self._recording: list[_Statement] | None = None
        self._ahead: dict[tuple[str, Any], list[tuple[Any, ...]]] = {}

    # -- the connection and round trips -------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None:
            self._conn = self._engine._getconn()
        return self._conn

    def _begin_statement(self) -> _Statement | None:
        if self._begun or self._mode == "latest":
            return None
        self._begun = True
        if self._mode == "write":
            # Explicit, whatever default_transaction_isolation the database was given.
            return _Statement("BEGIN ISOLATION LEVEL READ COMMITTED")
        return _Statement("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _scope_updates(self) -> list[_Statement]:
        out = []
        for lock in self._scopes.values():
            if lock.dirty and lock.row is not None:
                r = lock.row
                out.append(_Statement(
                    "UPDATE scopes SET activated = %s, tools = %s, authorization_epoch = %s, last_cursor = %s, "
                    "last_event_digest = %s WHERE tenant = %s AND workspace = %s",
                    [r.activated, json.dumps(sorted(r.tools)), r.authorization_epoch, r.last_cursor,
                     r.last_event_digest, r.tenant, r.workspace]))
                lock.dirty = False
        return out

    def _send(self, statements: list[_Statement], *, commit: bool = False) -> None:
        """One round trip: BEGIN (first time), the buffered writes, the scope rows changed, then
        ``statements``, in one pipeline; each statement's ``on_rows`` gets its rows."""
        if self.failed:
            raise EngramError(Code.STORE_UNAVAILABLE, "transaction already failed")
        begin = self._begin_statement()
        batch = ([begin] if begin is not None else []) + self._pending + self._scope_updates() + statements
        self._pending = []
        conn = self._connection()
        first = self.round_trips == 0
        sent = time.perf_counter()
        try:
            cursors = self._pipeline(conn, batch)
        except psycopg.OperationalError as exc:
            if not (first and not commit and conn.broken):
                self.failed = True
                raise
            # The connection died before this transaction did anything on it (the database restarted
            # while it idled in the pool): nothing happened, so the same statements go on another.
            log.info("store connection lost before its first statement (%s); reconnecting", failure(exc))
            self._engine._discard(conn)
            self._conn = conn = self._engine._getconn()
            cursors = self._pipeline(conn, batch)
        except psycopg.Error:
            self.failed = True
            raise
        finally:
            self.round_trips += 1
            self._last_sent = time.monotonic()
        if self._locking and self.locked_at is None:
            self.locked_at = time.perf_counter()
            self.lock_wait_s = self.locked_at - sent
        for st, cur in zip(batch, cursors, strict=True):
            if st.on_rows is not None:
                st.on_rows(cur.fetchall())

    @staticmethod
    def _pipeline(conn: psycopg.Connection, batch: list[_Statement]) -> list[psycopg.Cursor]:
        cursors = []
        # Leaving the block sends the one Sync and waits for every answer: one round trip (an explicit
        # sync() before it would cost a second, empty one).
        with conn.pipeline():
            for st in batch:
                cur = conn.cursor()
                if st.many:
                    cur.executemany(st.sql, st.params or [])
                else:
                    cur.execute(st.sql, st.params)  # type: ignore[arg-type]
                cursors.append(cur)
        return cursors

    def read_ahead(self, *reads: Callable[[], object]) -> None:
        """``port.Tx.read_ahead``: each read is run once with its statements recorded (answered
        with no rows, its result ignored), then all of them go in one round trip with the
        buffered scope locks and writes; each statement's rows answer the first identical one."""
        recorded: list[_Statement] = []
        self._recording = recorded
        try:
            for read in reads:
                try:
                    read()
                except _WritesAhead:
                    raise
                except Exception:  # noqa: BLE001 - a read that cannot take "no rows" is just not read ahead
                    pass
        finally:
            self._recording = None
        if not recorded:
            return
        try:
            self._send(recorded)
        except psycopg.Error as exc:
            raise self._store_error(exc) from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement, in one round trip with everything buffered before it (or as
        read ahead)."""
        if self._ahead or self._recording is not None:  # else no statement is read ahead: no key to make
            key = (sql, _frozen(params))
            if key in self._ahead:
                return self._ahead.pop(key)
            if self._recording is not None:
                self._recording.append(_Statement(sql, params,
                                                  on_rows=lambda rows: self._ahead.setdefault(key, rows)))
                return []
        out: list[list[tuple[Any, ...]]] = []
        try:
            self._send([_Statement(sql, params, on_rows=out.append)])
        except psycopg.Error as exc:
            raise self._store_error(exc) from None
        return out[0]

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self._query(sql, params)
        return rows[0] if rows else None

    def _store_error(self, exc: psycopg.Error) -> EngramError:
        self.failed = True
        if _conflict(exc):
            return EngramError(Code.STORE_UNAVAILABLE, f"write conflict, retry: {failure(exc)}")
        return EngramError(Code.STORE_UNAVAILABLE, f"store statement failed: {failure(exc)}")

    def _write(self, sql: str, params: Sequence[Any] = (), *, many: bool = False) -> None:
        """A write: buffered until the next round trip (a read, or the COMMIT)."""
        if self._recording is not None:
            raise _WritesAhead("read_ahead is for reads: this call writes")
        if not self._writing:
            raise EngramError(Code.STORE_UNAVAILABLE, "write outside a write transaction")
        self._pending.append(_Statement(sql, params, many=many))
        if len(self._pending) >= FLUSH_STATEMENTS or time.monotonic() - self._last_sent > FLUSH_IDLE_S:
            try:
                self._send([])
            except psycopg.Error as exc:
                raise self._store_error(exc) from None

    # -- members of a scope's batch (PostgresEngine.write, batched) ------------------------------------------
    def member_begin(self, n: int) -> _Mark:
        """A batch's member ``n`` (1, 2, …) starts after those before it: a savepoint (sent with
        its first round trip, so it costs none) and a copy of what this object holds in memory."""
        self._ahead.clear()  # reads ahead that an earlier member did not use are not this one's
        if any(not lock.known for lock in self._scopes.values()) or any(st.on_rows for st in self._pending):
            # Answers still owed to what the copy below holds: have them first.
            try:
                self._send([])
            except psycopg.Error as exc:
                raise self._store_error(exc) from None
        self._pending += self._scope_updates()  # earlier members' scope rows go before the savepoint
        name = f"member_{n}"
        self._pending.append(_Statement(f"SAVEPOINT {name}"))
        return _Mark(name, len(self._pending), self.round_trips,
                     {k: replace(lock) for k, lock in self._scopes.items()}, dict(self._heads), set(self._seen))

    def member_undo(self, mark: _Mark) -> bool:
        """Undo what the member that began at ``mark`` did, keeping the members before it; False
        when that cannot be done (the connection is gone: the whole batch is lost)."""
        self._ahead.clear()
        self._scopes, self._heads, self._seen = mark.scopes, mark.heads, mark.seen
        if self.round_trips == mark.round_trips and not self.failed:
            del self._pending[mark.pending - 1:]  # nothing of it reached the server, the savepoint included
            return True
        conn = self._conn
        if conn is None or conn.broken or conn.info.transaction_status not in (
                psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR):
            return False
        self._pending = [_Statement(f"ROLLBACK TO SAVEPOINT {mark.savepoint}")]
        self.failed = False
        try:
            self._send([])
        except psycopg.Error:
            self.failed = True
            return False
        return True

    # -- end of the transaction ------------------------------------------------------------------------------------
    def commit(self) -> None:
        """Send what is buffered with COMMIT (one round trip; none when nothing was written)."""
        for (tenant, workspace), lock in self._scopes.items():
            if lock.created and not lock.materialized:
                # Locked only to look at it: a scope exists once something was written to it.
                self._pending.append(_Statement("DELETE FROM scopes WHERE tenant = %s AND workspace = %s",
                                                [tenant, workspace]))
        if not self._begun and not self._pending and not any(lock.dirty for lock in self._scopes.values()):
            return  # nothing ever reached the server
        try:
            self._send([_Statement("COMMIT")], commit=True)
        except psycopg.Error as exc:
            self.failed = True
            conn = self._conn
            if (getattr(exc, "sqlstate", None) and conn is not None and not conn.broken
                    and conn.pgconn.status == psycopg.pq.ConnStatus.OK):
                # The server answered with an error and the session lives on: a statement failed and
                # the COMMIT never ran, or the COMMIT itself failed; nothing of the transaction happened.
                # A fatal error (the session ended) may have come after the commit was written.
                raise self._store_error(exc) from None
            raise EngramError(Code.MUTATION_OUTCOME_UNKNOWN, f"commit outcome unknown: {failure(exc)}") from None

    def rollback(self) -> None:
        """Roll back (when anything reached the server); a connection that cannot is discarded."""
        self._pending = []
        conn = self._conn
        if conn is None or not self._begun:
            return
        self._begun = False
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._conn = None
            self._engine._discard(conn)

    def release(self) -> None:
        """Give the connection back to the pool: idle, or discarded (broken, or a transaction it
        could not end)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.broken or conn.closed:
            self._engine._discard(conn)
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._engine._discard(conn)
                return
        self._engine._putconn(conn)

    def scope_changes(self) -> dict[tuple[str, str], ScopeRow]:
        """The rows of the scopes this transaction wrote, as it committed them."""
        return {k: lock.row for k, lock in self._scopes.items() if lock.row is not None and lock.materialized}

    # -- scope locks -------------------------------------------------------------------------------------------------
    def _touch(self, tenant: str, workspace: str) -> _ScopeLock | None:
        """In a write transaction: lock the scope with the next round trip (it goes before anything
        queued after this), once. Elsewhere: nothing."""
        if not self._writing:
            return None
        key = (tenant, workspace)
        lock = self._scopes.get(key)
        if lock is not None:
            return lock
        lock = self._scopes[key] = _ScopeLock()
        self._locking = True

        def inserted(rows: list[tuple[Any, ...]]) -> None:
            lock.created = bool(rows)

        def locked(rows: list[tuple[Any, ...]]) -> None:
            lock.row, lock.known = _scope(rows[0]), True

        def head(rows: list[tuple[Any, ...]]) -> None:
            if rows:
                self._heads[scope_chain(tenant, workspace)] = (int(rows[0][0]), rows[0][1])

        self._pending += [
            _Statement("INSERT INTO scopes VALUES (%s, %s, false, '[]', 0, 0, %s) ON CONFLICT DO NOTHING RETURNING true",
                       [tenant, workspace, GENESIS], on_rows=inserted),
            _Statement(f"SELECT {_SCOPE_COLS} FROM scopes WHERE tenant = %s AND workspace = %s FOR UPDATE",
                       [tenant, workspace], on_rows=locked),
            # The head of the scope's audit chain, which this transaction's audit rows will extend
            # (created with the chain: the first audit row of a scope costs no round trip either).
            _Statement("INSERT INTO audit_heads VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
                       [scope_chain(tenant, workspace), GENESIS]),
            _Statement("SELECT seq, row_digest FROM audit_heads WHERE chain = %s FOR UPDATE",
                       [scope_chain(tenant, workspace)], on_rows=head),
        ]
        return lock

    def _lock(self, tenant: str, workspace: str) -> _ScopeLock:
        """The scope locked and its row known (a round trip if it was not yet)."""
        lock = self._touch(tenant, workspace)
        if lock is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "a scope change outside a write transaction")
        if not lock.known and self._recording is None:  # read ahead: the lock goes with the reads
            try:
                self._send([])
            except psycopg.Error as exc:
                raise self._store_error(exc) from None
        return lock

    def _guard_id(self, table: str, id_col: str, value: str) -> None:
        """A write naming only a row's id, in a transaction that did not reach that row through its
        scope: lock the row's scope in the same round trip as the write."""
        if value in self._seen or not self._writing:
            return
        self._locking = True
        self._pending.append(_Statement(
            f"SELECT 1 FROM scopes s JOIN {table} x ON s.tenant = x.tenant AND s.workspace = x.workspace "
            f"WHERE x.{id_col} = %s FOR UPDATE OF s", [value]))
        self._seen.add(value)

    # -- scopes and the journal ----------------------------------------------------------------------------------------
    def scope(self, tenant: str, workspace: str) -> ScopeRow | None:
        if self._writing:
            lock = self._lock(tenant, workspace)
            return lock.row if lock.materialized or not lock.created else None
        row = self._one(f"SELECT {_SCOPE_COLS} FROM scopes WHERE tenant = %s AND workspace = %s", [tenant, workspace])
        return _scope(row) if row else None

    def scope_for_update(self, tenant: str, workspace: str) -> ScopeRow:
        if not self._writing:
            raise EngramError(Code.STORE_UNAVAILABLE, "scope_for_update outside a write transaction")
        if self._recording is not None:
            raise _WritesAhead("read_ahead is for reads: this call changes the scope")
        lock = self._lock(tenant, workspace)
        lock.materialized = True
        assert lock.row is not None
        return lock.row

    def _change(self, tenant: str, workspace: str, **changes: Any) -> ScopeRow:
        lock = self._lock(tenant, workspace)
        assert lock.row is not None
        lock.row = replace(lock.row, **changes)
        lock.materialized = lock.dirty = True
        return lock.row

    def scopes(self) -> list[ScopeRow]:
        # Not locked: listing scopes is not a statement about each of them. This transaction's own
        # changes (and rows it only created to lock) are as it sees them.
        rows = {(r[0], r[1]): _scope(r) for r in self._query(f"SELECT {_SCOPE_COLS} FROM scopes")}
        for key, lock in self._scopes.items():
            if lock.created and not lock.materialized:
                rows.pop(key, None)
            elif lock.row is not None:
                rows[key] = lock.row
        return [rows[k] for k in sorted(rows)]

    def set_activation(self, tenant: str, workspace: str, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        return self._change(tenant, workspace, activated=activated, tools=tuple(sorted(tools)))

    def bump_epoch(self, tenant: str, workspace: str) -> int:
        row = self._lock(tenant, workspace).row
        assert row is not None
        return self._change(tenant, workspace, authorization_epoch=row.authorization_epoch + 1).authorization_epoch

    def insert_event(self, e: Event) -> None:
        scope = self.scope_for_update(e.tenant, e.workspace)
        if e.cursor != scope.last_cursor + 1 or e.prev_digest != scope.last_event_digest:
            raise EngramError(Code.STORE_UNAVAILABLE, "journal event does not follow the scope head")
        self._write(f"INSERT INTO journal ({_EVENT_COLS}) VALUES ({', '.join(['%s'] * 12)})",
                    [e.tenant, e.workspace, e.cursor, e.event_id, e.operation, e.target, e.from_state, e.to_state,
                     e.at_ms, json.dumps(e.body, sort_keys=True), e.prev_digest, e.event_digest])
        self._change(e.tenant, e.workspace, last_cursor=e.cursor, last_event_digest=e.event_digest)

    def set_scope_head(self, tenant: str, workspace: str, cursor: int, event_digest: str) -> None:
        self._change(tenant, workspace, last_cursor=cursor, last_event_digest=event_digest)

    def events(self, tenant: str, workspace: str, from_cursor: int, to_cursor: int | None) -> list[Event]:
        self._touch(tenant, workspace)
        rows = self._query(_EVENTS_BETWEEN,
                           [tenant, workspace, from_cursor, to_cursor if to_cursor is not None else MAX_BIGINT])
        return [_event(r) for r in rows]

    def event_by_id(self, tenant: str, workspace: str, event_id: str) -> Event | None:
        self._touch(tenant, workspace)
        row = self._one(_EVENT_BY_ID, [tenant, workspace, event_id])
        return _event(row) if row else None

    def restore_scope(self, row: ScopeRow) -> None:
        lock = self._lock(row.tenant, row.workspace)
        if not lock.created or lock.materialized:
            raise EngramError(Code.STORE_UNAVAILABLE, "restore of a scope the store already holds")
        lock.row = replace(row, tools=tuple(sorted(row.tools)))
        lock.materialized = lock.dirty = True

    def restore_event(self, e: Event) -> None:
        self._touch(e.tenant, e.workspace)
        self._write(f"INSERT INTO journal ({_EVENT_COLS}) VALUES ({', '.join(['%s'] * 12)})",
                    [e.tenant, e.workspace, e.cursor, e.event_id, e.operation, e.target, e.from_state, e.to_state,
                     e.at_ms, json.dumps(e.body, sort_keys=True), e.prev_digest, e.event_digest])

    # -- idempotency, confirmations, tombstones -------------------------------------------------------------------------
    # (text_key: an idempotency key is any NFC text of 16-256 bytes, NUL included, which a
    # PostgreSQL text column cannot hold.)
    def idempotency_get(self, tenant: str, workspace: str, principal: str, key: str) -> IdempotencyRow | None:
        self._touch(tenant, workspace)
        row = self._one("SELECT tool, target, request_digest, outcome FROM idempotency "
                        "WHERE tenant = %s AND workspace = %s AND principal = %s AND key = %s",
                        [tenant, workspace, principal, text_key(key)])
        return IdempotencyRow(row[0], row[1], row[2], json.loads(row[3])) if row else None

    def idempotency_put(self, tenant: str, workspace: str, principal: str, key: str, row: IdempotencyRow,
                        at_ms: int) -> None:
        self._touch(tenant, workspace)
        # A plain INSERT: the primary key refuses a second outcome for one key (it never commits).
        self._write("INSERT INTO idempotency VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [tenant, workspace, principal, text_key(key), row.tool, row.target, row.request_digest,
                     json.dumps(row.outcome, sort_keys=True), at_ms])

    def use_confirmation(self, grant_id: str, tenant: str, workspace: str, at_ms: int) -> bool:
        self._touch(tenant, workspace)
        # Insert-if-absent decides, not a read before it: a grant is used once across every core.
        return bool(self._query("INSERT INTO used_confirmations VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING "
                                "RETURNING true", [grant_id, tenant, workspace, at_ms]))

    def add_tombstone(self, tenant: str, workspace: str, payload_digest: str, record_id: str, cursor: int,
                      at_ms: int) -> None:
        self._touch(tenant, workspace)
        self._write("INSERT INTO tombstones VALUES (%s, %s, %s, %s, %s, %s)",
                    [tenant, workspace, payload_digest, record_id, cursor, at_ms])

    def tombstoned(self, tenant: str, workspace: str, payload_digest: str) -> bool:
        self._touch(tenant, workspace)
        return self._one("SELECT 1 FROM tombstones WHERE tenant = %s AND workspace = %s AND payload_digest = %s "
                         "LIMIT 1", [tenant, workspace, payload_digest]) is not None

    def tombstone_rows(self) -> list[dict[str, Any]]:
        keys = ("tenant", "workspace", "payload_digest", "record_id", "cursor", "at_ms")
        rows = self._query(f"SELECT {', '.join(keys)} FROM tombstones ORDER BY tenant, workspace, cursor, record_id")
        return [{**dict(zip(keys, r, strict=True)), "cursor": int(r[4])} for r in rows]

    # -- candidates ------------------------------------------------------------------------------------------------------
    def insert_candidate(self, row: CandidateRow) -> None:
        self._touch(row.tenant, row.workspace)
        self._seen.add(row.candidate_id)
        self._write(
            f"INSERT INTO candidates ({_CANDIDATE_COLS}) VALUES ({', '.join(['%s'] * 16)})",
            [row.candidate_id, row.tenant, row.workspace, row.principal, row.agent_id, row.session, row.state,
             row.payload_digest, row.record_digest, row.trust_class, json.dumps(row.facts, sort_keys=True),
             row.sealed_envelope, row.captured_at_ms, row.cursor,
             json.dumps(row.decision, sort_keys=True) if row.decision else None, row.key_slot])

    def scrub_candidate_facts(self, candidate_id: str) -> None:
        self._write("UPDATE candidates SET facts = '{}' WHERE candidate_id = %s", [candidate_id])

    def candidate(self, tenant: str, workspace: str, candidate_id: str) -> CandidateRow | None:
        self._touch(tenant, workspace)
        row = self._one(_CANDIDATE_BY_ID, [candidate_id, tenant, workspace])
        if row is None:
            return None
        self._seen.add(candidate_id)
        return _candidate(row)

    def candidates_in_state(self, tenant: str, workspace: str, state: str) -> list[CandidateRow]:
        self._touch(tenant, workspace)
        rows = [_candidate(r) for r in self._query(
            f"SELECT {_CANDIDATE_COLS} FROM candidates WHERE tenant = %s AND workspace = %s AND state = %s "
            "ORDER BY cursor, candidate_id", [tenant, workspace, state])]
        self._seen.update(c.candidate_id for c in rows)
        return rows

    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None = None,
                            drop_envelope: bool = False) -> None:
        self._guard_id("candidates", "candidate_id", candidate_id)
        decided = json.dumps(decision, sort_keys=True) if decision else None
        self._write("UPDATE candidates SET state = %s, decision = coalesce(%s, decision), "
                    "sealed_envelope = CASE WHEN %s THEN NULL ELSE sealed_envelope END WHERE candidate_id = %s",
                    [state, decided, drop_envelope, candidate_id])

    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None:
        self._guard_id("candidates", "candidate_id", candidate_id)
        self._write("UPDATE candidates SET trust_class = %s WHERE candidate_id = %s", [trust_class, candidate_id])

    # -- records -----------------------------------------------------------------------------------------------------------
    def insert_record(self, row: RecordRow) -> None:
        self._touch(row.tenant, row.workspace)
        self._seen.add(row.record_id)
        self._write(
            f"INSERT INTO records ({RECORD_COLS}) VALUES ({', '.join(['%s'] * RECORD_WIDTH)})",
            [row.record_id, row.tenant, row.workspace, row.candidate_id, row.record_digest, row.payload_digest,
             row.state, row.trust_class, row.principal, row.agent_id, row.valid_t, row.valid_t_end,
             row.expires_at_ms, row.derivative_rule, row.accepted_at_ms, row.accepted_cursor, row.state_cursor,
             row.successor_id, row.sealed_body, row.key_slot, row.session, row.captured_at_ms])

    def record(self, tenant: str, workspace: str, record_id: str) -> RecordRow | None:
        self._touch(tenant, workspace)
        row = self._one(_RECORD_BY_ID, [record_id, tenant, workspace])
        if row is None:
            return None
        self._seen.add(record_id)
        return record_of(row)

    def records(self, tenant: str, workspace: str, record_ids: list[str]) -> dict[str, RecordRow]:
        if not record_ids:
            return {}
        self._touch(tenant, workspace)
        out = {}
        for chunk in iter_chunks(record_ids, 1000):
            for r in self._query(_RECORDS_BY_ID, [chunk, tenant, workspace]):
                out[r[0]] = record_of(r)
        self._seen.update(out)
        return out

    def scope_records(self, tenant: str, workspace: str, states: tuple[str, ...] | None = None) -> list[RecordRow]:
        self._touch(tenant, workspace)
        sql = f"SELECT {RECORD_COLS} FROM records WHERE tenant = %s AND workspace = %s"
        params: list[Any] = [tenant, workspace]
        if states is not None:
            sql += " AND state = ANY(%s)"
            params.append(list(states))
        rows = [record_of(r) for r in self._query(sql + " ORDER BY accepted_cursor, doc", params)]
        self._seen.update(r.record_id for r in rows)
        return rows

    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None:
        self._guard_id("records", "record_id", record_id)
        # successor_id: None keeps the pointer, "" clears it (rewind), a value sets it.
        self._write(
            "UPDATE records SET state = %s, state_cursor = %s, "
            "successor_id = CASE WHEN %s::text = '' THEN NULL ELSE coalesce(%s::text, successor_id) END"
            + (", sealed_body = NULL" if drop_body else "") + " WHERE record_id = %s",
            [state, state_cursor, successor_id, successor_id, record_id])

    def set_record_trust_class(self, record_id: str, trust_class: str) -> None:
        self._guard_id("records", "record_id", record_id)
        self._write("UPDATE records SET trust_class = %s WHERE record_id = %s", [trust_class, record_id])

    def payload_standing(self, tenant: str, workspace: str, payload_digest: str) -> tuple[str | None, bool]:
        self._touch(tenant, workspace)
        rows = self._query(_PAYLOAD_STANDING, [tenant, workspace, payload_digest] * 2)
        current = min(((int(r[1]), r[2]) for r in rows if not r[3] and r[0] == "accepted_current"),
                      default=(0, None))[1]
        return current, any(r[3] for r in rows)

    # -- record links -------------------------------------------------------------------------------------------------------
    def add_record_links(self, tenant: str, workspace: str, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None:
        self._touch(tenant, workspace)
        if family_refs:
            self._write("INSERT INTO record_families VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [[tenant, workspace, ref, record_id, primary_kind] for ref in family_refs], many=True)
        if source_ids:
            self._write("INSERT INTO record_sources VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [[tenant, workspace, source, record_id] for source in source_ids], many=True)

    def drop_record_links(self, record_id: str) -> None:
        self._guard_id("records", "record_id", record_id)
        self._write("DELETE FROM record_families WHERE record_id = %s", [record_id])
        self._write("DELETE FROM record_sources WHERE record_id = %s OR source_id = %s", [record_id, record_id])

    def family_members(self, tenant: str, workspace: str, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]:
        if not family_refs:
            return []
        self._touch(tenant, workspace)
        rows = self._query(_FAMILY_MEMBERS, [tenant, workspace, list(family_refs), list(states), tenant, workspace])
        out = [(record_of(r), r[RECORD_WIDTH], list(r[RECORD_WIDTH + 1])) for r in rows]
        self._seen.update(m[0].record_id for m in out)
        return out

    def derivatives(self, tenant: str, workspace: str, source_id: str) -> list[RecordRow]:
        self._touch(tenant, workspace)
        rows = [record_of(r) for r in self._query(_DERIVATIVES, [tenant, workspace, source_id, tenant, workspace])]
        self._seen.update(r.record_id for r in rows)
        return rows

    # -- the data-key ledger -------------------------------------------------------------------------------------------------
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None:
        self._write("INSERT INTO data_keys VALUES (%s, %s, %s)", [owner, slot, at_ms])

    def data_key_slot(self, owner: str) -> int | None:
        row = self._one("SELECT slot FROM data_keys WHERE owner = %s", [owner])
        return int(row[0]) if row else None

    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None,
                      generation: int | None = None) -> int | None:
        if slot is None:
            row = self._one("DELETE FROM data_keys WHERE owner = %s RETURNING slot", [owner])
            if row is None:
                return None
            slot = int(row[0])
        else:  # the caller read it under the scope lock: no round trip
            self._write("DELETE FROM data_keys WHERE owner = %s", [owner])
        # A plain INSERT: a key destroyed twice fails the transaction rather than hide it. The generation,
        # unless given, is the one wrapping the key now: read after the DELETE above, which waits for a
        # re-wrap in progress and keeps any later one off this key (PgKeyVault.rewrap). None when the
        # vault keeps its keys elsewhere: then the destruction is never reported complete.
        self._write("INSERT INTO key_destructions VALUES (%s, %s, %s, "
                    "coalesce(%s::bigint, (SELECT generation FROM vault_keys WHERE ref = %s)))",
                    [owner, at_ms, reason, generation, slot])
        return slot

    def live_key_slots(self) -> dict[int, str]:
        return {int(s): o for o, s in self._query("SELECT owner, slot FROM data_keys")}

    def key_destruction(self, owner: str) -> KeyDestruction | None:
        row = self._one("SELECT owner, destroyed_at_ms, reason, generation FROM key_destructions WHERE owner = %s",
                        [owner])
        return KeyDestruction(row[0], int(row[1]), row[2], row[3]) if row else None

    def key_destructions(self) -> list[KeyDestruction]:
        return [KeyDestruction(r[0], int(r[1]), r[2], r[3]) for r in self._query(
            "SELECT owner, destroyed_at_ms, reason, generation FROM key_destructions ORDER BY owner")]

    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None:
        self._write("INSERT INTO key_destructions VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [owner, at_ms, reason, generation])

    # -- sealed projections ---------------------------------------------------------------------------------------------------
    def put_projection(self, tenant: str, workspace: str, record_id: str, sealed: bytes, *, new: bool) -> None:
        self._touch(tenant, workspace)
        if new:
            self._write("INSERT INTO projections VALUES (%s, %s, %s, %s)", [record_id, tenant, workspace, sealed])
        else:
            self._write("INSERT INTO projections VALUES (%s, %s, %s, %s) ON CONFLICT (record_id) DO UPDATE SET "
                        "tenant = EXCLUDED.tenant, workspace = EXCLUDED.workspace, sealed = EXCLUDED.sealed",
                        [record_id, tenant, workspace, sealed])

    def delete_projection(self, record_id: str) -> None:
        self._guard_id("records", "record_id", record_id)
        self._write("DELETE FROM projections WHERE record_id = %s", [record_id])

    def projection_blob(self, record_id: str) -> tuple[bytes, RecordRow] | None:
        found = self._one(f"SELECT p.sealed, {_RECORD_COLS_R} FROM projections p JOIN records r "
                          "ON r.record_id = p.record_id WHERE p.record_id = %s", [record_id])
        return (found[0], record_of(found[1:])) if found is not None else None

    def scope_projection_blobs(self, tenant: str, workspace: str) -> list[tuple[RecordRow, bytes]]:
        self._touch(tenant, workspace)
        return [(record_of(found[1:]), found[0]) for found in self._query(
            f"SELECT p.sealed, {_RECORD_COLS_R} FROM projections p JOIN records r ON r.record_id = p.record_id "
            "WHERE p.tenant = %s AND p.workspace = %s ORDER BY r.doc", [tenant, workspace])]

    def update_projection_blobs(self, blobs: list[tuple[str, bytes]]) -> None:
        for chunk in iter_chunks(blobs, 2048):
            self._write("UPDATE projections SET sealed = u.sealed FROM unnest(%s::text[], %s::bytea[]) "
                        "AS u(record_id, sealed) WHERE projections.record_id = u.record_id",
                        [[r for r, _ in chunk], [b for _, b in chunk]])

    def drop_scope_projections(self, tenant: str, workspace: str) -> None:
        self._touch(tenant, workspace)
        self._write("DELETE FROM projections WHERE tenant = %s AND workspace = %s", [tenant, workspace])

    # -- audit rows ---------------------------------------------------------------------------------------------------------
    def audit_heads(self, chains: list[str]) -> dict[str, tuple[int, str]]:
        """Each chain's head, locked for this transaction: a scope's chain was locked with its scope
        row; any other is inserted if absent and locked now (one round trip for all of them)."""
        missing = sorted(c for c in chains if c not in self._heads)
        if missing:
            def locked(rows: list[tuple[Any, ...]]) -> None:
                for chain, seq, digest in rows:
                    self._heads[chain] = (int(seq), digest)

            try:
                self._send([
                    _Statement("INSERT INTO audit_heads VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
                               [[c, GENESIS] for c in missing], many=True),
                    _Statement("SELECT chain, seq, row_digest FROM audit_heads WHERE chain = ANY(%s) ORDER BY chain "
                               "FOR UPDATE", [missing], on_rows=locked),
                ])
            except psycopg.Error as exc:
                raise self._store_error(exc) from None
        return {c: self._heads.get(c, (0, GENESIS)) for c in chains}

    def put_page_pin(self, pin: SharedPin) -> None:
        """A search pin every core reads (``page_pins``), written with this transaction: a
        standalone audit row's (``StoreKernel.append_audit``), so it costs no round trip."""
        self._write("INSERT INTO page_pins VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [pin.pin_id, pin.tenant, pin.workspace, pin.pin, pin.expires_at_ms])

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        if not docs:
            return
        self._write(_INSERT_AUDIT + (" ON CONFLICT DO NOTHING" if if_absent else ""),
                    [_audit_values(d) for d in docs], many=True)
        last: dict[str, tuple[int, str]] = {}
        for d in docs:
            chain = d.get("chain", LEGACY_CHAIN)
            if chain not in last or int(d["seq"]) > last[chain][0]:
                last[chain] = (int(d["seq"]), d["row_digest"])
        self._write(_UPSERT_HEAD, [[c, s, g] for c, (s, g) in sorted(last.items())], many=True)
        for chain, head in last.items():
            if chain in self._heads and head[0] > self._heads[chain][0]:
                self._heads[chain] = head

    def audit_rows(self, tenant: str | None, workspace: str | None, from_seq: int,
                   to_seq: int | None) -> list[dict[str, Any]]:
        # Audit rows are only ever appended: reading them needs no scope lock.
        sql = f"SELECT {', '.join(_AUDIT_KEYS)} FROM audit WHERE seq >= %s AND seq <= %s"
        params: list[Any] = [from_seq, to_seq if to_seq is not None else MAX_BIGINT]
        if tenant is not None:
            sql += " AND tenant = %s AND workspace = %s"
            params += [tenant, workspace]
        return [_audit_doc(r) for r in self._query(sql + " ORDER BY chain, seq", params)]

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        return [(r[0], int(r[1])) for r in self._query(
            "SELECT context_nonce, at_ms FROM audit WHERE at_ms >= %s AND context_nonce <> ''", [since_ms])]

    def all_audit_heads(self) -> dict[str, tuple[int, str]]:
        return {r[0]: (int(r[1]), r[2]) for r in self._query(
            "SELECT chain, seq, row_digest FROM audit_heads WHERE seq > 0")}

    # -- trusted host keys, metadata, the store as a whole --------------------------------------------------------------------
    def trusted_host_keys(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._query("SELECT key_id, public_key_pem FROM trusted_host_keys ORDER BY key_id")]

    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        """Trust the key if it is not stored yet; a key stored so serves nothing until bound."""
        self._write("INSERT INTO trusted_host_keys (key_id, public_key_pem, added_at_ms) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING", [key_id, pem, at_ms])

    def host_key_rows(self) -> list[HostKeyRow]:
        rows = self._query("SELECT key_id, public_key_pem, added_at_ms, tenants, all_tenants, maintenance_scopes "
                           "FROM trusted_host_keys ORDER BY key_id")
        return [HostKeyRow(key_id=r[0], public_key_pem=r[1], added_at_ms=int(r[2]),
                           tenants=tuple(json.loads(r[3] or "[]")), all_tenants=bool(r[4]),
                           maintenance_scopes=tuple(json.loads(r[5] or "[]"))) for r in rows]

    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        self._write("INSERT INTO trusted_host_keys (key_id, public_key_pem, added_at_ms, tenants, all_tenants, "
                    "maintenance_scopes) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key_id) DO UPDATE SET "
                    "tenants = excluded.tenants, all_tenants = excluded.all_tenants, "
                    "maintenance_scopes = excluded.maintenance_scopes",
                    [row.key_id, row.public_key_pem, row.added_at_ms, json.dumps(list(row.tenants)),
                     row.all_tenants, json.dumps(list(row.maintenance_scopes))])

    def remove_trusted_host_key(self, key_id: str) -> bool:
        return bool(self._query("DELETE FROM trusted_host_keys WHERE key_id = %s RETURNING 1", [key_id]))

    def meta(self, key: str) -> str | None:
        row = self._one("SELECT v FROM store_meta WHERE k = %s", [key])
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._write("INSERT INTO store_meta VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", [key, value])

    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        return dict(self._query("SELECT k, v FROM store_meta WHERE starts_with(k, %s)", [prefix]))  # type: ignore[arg-type]

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def is_empty(self) -> bool:
        """True when nothing but trusted host keys and metadata was ever written (a restore target)."""
        tables = ("scopes", "journal", "records", "candidates", "audit", "tombstones", "data_keys")
        row = self._one("SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {t})" for t in tables))
        return not (row and row[0])

    def counts(self, estimates: dict[str, float] | None = None) -> dict[str, Any]:
        """What the store holds, for the start-up summary: scopes, records and candidates by state.
        A table ``estimates`` (planner row estimates by table) puts above ``EXACT_COUNTS_UP_TO`` is
        reported by its estimate (``"~N"``, without its split by state) instead of counted."""
        def count(table: str, *, by_state: bool) -> Any:
            estimate = (estimates or {}).get(table, 0)
            if estimate > EXACT_COUNTS_UP_TO:
                return {"all": f"~{int(estimate)}"} if by_state else f"~{int(estimate)}"
            if by_state:
                return dict(self._query(f"SELECT state, count(*) FROM {table} GROUP BY state ORDER BY state"))
            return int(self._one(f"SELECT count(*) FROM {table}")[0])  # type: ignore[index]

        return {"scopes": count("scopes", by_state=False), "records": count("records", by_state=True),
                "candidates": count("candidates", by_state=True), "audit_rows": count("audit", by_state=False)}


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
        return self._stream("engram_index_rows", f"SELECT {_RECORD_COLS_R} FROM records r WHERE EXISTS "
                            "(SELECT 1 FROM projections p WHERE p.record_id = r.record_id) ORDER BY r.doc")

    def projection_blobs(self) -> Iterator[tuple[str, bytes]]:
        return self._stream("engram_index_blobs", "SELECT record_id, sealed FROM projections")  # type: ignore[return-value]

    def scopes(self) -> dict[tuple[str, str], ScopeRow]:
        return {(r[0], r[1]): _scope(r) for r in self._conn.execute(f"SELECT {_SCOPE_COLS} FROM scopes").fetchall()}


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

    scope: tuple[str, str]
    turns: threading.Condition
    busy: bool = False
    queued: int = 0
    batch: _Batch | None = None


class PostgresEngine:
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
        self._lanes: dict[tuple[str, str], _Lane] = {}  # group commit, per scope (``_member``)
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
    def _getconn(self) -> psycopg.Connection:
        return self._pool.get()

    def _putconn(self, conn: psycopg.Connection) -> None:
        self._pool.put(conn)

    def _discard(self, conn: psycopg.Connection) -> None:
        self._pool.discard(conn)

    def set_hooks(self, hooks: CommitHooks, observers: StoreObservers) -> None:
        self._hooks = hooks
        self.observers = observers

    @property
    def on_commit(self) -> Any:
        """``observers.on_commit`` (tests watch commits through it)."""
        return self.observers.on_commit

    @on_commit.setter
    def on_commit(self, callback: Any) -> None:
        self.observers.on_commit = callback

    def reload(self) -> None:
        """Nothing: the engine keeps no copy of anything another core can change."""

    # -- migrations -----------------------------------------------------------------------------------------------------
    def check_migrations(self, *, apply: bool) -> list[int]:
        """Verify the ledger against the code and apply what is missing (``apply``), holding the
        migration advisory lock: engines opening one database together apply each migration once,
        the second waiting for the first and then finding it applied."""
        conn = self._getconn()
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK])
            try:
                return self._migrate_locked(conn, apply=apply)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK])
        except psycopg.Error as exc:
            raise EngramError(Code.STORE_UNAVAILABLE, f"migration failed: {failure(exc)}") from None
        finally:
            self._putconn(conn)

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
            rows = tx._query("SELECT version, name, checksum, applied_at_ms FROM schema_migrations ORDER BY version")
        return [{"version": r[0], "name": r[1], "checksum": r[2], "applied_at_ms": r[3]} for r in rows]

    # -- transactions ---------------------------------------------------------------------------------------------------
    def _require_open(self) -> None:
        if not self._open:
            raise EngramError(Code.STORE_UNAVAILABLE, "store closed")

    def autocommit(self, statements: Sequence[tuple[str, Sequence[Any], bool]]) -> list[list[tuple[Any, ...]]]:
        """Statements on their own, outside any transaction of the caller's, in one round trip
        (the shared state's: ``shared_state.py``): each ``(sql, params, durable)`` committed in a
        transaction of its own, in order; ``durable`` False: committed with ``synchronous_commit =
        off`` (``_unflushed``), for rows a database crash may take back without harm. The rows of each."""
        self._require_open()
        out: list[list[tuple[Any, ...]]] = [[] for _ in statements]
        batch: list[_Statement] = []
        for i, (sql, params, durable) in enumerate(statements):
            statement = _Statement(sql, params, on_rows=out[i].extend)
            batch += [statement] if durable else _unflushed(statement)
        with self.read(snapshot=False) as tx:
            try:
                tx._send(batch)
            except psycopg.Error as exc:
                raise tx._store_error(exc) from None
        return out

    def in_write(self) -> bool:
        return getattr(self._local, "writing", False)

    @contextmanager
    def write(self, *, batched: bool = False, effects: TxEffects | None = None,
              scope: tuple[str, str] | None = None) -> Iterator[PostgresEngineTx]:
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
    def _turn(self, scope: tuple[str, str]) -> _Lane:
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

    def _member(self, scope: tuple[str, str], effects: TxEffects) -> Iterator[PostgresEngineTx]:
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

    @contextmanager
    def read(self, *, snapshot: bool = True) -> Iterator[PostgresEngineTx]:
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
        conn = self._getconn()
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield _IndexScan(conn)
            conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            self._discard(conn)
            raise EngramError(Code.STORE_UNAVAILABLE, f"index scan failed: {failure(exc)}") from None
        except BaseException:
            self._discard(conn)  # left inside its transaction: not handed out again
            raise
        self._putconn(conn)

    def scope_now(self, tenant: str, workspace: str) -> ScopeRow | None:
        with self.read(snapshot=False) as tx:
            return tx.scope(tenant, workspace)

    def changes_since(self, tenant: str, workspace: str, after: int) -> ScopeChanges:
        """The scope row, the journal after ``after``, and the rows, sealed projections and
        wrapped data keys of the records those events name, in one round trip of two statements
        (the second reads each event with its records). Each statement sees the latest commit, so
        the events may go past the row's head: the index is then newer than the row, which
        ``StoreKernel.committed_scope`` allows. (The records were a second round trip after the
        events until 2026-12-05; a snapshot, the events, the rows and each projection one after
        the other were five before that.)"""
        with self.read(snapshot=False) as tx:
            try:
                scope: list[list[tuple[Any, ...]]] = []
                journal: list[list[tuple[Any, ...]]] = []
                tx._send([_Statement(f"SELECT {_SCOPE_COLS} FROM scopes WHERE tenant = %s AND workspace = %s",
                                     [tenant, workspace], on_rows=scope.append),
                          _Statement(_EVENTS_WITH_RECORDS, [tenant, workspace, after + 1, MAX_BIGINT],
                                     on_rows=journal.append)])
            except psycopg.Error as exc:
                raise tx._store_error(exc) from None
        if not scope[0]:
            return ScopeChanges(None, [], {}, {})
        row = _scope(scope[0][0])
        events: list[Event] = []
        rows: dict[str, RecordRow] = {}
        blobs: dict[str, bytes] = {}
        keys: dict[int, WrappedKey] = {}
        for r in journal[0]:
            if not events or events[-1].cursor != int(r[2]):
                events.append(_event(r))
            found = r[_EVENT_WIDTH:]
            if found[0] is None or found[1] != tenant or found[2] != workspace:
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
                tx._send([_Statement("ANALYZE")])
            except psycopg.Error as exc:
                raise tx._store_error(exc) from None

    def describe(self) -> dict[str, Any]:
        """The start-up summary. Exact counts scan their tables, so a table the planner's
        statistics put above ``EXACT_COUNTS_UP_TO`` rows is reported by that estimate instead
        (``"~N"``; records and candidates then without their split by state): a core over a very
        large store starts without reading it all."""
        with self.read() as tx:
            estimates = {name: float(n) for name, n in tx._query(
                "SELECT relname, reltuples FROM pg_class WHERE relkind = 'r' AND relnamespace = "
                "current_schema()::regnamespace AND relname = ANY(%s)", [["records", "candidates", "audit"]])}
            counts = tx.counts(estimates)
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
