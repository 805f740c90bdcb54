"""The DuckDB engine's transaction (``engine.EngineTx``): persistence over one connection, its
statements run at once or prepared for a group commit (``group_commit.py``). What its SQL shares
with PostgreSQL's is ``engram_core/store/sql/``; the engine itself (fence, migrations, caches,
the writer lock) is ``engine.py``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import duckdb

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.chain import GENESIS, chain_of
from engram_core.store.duckdb.group_commit import Batch, Member, Pending, statement_of, tables_of
from engram_core.store.duckdb.migrations import MIGRATIONS
from engram_core.store.duckdb.record_links import RecordLinks
from engram_core.store.duckdb.trust import TrustClasses
from engram_core.store.key_digests import KeyDigests
from engram_core.store.port import (
    CandidateRow,
    Event,
    IdempotencyRow,
    RecordRow,
    ScopeRow,
    SharedPin,
    iter_chunks,
)
from engram_core.store.sql.codecs import (
    AUDIT_KEYS,
    CANDIDATE_COLS,
    EVENT_COLS,
    RECORD_COLS,
    SCOPE_COLS,
    audit_values,
    candidate_of,
    candidate_values,
    event_of,
    event_values,
    qualified,
    record_of,
    record_values,
    scope_of,
)
from engram_core.store.sql.dialect import DUCKDB
from engram_core.store.sql.rows import DATA_KEY_SLOT, TOMBSTONED, SqlRows

SCHEMA_VERSION = max(m.version for m in MIGRATIONS)  # what this engine writes
_RECORD_COLS_R = qualified(RECORD_COLS, "r")  # records joined as r
_IDEMPOTENCY = frozenset({"idempotency"})
_CONFIRMATIONS = frozenset({"used_confirmations"})
_CANDIDATES = frozenset({"candidates"})
_DATA_KEYS = frozenset({"data_keys"})
_STANDING = frozenset({"records", "tombstones"})
AUDIT_TYPES = ("VARCHAR", "UBIGINT", "BIGINT") + ("VARCHAR",) * 12  # of AUDIT_KEYS (unnest's arrays)


class Committed(Protocol):
    """What a transaction uses of its engine (``engine.DuckDBEngine``, the sole writer): its
    committed copies and the digests of keys ever written (``key_digests.py``)."""

    linked_ids: set[str]
    facts_in_clear: set[str]
    idempotency_keys: KeyDigests
    payload_keys: KeyDigests
    used_grants: KeyDigests

    def committed_scopes(self) -> dict[tuple[str, str], ScopeRow] | None: ...
    def committed_candidate(self, candidate_id: str) -> CandidateRow | None: ...
    def audit_head(self, chain: str) -> tuple[int, str]: ...


class DuckDBEngineTx(SqlRows, RecordLinks, TrustClasses):
    """Persistence over one DuckDB connection inside a transaction (``engine.EngineTx``)."""

    _store: Committed
    dialect = DUCKDB
    update_blobs_sql = ("UPDATE projections SET sealed = u.sealed FROM (SELECT unnest($1::VARCHAR[]) AS record_id, "
                        "unnest($2::BLOB[]) AS sealed) u WHERE projections.record_id = u.record_id")

    def __init__(self, con: duckdb.DuckDBPyConnection, engine: Committed, *, writing: bool = False,
                 batch: Batch | None = None, latest: bool = False) -> None:
        self._con = con
        self._store = engine
        # A reader whose every statement reads the latest committed state (``read(snapshot=False)``):
        # the writer's committed copies answer it as well (never a snapshot reader's: they may be newer).
        self._latest = latest
        # A writer (the only one: the engine's write lock) reads scope rows and audit chain heads
        # from the engine's committed copies plus its own changes, published after COMMIT.
        self._writing = writing
        # A member of a group commit (group_commit.py) prepares its writes and joins ``batch``.
        self._batch = batch
        self._member = Member() if batch is not None else None
        self.scope_changes: dict[tuple[str, str], ScopeRow] = {}
        self.audit_heads_changed: dict[str, tuple[int, str]] = {}
        # A transaction of its own that wrote candidates: the engine drops its committed copies.
        self.wrote_candidates = False
        self.direct_ops: list[tuple[Any, ...]] = []  # its writes, run as they came (no batch)

    def read_ahead(self, *reads: Callable[[], object]) -> None:
        """Nothing to do: a read here is a local call (``port.Tx.read_ahead``)."""

    # -- statements: run now, or prepared for the group commit --------------------------------
    def _before_read(self, sql: str, overlaid: frozenset[str]) -> None:
        """Make what a read of ``sql`` must see visible to it (group commit only): the batch's
        pending rows of the tables it names are flushed, and a member with its own pending
        writes there is promoted. ``overlaid``: tables whose pending rows the caller consults
        itself."""
        member = self._member
        if member is None:
            return
        tables = tables_of(sql)
        if not tables:
            return
        if tables & member.sql_tables or (tables - overlaid) & member.pending.tables():
            self._promote()
        batch = self._batch
        assert batch is not None
        stale = (tables - overlaid) & batch.pending.tables()
        if stale:
            batch.flush(self._con, stale)

    def _promote(self) -> None:
        """Put this member's writes into the shared transaction now (it reads what it wrote)."""
        member, batch = self._member, self._batch
        assert member is not None and batch is not None
        batch.join(self._con, member)
        member.promoted = True

    @property
    def member(self) -> Member | None:
        """This transaction as a member of a group commit (None outside one)."""
        return self._member

    @property
    def promoted(self) -> bool:
        return self._member is not None and self._member.promoted

    def _one(self, sql: str, params: list[Any] | tuple = (), *, overlaid: frozenset[str] = frozenset()) -> tuple | None:
        self._before_read(sql, overlaid)
        # fetchall, not fetchone: outside a transaction an unexhausted result keeps its statement's
        # transaction open, and DuckDB then refuses CHECKPOINT ("other write transactions active").
        rows = self._con.execute(sql, params).fetchall()
        return rows[0] if rows else None

    def _all(self, sql: str, params: list[Any] | tuple = (), *, overlaid: frozenset[str] = frozenset()) -> list[tuple]:
        self._before_read(sql, overlaid)
        return self._con.execute(sql, params).fetchall()

    def _write(self, op: tuple[Any, ...]) -> None:
        """A prepared write (group_commit.py): run now in a transaction of its own, applied to the
        batch when this member is promoted, else held until the member joins."""
        member = self._member
        if member is None:
            self.wrote_candidates = self.wrote_candidates or op[0] == "candidate_state" or "candidates" in (
                op[3] if op[0] == "sql" else (op[1],))
            self._con.execute(*statement_of(op))
            self.direct_ops.append(op)
        elif member.promoted:
            self._batch.apply(self._con, op)  # type: ignore[union-attr]
        else:
            member.ops.append(op)
            if op[0] == "sql":
                member.sql_tables |= op[3]
            else:
                member.pending.note(op)

    def _exec(self, sql: str, params: list[Any] | tuple = ()) -> None:
        """A write statement: run now, or (group commit) when this member joins its batch."""
        self._write(("sql", sql, params, tables_of(sql)))

    def _sql_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._all(sql, list(params))

    def _sql_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._one(sql, list(params))

    def _sql_exec(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._exec(sql, list(params))

    def _insert(self, table: str, values: list[Any], *, verb: str = "INSERT", cols: str = "") -> None:
        """Append one row: now, or in one multi-row INSERT with the batch's other rows."""
        self._write(("row", table, verb, cols, values))

    def _pendings(self) -> list[Pending]:
        """The pending writes a read consults, the member's own first."""
        if self._member is None:
            return []
        return [self._member.pending, self._batch.pending]  # type: ignore[union-attr]

    # -- scopes, cursors, journal ------------------------------------------
    def scope(self, scope: Scope) -> ScopeRow | None:
        key = (scope.tenant, scope.workspace)
        if self._writing:
            if key in self.scope_changes:
                return self.scope_changes[key]
            if self._batch is not None and key in self._batch.scope_changes:
                return self._batch.scope_changes[key]
            committed = self._store.committed_scopes()
            if committed is not None:
                return committed.get(key)
        return self._scope_from_db(scope)

    def _scope_from_db(self, scope: Scope) -> ScopeRow | None:
        row = self._one(f"SELECT {SCOPE_COLS} FROM scopes WHERE tenant = ? AND workspace = ?", [scope.tenant, scope.workspace])
        return scope_of(row) if row is not None else None

    def _changed(self, row: ScopeRow) -> ScopeRow:
        self.scope_changes[(row.tenant, row.workspace)] = row
        return row

    def scope_for_update(self, scope: Scope) -> ScopeRow:
        # The writer lock already makes every scope this transaction's until it commits.
        row = self.scope(scope)
        if row is None:
            self._exec("INSERT INTO scopes VALUES (?, ?, false, '[]', 0, 0, ?)", [scope.tenant, scope.workspace, GENESIS])
            row = self._changed(ScopeRow(scope.tenant, scope.workspace, False, (), 0, 0, GENESIS))
        return row

    def set_activation(self, scope: Scope, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        row = self.scope_for_update(scope)
        self._exec(
            "UPDATE scopes SET activated = ?, tools = ? WHERE tenant = ? AND workspace = ?",
            [activated, json.dumps(sorted(tools)), scope.tenant, scope.workspace],
        )
        return self._changed(replace(row, activated=activated, tools=tuple(sorted(tools))))

    def bump_epoch(self, scope: Scope) -> int:
        row = self.scope_for_update(scope)
        self._exec(
            "UPDATE scopes SET authorization_epoch = authorization_epoch + 1 WHERE tenant = ? AND workspace = ?",
            [scope.tenant, scope.workspace],
        )
        return self._changed(replace(row, authorization_epoch=row.authorization_epoch + 1)).authorization_epoch

    def insert_event(self, e: Event) -> None:
        scope = self.scope_for_update(Scope(e.tenant, e.workspace))
        if e.cursor != scope.last_cursor + 1 or e.prev_digest != scope.last_event_digest:
            raise EngramError(Code.STORE_UNAVAILABLE, "journal event does not follow the scope head")
        self._insert("journal", event_values(e))
        self._write(("head", e.tenant, e.workspace, e.cursor, e.event_digest))
        self._changed(replace(scope, last_cursor=e.cursor, last_event_digest=e.event_digest))

    def set_scope_head(self, scope: Scope, cursor: int, event_digest: str) -> None:
        """Move the scope's journal head past events a bulk loader inserted itself (tools/bench)."""
        row = self.scope_for_update(scope)
        self._write(("head", scope.tenant, scope.workspace, cursor, event_digest))
        self._changed(replace(row, last_cursor=cursor, last_event_digest=event_digest))

    def events(self, scope: Scope, from_cursor: int, to_cursor: int | None) -> list[Event]:
        rows = self._all(
            f"SELECT {EVENT_COLS} FROM journal WHERE tenant = ? AND workspace = ? AND cursor >= ? AND cursor <= ? "
            "ORDER BY cursor", [scope.tenant, scope.workspace, from_cursor, to_cursor if to_cursor is not None else 2**63])
        return [event_of(r) for r in rows]

    def event_by_id(self, scope: Scope, event_id: str) -> Event | None:
        row = self._one(
            "SELECT cursor FROM journal WHERE tenant = ? AND workspace = ? AND event_id = ?",
            [scope.tenant, scope.workspace, event_id],
        )
        if row is None:
            return None
        return self.events(scope, int(row[0]), int(row[0]))[0]

    def scopes(self) -> list[ScopeRow]:
        rows = self._all("SELECT tenant, workspace FROM scopes ORDER BY tenant, workspace")
        return [self.scope(Scope(t, w)) for t, w in rows]  # type: ignore[misc]

    def restore_scope(self, row: ScopeRow) -> None:
        self._exec("INSERT INTO scopes VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [row.tenant, row.workspace, row.activated, json.dumps(sorted(row.tools)),
                    row.authorization_epoch, row.last_cursor, row.last_event_digest])
        self._changed(replace(row, tools=tuple(sorted(row.tools))))

    def restore_event(self, e: Event) -> None:
        """Insert a verified journal event verbatim (restore); the scope row carries the chain head."""
        self._exec("INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", event_values(e))

    # -- idempotency and confirmations ---------------------------------------
    def idempotency_get(self, scope: Scope, principal: str, key: str) -> IdempotencyRow | None:
        for pending in self._pendings():
            found = pending.idempotency.get((scope.tenant, scope.workspace, principal, key))
            if found is not None:
                return found
        if not self._store.idempotency_keys.may_contain(scope.tenant, scope.workspace, principal, key):
            return None  # never written: no read needed (key_digests.py)
        row = self._one(
            "SELECT tool, target, request_digest, outcome FROM idempotency "
            "WHERE tenant = ? AND workspace = ? AND principal = ? AND key = ?",
            [scope.tenant, scope.workspace, principal, key], overlaid=_IDEMPOTENCY,
        )
        return IdempotencyRow(row[0], row[1], row[2], json.loads(row[3])) if row else None

    def idempotency_put(self, scope: Scope, principal: str, key: str, row: IdempotencyRow, at_ms: int) -> None:
        self._store.idempotency_keys.add(scope.tenant, scope.workspace, principal, key)  # before the row can commit
        self._insert("idempotency", [scope.tenant, scope.workspace, principal, key, row.tool, row.target, row.request_digest,
                                     json.dumps(row.outcome, sort_keys=True), at_ms])
        if self._member is not None:
            self._member.pending.idempotency[(scope.tenant, scope.workspace, principal, key)] = row

    def use_confirmation(self, grant_id: str, scope: Scope, at_ms: int) -> bool:
        if any(grant_id in p.confirmations for p in self._pendings()):
            return False
        if self._store.used_grants.may_contain(grant_id) and self._one(
                "SELECT 1 FROM used_confirmations WHERE grant_id = ?", [grant_id], overlaid=_CONFIRMATIONS):
            return False
        self._store.used_grants.add(grant_id)  # before the row can commit
        self._insert("used_confirmations", [grant_id, scope.tenant, scope.workspace, at_ms])
        if self._member is not None:
            self._member.pending.confirmations.add(grant_id)
        return True

    # -- candidates ------------------------------------------------------------
    def insert_candidate(self, row: CandidateRow) -> None:
        self._insert("candidates", candidate_values(row), cols=f" ({CANDIDATE_COLS})")
        if row.facts:
            self._store.facts_in_clear.add(row.candidate_id)
        if self._member is not None:
            self._member.pending.candidates[row.candidate_id] = row

    def candidate(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        member = self._member
        if member is None or "candidates" in member.sql_tables:
            found = self._store.committed_candidate(candidate_id) if member is None and self._latest else None
            if found is None:
                row = self._one(f"SELECT {CANDIDATE_COLS} FROM candidates WHERE candidate_id = ?", [candidate_id])
                found = candidate_of(row) if row else None
        else:  # the database's row, or a batch's, with the batch's then the member's pending changes
            batch, own = self._batch.pending, member.pending  # type: ignore[union-attr]
            found = batch.candidates.get(candidate_id) or own.candidates.get(candidate_id)
            if found is None and not self._batch.changed_candidate(candidate_id):  # type: ignore[union-attr]
                found = self._store.committed_candidate(candidate_id)  # as committed, and the batch left it so
            if found is None:
                row = self._one(f"SELECT {CANDIDATE_COLS} FROM candidates WHERE candidate_id = ?", [candidate_id],
                                overlaid=_CANDIDATES)
                found = candidate_of(row) if row else None
            for pending in (batch, own):
                change = pending.candidate_states.get(candidate_id)
                if found is not None and change is not None:
                    state, decision, drop = change
                    found = replace(found, state=state,
                                    decision=json.loads(decision) if decision else found.decision,
                                    sealed_envelope=None if drop else found.sealed_envelope)
        # The scope is checked here, not in SQL (see ``record``).
        return found if found is not None and found.tenant == scope.tenant and found.workspace == scope.workspace else None

    def candidates_in_state(self, scope: Scope, state: str) -> list[CandidateRow]:
        rows = self._all(
            f"SELECT {CANDIDATE_COLS} FROM candidates WHERE tenant = ? AND workspace = ? AND state = ? "
            "ORDER BY cursor",
            [scope.tenant, scope.workspace, state],
        )
        return [candidate_of(r) for r in rows]

    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None = None,
                            drop_envelope: bool = False) -> None:
        decided = json.dumps(decision, sort_keys=True) if decision else None
        self._write(("candidate_state", candidate_id, state, decided, drop_envelope))

    def scrub_candidate_facts(self, candidate_id: str) -> None:
        # Sole writer: ``facts_in_clear`` holds every candidate that may have facts (loaded at
        # open, added to by every insert; an entry left after its scrub costs a no-op UPDATE).
        if candidate_id in self._store.facts_in_clear:
            self._exec("UPDATE candidates SET facts = '{}' WHERE candidate_id = ?", [candidate_id])

    # -- data keys ---------------------------------------------------------------
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None:
        self._insert("data_keys", [owner, slot, at_ms])
        if self._member is not None:
            self._member.pending.data_keys[owner] = slot

    def data_key_slot(self, owner: str) -> int | None:
        for pending in self._pendings():
            if owner in pending.dropped_keys:
                return None
            if owner in pending.data_keys:
                return pending.data_keys[owner]
        row = self._one(DATA_KEY_SLOT, [owner], overlaid=_DATA_KEYS)
        return int(row[0]) if row else None

    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None,
                      generation: int | None = None) -> int | None:
        if self._member is None:
            row = self._one("DELETE FROM data_keys WHERE owner = ? RETURNING slot", [owner])
            slot = int(row[0]) if row else None
        else:
            if slot is None:
                slot = self.data_key_slot(owner)
            if slot is not None:
                self._write(("delete", "data_keys", "owner", owner))
        if slot is None:
            return None
        self._insert("key_destructions", [owner, at_ms, reason, generation])
        return slot

    # -- records -----------------------------------------------------------------
    def insert_record(self, row: RecordRow) -> None:
        self._store.payload_keys.add(row.tenant, row.workspace, row.payload_digest)  # before the row can commit
        self._insert("records", record_values(row), cols=f" ({RECORD_COLS})")
        if self._member is not None and row.state == "accepted_current":
            self._member.pending.current_payloads.setdefault(
                (row.tenant, row.workspace, row.payload_digest), (row.accepted_cursor, row.record_id))

    def record(self, scope: Scope, record_id: str) -> RecordRow | None:
        row = self._one(f"SELECT {RECORD_COLS} FROM records WHERE record_id = ?", [record_id])
        # The scope is checked here, not in SQL: with several scopes in the table, DuckDB plans
        # `record_id = ? AND tenant = ? AND workspace = ?` an order of magnitude slower (11 vs
        # 1.4 ms at 100k records) than the id alone.
        return record_of(row) if row and row[1] == scope.tenant and row[2] == scope.workspace else None

    def records(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]:
        # Ids only in SQL, the scope checked here (see ``record``): with several scopes in the
        # table, adding `tenant = ? AND workspace = ?` made fetching 10 records 31 ms instead of 2.7.
        if not record_ids:
            return {}
        rows = [r for chunk in iter_chunks(record_ids, 1000) for r in self._all(
            f"SELECT {RECORD_COLS} FROM records WHERE record_id IN ({', '.join('?' * len(chunk))})", chunk)]
        return {r[0]: record_of(r) for r in rows if r[1] == scope.tenant and r[2] == scope.workspace}

    def scope_records(self, scope: Scope, states: tuple[str, ...] | None = None) -> list[RecordRow]:
        sql = f"SELECT {RECORD_COLS} FROM records WHERE tenant = ? AND workspace = ?"
        params: list[Any] = [scope.tenant, scope.workspace]
        if states is not None:
            sql += " AND state IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(states))
        return [record_of(r) for r in self._all(sql + " ORDER BY accepted_cursor", params)]

    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None:
        # successor_id: None keeps the current pointer, "" clears it (rewind), a value sets it.
        # drop_body: the sealed body goes in the same statement (a tombstone: one UPDATE, not two).
        self._exec(
            "UPDATE records SET state = ?, state_cursor = ?, "
            "successor_id = CASE WHEN ? = '' THEN NULL ELSE coalesce(?, successor_id) END"
            + (", sealed_body = NULL" if drop_body else "") + " WHERE record_id = ?",
            [state, state_cursor, successor_id, successor_id, record_id],
        )

    def payload_standing(self, scope: Scope, payload_digest: str) -> tuple[str | None, bool]:
        """(the id of a current record with this payload (the earliest admitted) or None, the
        payload was forgotten here): one statement."""
        overlay = not (self._member is not None and {"records", "tombstones"} & self._member.sql_tables)
        # By the payload digest alone (migration 7's indexes; a condition on the scope as well
        # makes DuckDB scan the table instead), the scope checked here; not at all when this
        # scope never held the digest (key_digests.py).
        rows = self._all(
            "SELECT tenant, workspace, state, accepted_cursor, record_id, false FROM records "
            "WHERE payload_digest = $1 UNION ALL "
            "SELECT tenant, workspace, '', 0, record_id, true FROM tombstones WHERE payload_digest = $1",
            [payload_digest], overlaid=_STANDING if overlay else frozenset(),
        ) if self._store.payload_keys.may_contain(scope.tenant, scope.workspace, payload_digest) else []
        mine = [r for r in rows if r[0] == scope.tenant and r[1] == scope.workspace]
        current = min(((int(r[3]), r[4]) for r in mine if not r[5] and r[2] == "accepted_current"),
                      default=(0, None))[1]
        tombstoned = any(r[5] for r in mine)
        if overlay:
            key = (scope.tenant, scope.workspace, payload_digest)
            for pending in self._pendings():
                if current is None and key in pending.current_payloads:
                    current = pending.current_payloads[key][1]
                tombstoned = tombstoned or key in pending.tombstones
        return current, tombstoned

    # -- tombstone ledger ---------------------------------------------------------
    def add_tombstone(self, scope: Scope, payload_digest: str, record_id: str, cursor: int, at_ms: int) -> None:
        self._store.payload_keys.add(scope.tenant, scope.workspace, payload_digest)  # before the row can commit
        self._insert("tombstones", [scope.tenant, scope.workspace, payload_digest, record_id, cursor, at_ms])
        if self._member is not None:
            self._member.pending.tombstones.add((scope.tenant, scope.workspace, payload_digest))

    def tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        return self._one(TOMBSTONED, [scope.tenant, scope.workspace, payload_digest]) is not None

    # -- sealed projections (opaque blobs) ------------------------------------------------------
    def put_projection(self, scope: Scope, record_id: str, sealed: bytes, *, new: bool) -> None:
        # A record inserted by this transaction has no projection yet: a plain INSERT (~0.6 ms
        # cheaper than INSERT OR REPLACE, which a re-index of an older record needs).
        self._insert("projections", [record_id, scope.tenant, scope.workspace, sealed],
                     verb="INSERT" if new else "INSERT OR REPLACE")

    def delete_projection(self, record_id: str) -> None:
        # Whether or not a row is there: asking first cost a read (~0.8 ms) on every forget.
        self._exec("DELETE FROM projections WHERE record_id = ?", [record_id])  # ids are unique across scopes

    def projection_blob(self, record_id: str) -> tuple[bytes, RecordRow] | None:
        found = self._one(f"SELECT p.sealed, {_RECORD_COLS_R} "
                          "FROM projections p JOIN records r USING (record_id) WHERE p.record_id = ?", [record_id])
        return (bytes(found[0]), record_of(found[1:])) if found is not None else None

    def scope_projection_blobs(self, scope: Scope) -> list[tuple[RecordRow, bytes]]:
        return [(record_of(found[1:]), bytes(found[0])) for found in self._all(
            f"SELECT p.sealed, {_RECORD_COLS_R} FROM projections p JOIN records r USING (record_id) "
            "WHERE p.tenant = ? AND p.workspace = ?", [scope.tenant, scope.workspace])]

    def drop_scope_projections(self, scope: Scope) -> None:
        self._exec("DELETE FROM projections WHERE tenant = ? AND workspace = ?", [scope.tenant, scope.workspace])

    # -- audit rows --------------------------------------------------------------------------------
    def audit_heads(self, chains: list[str]) -> dict[str, tuple[int, str]]:
        # The writer lock makes every chain this transaction's; heads come from the engine's
        # committed copy plus what this transaction (or its batch) appended.
        out = {}
        for chain in chains:
            head = self.audit_heads_changed.get(chain)
            if head is None and self._batch is not None:
                head = self._batch.audit_heads.get(chain)
            out[chain] = head if head is not None else self._store.audit_head(chain)
        return out

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        if self._member is None and len(docs) > 1:
            # A spool's rows (512) in one statement: one INSERT each took ~2 ms apiece while the
            # audit lock, which every read's own row waits for, was held.
            columns = [list(c) for c in zip(*(audit_values(d) for d in docs), strict=True)]
            picks = ", ".join(f"unnest(${i + 1}::{t}[])" for i, t in enumerate(AUDIT_TYPES))
            self._con.execute(f"INSERT INTO audit ({', '.join(AUDIT_KEYS)}) SELECT {picks}"
                              + (" ON CONFLICT DO NOTHING" if if_absent else ""), columns)
            for doc in docs:
                self.audit_heads_changed[chain_of(doc)] = (int(doc["seq"]), doc["row_digest"])
            return
        for doc in docs:
            self._insert("audit", audit_values(doc), verb="INSERT OR IGNORE" if if_absent else "INSERT")
            self.audit_heads_changed[chain_of(doc)] = (int(doc["seq"]), doc["row_digest"])

    def put_page_pin(self, pin: SharedPin) -> None:
        raise ValueError("page pins are shared only where other cores write the store")

    def all_audit_heads(self) -> dict[str, tuple[int, str]]:
        return {r[0]: (int(r[1]), r[2]) for r in self._all(
            "SELECT chain, seq, row_digest FROM audit WHERE (chain, seq) IN "
            "(SELECT chain, max(seq) FROM audit GROUP BY chain)")}

    # -- trusted host keys ------------------------------------------------------------
    def remove_trusted_host_key(self, key_id: str) -> bool:
        n = self._one("SELECT count(*) FROM trusted_host_keys WHERE key_id = ?", [key_id])[0]  # type: ignore[index]
        self._exec("DELETE FROM trusted_host_keys WHERE key_id = ?", [key_id])
        return bool(n)

    # -- the store as a whole ------------------------------------------------------------------------
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def is_empty(self) -> bool:
        """True when nothing but trusted host keys and metadata was ever written (a restore target)."""
        for table in ("scopes", "journal", "records", "candidates", "audit", "tombstones", "data_keys"):
            if self._one(f"SELECT 1 FROM {table} LIMIT 1") is not None:
                return False
        return True
