"""The PostgreSQL engine's transaction (``engine.EngineTx``): one pooled connection, the scope
rows it touches locked at first touch, writes buffered and sent in pipelines (the engine module's
docstring, ``engine.py``, explains the locking and the round trips). What its SQL shares with
DuckDB's is ``engram_core/store/sql/``; its own statements are ``statements.py``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import psycopg

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.chain import GENESIS, chain_of, scope_chain
from engram_core.store.port import (
    CandidateRow,
    Event,
    IdempotencyRow,
    RecordRow,
    ScopeRow,
    SharedPin,
    iter_chunks,
)
from engram_core.store.postgres.migrations import MIGRATIONS
from engram_core.store.postgres.pool import failure
from engram_core.store.postgres.statements import (
    CANDIDATE_BY_ID,
    DERIVATIVES,
    EVENT_BY_ID,
    EVENTS_BETWEEN,
    FAMILY_MEMBERS,
    INSERT_AUDIT,
    MAX_BIGINT,
    PAYLOAD_STANDING,
    RECORD_BY_ID,
    RECORD_COLS_R,
    RECORDS_BY_ID,
    UPSERT_HEAD,
    Mark,
    ScopeLock,
    Statement,
    WritesAhead,
    conflict,
    frozen,
    text_key,
)
from engram_core.store.sql.codecs import (
    CANDIDATE_COLS,
    CANDIDATE_WIDTH,
    EVENT_COLS,
    RECORD_COLS,
    RECORD_WIDTH,
    SCOPE_COLS,
    audit_values,
    candidate_of,
    candidate_values,
    event_of,
    event_values,
    record_of,
    record_values,
    scope_of,
)
from engram_core.store.sql.dialect import POSTGRES
from engram_core.store.sql.rows import SqlRows

SCHEMA_VERSION = max(m.version for m in MIGRATIONS)  # what this engine writes
FLUSH_STATEMENTS = 256  # buffered statements sent early (a long maintenance transaction)
FLUSH_IDLE_S = 5.0  # buffered statements sent early once the server has not heard from us this long
log = logging.getLogger("engram_core.store.postgres.engine")  # the engine's log, as before the split
_INSERT_EVENT = f"INSERT INTO journal ({EVENT_COLS}) VALUES ({', '.join(['%s'] * 12)})"


class Connections(Protocol):
    """What a transaction uses of its engine (``engine.PostgresEngine``): the pool's connections."""

    def getconn(self) -> psycopg.Connection: ...
    def putconn(self, conn: psycopg.Connection) -> None: ...
    def discard(self, conn: psycopg.Connection) -> None: ...


class PostgresEngineTx(SqlRows):
    """Persistence over one pooled connection inside one transaction (``engine.EngineTx``).

    ``mode``: "write" (READ COMMITTED, scope rows locked at first touch, writes buffered),
    "snapshot" (REPEATABLE READ READ ONLY) or "latest" (each statement in autocommit)."""

    dialect = POSTGRES
    update_blobs_sql = ("UPDATE projections SET sealed = u.sealed FROM unnest(%s::text[], %s::bytea[]) "
                        "AS u(record_id, sealed) WHERE projections.record_id = u.record_id")

    def __init__(self, engine: Connections, mode: str) -> None:
        self._engine = engine
        self._mode = mode
        self._writing = mode == "write"
        self._conn: psycopg.Connection | None = None
        self._begun = False
        self._pending: list[Statement] = []
        self._scopes: dict[tuple[str, str], ScopeLock] = {}
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
        self._recording: list[Statement] | None = None
        self._ahead: dict[tuple[str, Any], list[tuple[Any, ...]]] = {}

    # -- the connection and round trips -------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None:
            self._conn = self._engine.getconn()
        return self._conn

    def _begin_statement(self) -> Statement | None:
        if self._begun or self._mode == "latest":
            return None
        self._begun = True
        if self._mode == "write":
            # Explicit, whatever default_transaction_isolation the database was given.
            return Statement("BEGIN ISOLATION LEVEL READ COMMITTED")
        return Statement("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _scope_updates(self) -> list[Statement]:
        out = []
        for lock in self._scopes.values():
            if lock.dirty and lock.row is not None:
                r = lock.row
                out.append(Statement(
                    "UPDATE scopes SET activated = %s, tools = %s, authorization_epoch = %s, last_cursor = %s, "
                    "last_event_digest = %s WHERE tenant = %s AND workspace = %s",
                    [r.activated, json.dumps(sorted(r.tools)), r.authorization_epoch, r.last_cursor,
                     r.last_event_digest, r.tenant, r.workspace]))
                lock.dirty = False
        return out

    def send(self, statements: list[Statement], *, commit: bool = False) -> None:
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
            self._engine.discard(conn)
            self._conn = conn = self._engine.getconn()
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
    def _pipeline(conn: psycopg.Connection, batch: list[Statement]) -> list[psycopg.Cursor]:
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
        recorded: list[Statement] = []
        self._recording = recorded
        try:
            for read in reads:
                try:
                    read()
                except WritesAhead:
                    raise
                except Exception:  # noqa: BLE001 - a read that cannot take "no rows" is just not read ahead
                    pass
        finally:
            self._recording = None
        if not recorded:
            return
        try:
            self.send(recorded)
        except psycopg.Error as exc:
            raise self.store_error(exc) from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement, in one round trip with everything buffered before it (or as
        read ahead)."""
        if self._ahead or self._recording is not None:  # else no statement is read ahead: no key to make
            key = (sql, frozen(params))
            if key in self._ahead:
                return self._ahead.pop(key)
            if self._recording is not None:
                self._recording.append(Statement(sql, params,
                                                  on_rows=lambda rows: self._ahead.setdefault(key, rows)))
                return []
        out: list[list[tuple[Any, ...]]] = []
        try:
            self.send([Statement(sql, params, on_rows=out.append)])
        except psycopg.Error as exc:
            raise self.store_error(exc) from None
        return out[0]

    query = _query  # (the engine reads through it)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self._query(sql, params)
        return rows[0] if rows else None

    def store_error(self, exc: psycopg.Error) -> EngramError:
        self.failed = True
        if conflict(exc):
            return EngramError(Code.STORE_UNAVAILABLE, f"write conflict, retry: {failure(exc)}")
        return EngramError(Code.STORE_UNAVAILABLE, f"store statement failed: {failure(exc)}")

    def _write(self, sql: str, params: Sequence[Any] = (), *, many: bool = False) -> None:
        """A write: buffered until the next round trip (a read, or the COMMIT)."""
        if self._recording is not None:
            raise WritesAhead("read_ahead is for reads: this call writes")
        if not self._writing:
            raise EngramError(Code.STORE_UNAVAILABLE, "write outside a write transaction")
        self._pending.append(Statement(sql, params, many=many))
        if len(self._pending) >= FLUSH_STATEMENTS or time.monotonic() - self._last_sent > FLUSH_IDLE_S:
            try:
                self.send([])
            except psycopg.Error as exc:
                raise self.store_error(exc) from None

    # -- members of a scope's batch (PostgresEngine.write, batched) ------------------------------------------
    def _sql_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._query(sql, params)

    def _sql_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._one(sql, params)

    def _sql_exec(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._write(sql, params)

    def member_begin(self, n: int) -> Mark:
        """A batch's member ``n`` (1, 2, …) starts after those before it: a savepoint (sent with
        its first round trip, so it costs none) and a copy of what this object holds in memory."""
        self._ahead.clear()  # reads ahead that an earlier member did not use are not this one's
        if any(not lock.known for lock in self._scopes.values()) or any(st.on_rows for st in self._pending):
            # Answers still owed to what the copy below holds: have them first.
            try:
                self.send([])
            except psycopg.Error as exc:
                raise self.store_error(exc) from None
        self._pending += self._scope_updates()  # earlier members' scope rows go before the savepoint
        name = f"member_{n}"
        self._pending.append(Statement(f"SAVEPOINT {name}"))
        return Mark(name, len(self._pending), self.round_trips,
                     {k: replace(lock) for k, lock in self._scopes.items()}, dict(self._heads), set(self._seen))

    def member_undo(self, mark: Mark) -> bool:
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
        self._pending = [Statement(f"ROLLBACK TO SAVEPOINT {mark.savepoint}")]
        self.failed = False
        try:
            self.send([])
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
                self._pending.append(Statement("DELETE FROM scopes WHERE tenant = %s AND workspace = %s",
                                                [tenant, workspace]))
        if not self._begun and not self._pending and not any(lock.dirty for lock in self._scopes.values()):
            return  # nothing ever reached the server
        try:
            self.send([Statement("COMMIT")], commit=True)
        except psycopg.Error as exc:
            self.failed = True
            conn = self._conn
            if (getattr(exc, "sqlstate", None) and conn is not None and not conn.broken
                    and conn.pgconn.status == psycopg.pq.ConnStatus.OK):
                # The server answered with an error and the session lives on: a statement failed and
                # the COMMIT never ran, or the COMMIT itself failed; nothing of the transaction happened.
                # A fatal error (the session ended) may have come after the commit was written.
                raise self.store_error(exc) from None
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
            self._engine.discard(conn)

    def release(self) -> None:
        """Give the connection back to the pool: idle, or discarded (broken, or a transaction it
        could not end)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.broken or conn.closed:
            self._engine.discard(conn)
            return
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._engine.discard(conn)
                return
        self._engine.putconn(conn)

    def scope_changes(self) -> dict[tuple[str, str], ScopeRow]:
        """The rows of the scopes this transaction wrote, as it committed them."""
        return {k: lock.row for k, lock in self._scopes.items() if lock.row is not None and lock.materialized}

    # -- scope locks -------------------------------------------------------------------------------------------------
    def _touch(self, scope: Scope) -> ScopeLock | None:
        """In a write transaction: lock the scope with the next round trip (it goes before anything
        queued after this), once. Elsewhere: nothing."""
        if not self._writing:
            return None
        key = (scope.tenant, scope.workspace)
        lock = self._scopes.get(key)
        if lock is not None:
            return lock
        lock = self._scopes[key] = ScopeLock()
        self._locking = True

        def inserted(rows: list[tuple[Any, ...]]) -> None:
            lock.created = bool(rows)

        def locked(rows: list[tuple[Any, ...]]) -> None:
            lock.row, lock.known = scope_of(rows[0]), True

        def head(rows: list[tuple[Any, ...]]) -> None:
            if rows:
                self._heads[scope_chain(scope.tenant, scope.workspace)] = (int(rows[0][0]), rows[0][1])

        self._pending += [
            Statement("INSERT INTO scopes VALUES (%s, %s, false, '[]', 0, 0, %s) ON CONFLICT DO NOTHING RETURNING true",
                       [scope.tenant, scope.workspace, GENESIS], on_rows=inserted),
            Statement(f"SELECT {SCOPE_COLS} FROM scopes WHERE tenant = %s AND workspace = %s FOR UPDATE",
                       [scope.tenant, scope.workspace], on_rows=locked),
            # The head of the scope's audit chain, which this transaction's audit rows will extend
            # (created with the chain: the first audit row of a scope costs no round trip either).
            Statement("INSERT INTO audit_heads VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
                       [scope_chain(scope.tenant, scope.workspace), GENESIS]),
            Statement("SELECT seq, row_digest FROM audit_heads WHERE chain = %s FOR UPDATE",
                       [scope_chain(scope.tenant, scope.workspace)], on_rows=head),
        ]
        return lock

    def _lock(self, scope: Scope) -> ScopeLock:
        """The scope locked and its row known (a round trip if it was not yet)."""
        lock = self._touch(scope)
        if lock is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "a scope change outside a write transaction")
        if not lock.known and self._recording is None:  # read ahead: the lock goes with the reads
            try:
                self.send([])
            except psycopg.Error as exc:
                raise self.store_error(exc) from None
        return lock

    def _guard_id(self, table: str, id_col: str, value: str) -> None:
        """A write naming only a row's id, in a transaction that did not reach that row through its
        scope: lock the row's scope in the same round trip as the write."""
        if value in self._seen or not self._writing:
            return
        self._locking = True
        self._pending.append(Statement(
            f"SELECT 1 FROM scopes s JOIN {table} x ON s.tenant = x.tenant AND s.workspace = x.workspace "
            f"WHERE x.{id_col} = %s FOR UPDATE OF s", [value]))
        self._seen.add(value)

    def _by_id(self, sql: str, row_id: str, scope: Scope) -> tuple[Any, ...] | None:
        """A candidate's or record's row by its id, read through its scope: found, its id is one a
        later write naming only the id needs no scope lock for (``_guard_id``)."""
        self._touch(scope)
        row = self._one(sql, [row_id, scope.tenant, scope.workspace])
        if row is not None:
            self._seen.add(row_id)
        return row

    # -- scopes and the journal ----------------------------------------------------------------------------------------
    def scope(self, scope: Scope) -> ScopeRow | None:
        if self._writing:
            lock = self._lock(scope)
            return lock.row if lock.materialized or not lock.created else None
        row = self._one(f"SELECT {SCOPE_COLS} FROM scopes WHERE tenant = %s AND workspace = %s", [scope.tenant, scope.workspace])
        return scope_of(row) if row else None

    def scope_for_update(self, scope: Scope) -> ScopeRow:
        if not self._writing:
            raise EngramError(Code.STORE_UNAVAILABLE, "scope_for_update outside a write transaction")
        if self._recording is not None:
            raise WritesAhead("read_ahead is for reads: this call changes the scope")
        lock = self._lock(scope)
        lock.materialized = True
        assert lock.row is not None
        return lock.row

    def _change(self, scope: Scope, **changes: Any) -> ScopeRow:
        lock = self._lock(scope)
        assert lock.row is not None
        lock.row = replace(lock.row, **changes)
        lock.materialized = lock.dirty = True
        return lock.row

    def scopes(self) -> list[ScopeRow]:
        # Not locked: listing scopes is not a statement about each of them. This transaction's own
        # changes (and rows it only created to lock) are as it sees them.
        rows = {(r[0], r[1]): scope_of(r) for r in self._query(f"SELECT {SCOPE_COLS} FROM scopes")}
        for key, lock in self._scopes.items():
            if lock.created and not lock.materialized:
                rows.pop(key, None)
            elif lock.row is not None:
                rows[key] = lock.row
        return [rows[k] for k in sorted(rows)]

    def set_activation(self, scope: Scope, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        return self._change(scope, activated=activated, tools=tuple(sorted(tools)))

    def bump_epoch(self, scope: Scope) -> int:
        row = self._lock(scope).row
        assert row is not None
        return self._change(scope, authorization_epoch=row.authorization_epoch + 1).authorization_epoch

    def insert_event(self, e: Event) -> None:
        scope = self.scope_for_update(Scope(e.tenant, e.workspace))
        if e.cursor != scope.last_cursor + 1 or e.prev_digest != scope.last_event_digest:
            raise EngramError(Code.STORE_UNAVAILABLE, "journal event does not follow the scope head")
        self._write(_INSERT_EVENT, event_values(e))
        self._change(Scope(e.tenant, e.workspace), last_cursor=e.cursor, last_event_digest=e.event_digest)

    def set_scope_head(self, scope: Scope, cursor: int, event_digest: str) -> None:
        self._change(scope, last_cursor=cursor, last_event_digest=event_digest)

    def events(self, scope: Scope, from_cursor: int, to_cursor: int | None) -> list[Event]:
        self._touch(scope)
        rows = self._query(EVENTS_BETWEEN,
                           [scope.tenant, scope.workspace, from_cursor, to_cursor if to_cursor is not None else MAX_BIGINT])
        return [event_of(r) for r in rows]

    def event_by_id(self, scope: Scope, event_id: str) -> Event | None:
        self._touch(scope)
        row = self._one(EVENT_BY_ID, [scope.tenant, scope.workspace, event_id])
        return event_of(row) if row else None

    def restore_scope(self, row: ScopeRow) -> None:
        lock = self._lock(Scope(row.tenant, row.workspace))
        if not lock.created or lock.materialized:
            raise EngramError(Code.STORE_UNAVAILABLE, "restore of a scope the store already holds")
        lock.row = replace(row, tools=tuple(sorted(row.tools)))
        lock.materialized = lock.dirty = True

    def restore_event(self, e: Event) -> None:
        self._touch(Scope(e.tenant, e.workspace))
        self._write(_INSERT_EVENT, event_values(e))

    # -- idempotency, confirmations, tombstones -------------------------------------------------------------------------
    # (text_key: an idempotency key is any NFC text of 16-256 bytes, NUL included, which a
    # PostgreSQL text column cannot hold.)
    def idempotency_get(self, scope: Scope, principal: str, key: str) -> IdempotencyRow | None:
        self._touch(scope)
        row = self._one("SELECT tool, target, request_digest, outcome FROM idempotency "
                        "WHERE tenant = %s AND workspace = %s AND principal = %s AND key = %s",
                        [scope.tenant, scope.workspace, principal, text_key(key)])
        return IdempotencyRow(row[0], row[1], row[2], json.loads(row[3])) if row else None

    def idempotency_put(self, scope: Scope, principal: str, key: str, row: IdempotencyRow,
                        at_ms: int) -> None:
        self._touch(scope)
        # A plain INSERT: the primary key refuses a second outcome for one key (it never commits).
        self._write("INSERT INTO idempotency VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [scope.tenant, scope.workspace, principal, text_key(key), row.tool, row.target, row.request_digest,
                     json.dumps(row.outcome, sort_keys=True), at_ms])

    def use_confirmation(self, grant_id: str, scope: Scope, at_ms: int) -> bool:
        self._touch(scope)
        # Insert-if-absent decides, not a read before it: a grant is used once across every core.
        return bool(self._query("INSERT INTO used_confirmations VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING "
                                "RETURNING true", [grant_id, scope.tenant, scope.workspace, at_ms]))

    def add_tombstone(self, scope: Scope, payload_digest: str, record_id: str, cursor: int,
                      at_ms: int) -> None:
        self._touch(scope)
        self._write("INSERT INTO tombstones VALUES (%s, %s, %s, %s, %s, %s)",
                    [scope.tenant, scope.workspace, payload_digest, record_id, cursor, at_ms])

    def tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        self._touch(scope)
        return self._one("SELECT 1 FROM tombstones WHERE tenant = %s AND workspace = %s AND payload_digest = %s "
                         "LIMIT 1", [scope.tenant, scope.workspace, payload_digest]) is not None

    # -- candidates ------------------------------------------------------------------------------------------------------
    def insert_candidate(self, row: CandidateRow) -> None:
        self._touch(Scope(row.tenant, row.workspace))
        self._seen.add(row.candidate_id)
        self._write(f"INSERT INTO candidates ({CANDIDATE_COLS}) VALUES ({', '.join(['%s'] * CANDIDATE_WIDTH)})",
                    candidate_values(row))

    def scrub_candidate_facts(self, candidate_id: str) -> None:
        self._write("UPDATE candidates SET facts = '{}' WHERE candidate_id = %s", [candidate_id])

    def candidate(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        row = self._by_id(CANDIDATE_BY_ID, candidate_id, scope)
        return candidate_of(row) if row is not None else None

    def candidates_in_state(self, scope: Scope, state: str) -> list[CandidateRow]:
        self._touch(scope)
        rows = [candidate_of(r) for r in self._query(
            f"SELECT {CANDIDATE_COLS} FROM candidates WHERE tenant = %s AND workspace = %s AND state = %s "
            "ORDER BY cursor, candidate_id", [scope.tenant, scope.workspace, state])]
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
        self._touch(Scope(row.tenant, row.workspace))
        self._seen.add(row.record_id)
        self._write(f"INSERT INTO records ({RECORD_COLS}) VALUES ({', '.join(['%s'] * RECORD_WIDTH)})", record_values(row))

    def record(self, scope: Scope, record_id: str) -> RecordRow | None:
        row = self._by_id(RECORD_BY_ID, record_id, scope)
        return record_of(row) if row is not None else None

    def records(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]:
        if not record_ids:
            return {}
        self._touch(scope)
        out = {}
        for chunk in iter_chunks(record_ids, 1000):
            for r in self._query(RECORDS_BY_ID, [chunk, scope.tenant, scope.workspace]):
                out[r[0]] = record_of(r)
        self._seen.update(out)
        return out

    def scope_records(self, scope: Scope, states: tuple[str, ...] | None = None) -> list[RecordRow]:
        self._touch(scope)
        sql = f"SELECT {RECORD_COLS} FROM records WHERE tenant = %s AND workspace = %s"
        params: list[Any] = [scope.tenant, scope.workspace]
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

    def payload_standing(self, scope: Scope, payload_digest: str) -> tuple[str | None, bool]:
        self._touch(scope)
        rows = self._query(PAYLOAD_STANDING, [scope.tenant, scope.workspace, payload_digest] * 2)
        current = min(((int(r[1]), r[2]) for r in rows if not r[3] and r[0] == "accepted_current"),
                      default=(0, None))[1]
        return current, any(r[3] for r in rows)

    # -- record links -------------------------------------------------------------------------------------------------------
    def add_record_links(self, scope: Scope, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None:
        self._touch(scope)
        if family_refs:
            self._write("INSERT INTO record_families VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [[scope.tenant, scope.workspace, ref, record_id, primary_kind] for ref in family_refs], many=True)
        if source_ids:
            self._write("INSERT INTO record_sources VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [[scope.tenant, scope.workspace, source, record_id] for source in source_ids], many=True)

    def drop_record_links(self, record_id: str) -> None:
        self._guard_id("records", "record_id", record_id)
        self._write("DELETE FROM record_families WHERE record_id = %s", [record_id])
        self._write("DELETE FROM record_sources WHERE record_id = %s OR source_id = %s", [record_id, record_id])

    def family_members(self, scope: Scope, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]:
        if not family_refs:
            return []
        self._touch(scope)
        rows = self._query(FAMILY_MEMBERS, [scope.tenant, scope.workspace, list(family_refs), list(states), scope.tenant, scope.workspace])
        out = [(record_of(r), r[RECORD_WIDTH], list(r[RECORD_WIDTH + 1])) for r in rows]
        self._seen.update(m[0].record_id for m in out)
        return out

    def derivatives(self, scope: Scope, source_id: str) -> list[RecordRow]:
        self._touch(scope)
        rows = [record_of(r) for r in self._query(DERIVATIVES, [scope.tenant, scope.workspace, source_id, scope.tenant, scope.workspace])]
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

    # -- sealed projections ---------------------------------------------------------------------------------------------------
    def put_projection(self, scope: Scope, record_id: str, sealed: bytes, *, new: bool) -> None:
        self._touch(scope)
        if new:
            self._write("INSERT INTO projections VALUES (%s, %s, %s, %s)", [record_id, scope.tenant, scope.workspace, sealed])
        else:
            self._write("INSERT INTO projections VALUES (%s, %s, %s, %s) ON CONFLICT (record_id) DO UPDATE SET "
                        "tenant = EXCLUDED.tenant, workspace = EXCLUDED.workspace, sealed = EXCLUDED.sealed",
                        [record_id, scope.tenant, scope.workspace, sealed])

    def delete_projection(self, record_id: str) -> None:
        self._guard_id("records", "record_id", record_id)
        self._write("DELETE FROM projections WHERE record_id = %s", [record_id])

    def projection_blob(self, record_id: str) -> tuple[bytes, RecordRow] | None:
        found = self._one(f"SELECT p.sealed, {RECORD_COLS_R} FROM projections p JOIN records r "
                          "ON r.record_id = p.record_id WHERE p.record_id = %s", [record_id])
        return (found[0], record_of(found[1:])) if found is not None else None

    def scope_projection_blobs(self, scope: Scope) -> list[tuple[RecordRow, bytes]]:
        self._touch(scope)
        return [(record_of(found[1:]), found[0]) for found in self._query(
            f"SELECT p.sealed, {RECORD_COLS_R} FROM projections p JOIN records r ON r.record_id = p.record_id "
            "WHERE p.tenant = %s AND p.workspace = %s ORDER BY r.doc", [scope.tenant, scope.workspace])]

    def drop_scope_projections(self, scope: Scope) -> None:
        self._touch(scope)
        self._write("DELETE FROM projections WHERE tenant = %s AND workspace = %s", [scope.tenant, scope.workspace])

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
                self.send([
                    Statement("INSERT INTO audit_heads VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",
                               [[c, GENESIS] for c in missing], many=True),
                    Statement("SELECT chain, seq, row_digest FROM audit_heads WHERE chain = ANY(%s) ORDER BY chain "
                               "FOR UPDATE", [missing], on_rows=locked),
                ])
            except psycopg.Error as exc:
                raise self.store_error(exc) from None
        return {c: self._heads.get(c, (0, GENESIS)) for c in chains}

    def put_page_pin(self, pin: SharedPin) -> None:
        """A search pin every core reads (``page_pins``), written with this transaction: a
        standalone audit row's (``StoreKernel.append_audit``), so it costs no round trip."""
        self._write("INSERT INTO page_pins VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [pin.pin_id, pin.tenant, pin.workspace, pin.pin, pin.expires_at_ms])

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        if not docs:
            return
        self._write(INSERT_AUDIT + (" ON CONFLICT DO NOTHING" if if_absent else ""),
                    [audit_values(d) for d in docs], many=True)
        last: dict[str, tuple[int, str]] = {}
        for d in docs:
            chain = chain_of(d)
            if chain not in last or int(d["seq"]) > last[chain][0]:
                last[chain] = (int(d["seq"]), d["row_digest"])
        self._write(UPSERT_HEAD, [[c, s, g] for c, (s, g) in sorted(last.items())], many=True)
        for chain, head in last.items():
            if chain in self._heads and head[0] > self._heads[chain][0]:
                self._heads[chain] = head

    def all_audit_heads(self) -> dict[str, tuple[int, str]]:
        return {r[0]: (int(r[1]), r[2]) for r in self._query(
            "SELECT chain, seq, row_digest FROM audit_heads WHERE seq > 0")}

    # -- trusted host keys, metadata, the store as a whole --------------------------------------------------------------------
    def remove_trusted_host_key(self, key_id: str) -> bool:
        return bool(self._query("DELETE FROM trusted_host_keys WHERE key_id = %s RETURNING 1", [key_id]))

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def is_empty(self) -> bool:
        """True when nothing but trusted host keys and metadata was ever written (a restore target)."""
        tables = ("scopes", "journal", "records", "candidates", "audit", "tombstones", "data_keys")
        row = self._one("SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {t})" for t in tables))
        return not (row and row[0])
