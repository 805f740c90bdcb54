"""The DuckDB engine (SPEC §10): one process, one file, the embedded default.

One process writes (an exclusive ``flock`` on ``DIR/engram.lock`` is the fence; DuckDB's
own file lock backs it up), so the engine is its database's ``sole_writer``: its caches
(committed scope rows, audit chain heads, negative-lookup digests) are exact. Writes are
serialized by one writer lock and run in one DuckDB transaction each, or share one as
members of a group commit (``group_commit.py``); reads use per-thread cursors. Commit is
the durability point: DuckDB's WAL is flushed before ``COMMIT`` returns, and the kernel's
``committed`` hook (which publishes to searches) runs only after it.

What is not persistence lives in the store kernel (``engram_core/store/kernel.py``): audit
chaining, the audit spool and devices, projection sealing, key durability, the search index.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb

from engram_core.errors import Code, EngramError
from engram_core.observability import tracing
from engram_core.store.audit_spool import SPOOL_NAME
from engram_core.store.chain import GENESIS, LEGACY_CHAIN
from engram_core.store.duckdb.group_commit import MAX_MEMBERS, Batch, Member, Pending, statement_of, tables_of
from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS
from engram_core.store.duckdb.record_links import RecordLinks
from engram_core.store.duckdb.record_sql import RECORD_COLS, RECORD_COLS_BEFORE_12, record_of
from engram_core.store.duckdb.trust import TrustClasses
from engram_core.store.engine import (
    CommitHooks,
    EngineCapabilities,
    ScopeChanges,
    StoreObservers,
    TxEffects,
    read_changes_since,
)
from engram_core.store.key_digests import KeyDigests
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
from engram_core.store.projection import DataKeys, Projection, seal_projection
from engram_core.store.search_index import FIELD_CODE
from engram_core.store.shared_state import SOLE_WRITER_STATE

SCHEMA_VERSION = max(m.version for m in MIGRATIONS)  # what this engine writes
OPEN_CHUNK = 4096  # rows / projections fetched per round trip when the index is built
# While the index is built, DuckDB may cache this much beyond what it held before (the scans read
# every row and projection once; with its default limit, 80% of RAM, it kept them all: ~3 KB a
# record, 3 GB at a million). Afterwards the table blocks the build cached are evicted.
BUILD_CACHE_BYTES = 256 << 20
CACHE_AFTER_BUILD = 32 << 20  # of table blocks the build read, at most this much stays cached
log = logging.getLogger(__name__)
_RECORD_COLS_R = ", ".join("r." + c.strip() for c in RECORD_COLS.split(","))  # records joined as r
_CANDIDATE_COLS = (
    "candidate_id, tenant, workspace, principal, agent_id, session, state, payload_digest, record_digest, "
    "trust_class, facts, sealed_envelope, captured_at_ms, cursor, decision, key_slot"
)


def _candidate(row: tuple) -> CandidateRow:
    r = list(row)
    r[10] = json.loads(r[10])
    r[11] = bytes(r[11]) if r[11] is not None else None
    r[14] = json.loads(r[14]) if r[14] else None
    return CandidateRow(*r)


_IDEMPOTENCY = frozenset({"idempotency"})
_CONFIRMATIONS = frozenset({"used_confirmations"})
_CANDIDATES = frozenset({"candidates"})
_DATA_KEYS = frozenset({"data_keys"})
_STANDING = frozenset({"records", "tombstones"})
_AUDIT_KEYS = ("chain", "seq", "at_ms", "audit_id", "tenant", "workspace", "principal", "agent_id", "operation",
               "outcome", "target_digest", "decisions", "prev_digest", "row_digest", "context_nonce")
_OPTIONAL_AUDIT = {"chain": LEGACY_CHAIN, "context_nonce": ""}  # absent from a document: this value
_AUDIT_TYPES = ("VARCHAR", "UBIGINT", "BIGINT") + ("VARCHAR",) * 12


def _audit_values(doc: dict[str, Any]) -> list[Any]:
    return [json.dumps(doc[k], sort_keys=True) if k == "decisions" else doc.get(k, _OPTIONAL_AUDIT[k])
            if k in _OPTIONAL_AUDIT else doc[k] for k in _AUDIT_KEYS]


def _audit_doc(row: tuple) -> dict[str, Any]:
    d = dict(zip(_AUDIT_KEYS, row, strict=True))
    d["seq"] = int(d["seq"])
    d["decisions"] = json.loads(d["decisions"])
    # Rows of the one chain before migration 9, and rows without a claimed nonce, never had the
    # field in their digest.
    for key, absent in _OPTIONAL_AUDIT.items():
        if d[key] == absent:
            del d[key]
    return d


def _connect(path: Path) -> duckdb.DuckDBPyConnection:
    # One DuckDB worker thread: the store runs point reads and one-to-64-row writes, for which
    # DuckDB's parallel pipelines are pure scheduling cost (a one-row INSERT 0.37 ms instead of
    # 0.54-0.69 ms with two threads on this 2-core machine), and a second worker competes with
    # the Python threads for the cores. The big scans (index build at open, compaction) are
    # fetched and decoded in Python, which is their limit anyway.
    return duckdb.connect(str(path), config={"threads": 1})


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back, where a failed ROLLBACK (no transaction left) must not hide the error being raised."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


class DuckDBEngineTx(RecordLinks, TrustClasses):
    """Persistence over one DuckDB connection inside a transaction (``engine.EngineTx``)."""

    _store: DuckDBEngine

    def __init__(self, con: duckdb.DuckDBPyConnection, engine: DuckDBEngine, *, writing: bool = False,
                 batch: Batch | None = None) -> None:
        self._con = con
        self._store = engine
        # A writer (the only one: the engine's write lock) reads scope rows and audit chain heads
        # from the engine's committed copies plus its own changes, published after COMMIT.
        self._writing = writing
        # A member of a group commit (group_commit.py) prepares its writes and joins ``batch``.
        self._batch = batch
        self._member = Member() if batch is not None else None
        self.scope_changes: dict[tuple[str, str], ScopeRow] = {}
        self.audit_heads_changed: dict[str, tuple[int, str]] = {}

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
            self._con.execute(*statement_of(op))
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

    def _insert(self, table: str, values: list[Any], *, verb: str = "INSERT", cols: str = "") -> None:
        """Append one row: now, or in one multi-row INSERT with the batch's other rows."""
        self._write(("row", table, verb, cols, values))

    def _pendings(self) -> list[Pending]:
        """The pending writes a read consults, the member's own first."""
        if self._member is None:
            return []
        return [self._member.pending, self._batch.pending]  # type: ignore[union-attr]

    # -- scopes, cursors, journal ------------------------------------------
    def scope(self, tenant: str, workspace: str) -> ScopeRow | None:
        key = (tenant, workspace)
        if self._writing:
            if key in self.scope_changes:
                return self.scope_changes[key]
            if self._batch is not None and key in self._batch.scope_changes:
                return self._batch.scope_changes[key]
            committed = self._store.committed_scopes()
            if committed is not None:
                return committed.get(key)
        return self._scope_from_db(tenant, workspace)

    def _scope_from_db(self, tenant: str, workspace: str) -> ScopeRow | None:
        row = self._one(
            "SELECT tenant, workspace, activated, tools, authorization_epoch, last_cursor, last_event_digest "
            "FROM scopes WHERE tenant = ? AND workspace = ?",
            [tenant, workspace],
        )
        if row is None:
            return None
        return ScopeRow(row[0], row[1], row[2], tuple(json.loads(row[3])), row[4], int(row[5]), row[6])

    def _changed(self, row: ScopeRow) -> ScopeRow:
        self.scope_changes[(row.tenant, row.workspace)] = row
        return row

    def scope_for_update(self, tenant: str, workspace: str) -> ScopeRow:
        # The writer lock already makes every scope this transaction's until it commits.
        row = self.scope(tenant, workspace)
        if row is None:
            self._exec("INSERT INTO scopes VALUES (?, ?, false, '[]', 0, 0, ?)", [tenant, workspace, GENESIS])
            row = self._changed(ScopeRow(tenant, workspace, False, (), 0, 0, GENESIS))
        return row

    def set_activation(self, tenant: str, workspace: str, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        row = self.scope_for_update(tenant, workspace)
        self._exec(
            "UPDATE scopes SET activated = ?, tools = ? WHERE tenant = ? AND workspace = ?",
            [activated, json.dumps(sorted(tools)), tenant, workspace],
        )
        return self._changed(replace(row, activated=activated, tools=tuple(sorted(tools))))

    def bump_epoch(self, tenant: str, workspace: str) -> int:
        row = self.scope_for_update(tenant, workspace)
        self._exec(
            "UPDATE scopes SET authorization_epoch = authorization_epoch + 1 WHERE tenant = ? AND workspace = ?",
            [tenant, workspace],
        )
        return self._changed(replace(row, authorization_epoch=row.authorization_epoch + 1)).authorization_epoch

    def insert_event(self, e: Event) -> None:
        scope = self.scope_for_update(e.tenant, e.workspace)
        if e.cursor != scope.last_cursor + 1 or e.prev_digest != scope.last_event_digest:
            raise EngramError(Code.STORE_UNAVAILABLE, "journal event does not follow the scope head")
        self._insert("journal", [e.tenant, e.workspace, e.cursor, e.event_id, e.operation, e.target, e.from_state,
                                 e.to_state, e.at_ms, json.dumps(e.body, sort_keys=True), e.prev_digest,
                                 e.event_digest])
        self._write(("head", e.tenant, e.workspace, e.cursor, e.event_digest))
        self._changed(replace(scope, last_cursor=e.cursor, last_event_digest=e.event_digest))

    def set_scope_head(self, tenant: str, workspace: str, cursor: int, event_digest: str) -> None:
        """Move the scope's journal head past events a bulk loader inserted itself (tools/bench)."""
        row = self.scope_for_update(tenant, workspace)
        self._write(("head", tenant, workspace, cursor, event_digest))
        self._changed(replace(row, last_cursor=cursor, last_event_digest=event_digest))

    def events(self, tenant: str, workspace: str, from_cursor: int, to_cursor: int | None) -> list[Event]:
        rows = self._all(
            "SELECT tenant, workspace, cursor, event_id, operation, target, from_state, to_state, at_ms, body, "
            "prev_digest, event_digest FROM journal WHERE tenant = ? AND workspace = ? AND cursor >= ? "
            "AND cursor <= ? ORDER BY cursor",
            [tenant, workspace, from_cursor, to_cursor if to_cursor is not None else 2**63],
        )
        return [Event(r[0], r[1], int(r[2]), r[3], r[4], r[5], r[6], r[7], r[8], json.loads(r[9]), r[10], r[11])
                for r in rows]

    def event_by_id(self, tenant: str, workspace: str, event_id: str) -> Event | None:
        row = self._one(
            "SELECT cursor FROM journal WHERE tenant = ? AND workspace = ? AND event_id = ?",
            [tenant, workspace, event_id],
        )
        if row is None:
            return None
        return self.events(tenant, workspace, int(row[0]), int(row[0]))[0]

    def scopes(self) -> list[ScopeRow]:
        rows = self._all("SELECT tenant, workspace FROM scopes ORDER BY tenant, workspace")
        return [self.scope(t, w) for t, w in rows]  # type: ignore[misc]

    def restore_scope(self, row: ScopeRow) -> None:
        self._exec("INSERT INTO scopes VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [row.tenant, row.workspace, row.activated, json.dumps(sorted(row.tools)),
                    row.authorization_epoch, row.last_cursor, row.last_event_digest])
        self._changed(replace(row, tools=tuple(sorted(row.tools))))

    def restore_event(self, e: Event) -> None:
        """Insert a verified journal event verbatim (restore); the scope row carries the chain head."""
        self._exec(
            "INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [e.tenant, e.workspace, e.cursor, e.event_id, e.operation, e.target, e.from_state, e.to_state, e.at_ms,
             json.dumps(e.body, sort_keys=True), e.prev_digest, e.event_digest],
        )

    # -- idempotency and confirmations ---------------------------------------
    def idempotency_get(self, tenant: str, workspace: str, principal: str, key: str) -> IdempotencyRow | None:
        for pending in self._pendings():
            found = pending.idempotency.get((tenant, workspace, principal, key))
            if found is not None:
                return found
        if not self._store.idempotency_keys.may_contain(tenant, workspace, principal, key):
            return None  # never written: no read needed (key_digests.py)
        row = self._one(
            "SELECT tool, target, request_digest, outcome FROM idempotency "
            "WHERE tenant = ? AND workspace = ? AND principal = ? AND key = ?",
            [tenant, workspace, principal, key], overlaid=_IDEMPOTENCY,
        )
        return IdempotencyRow(row[0], row[1], row[2], json.loads(row[3])) if row else None

    def idempotency_put(self, tenant: str, workspace: str, principal: str, key: str, row: IdempotencyRow, at_ms: int) -> None:
        self._store.idempotency_keys.add(tenant, workspace, principal, key)  # before the row can commit
        self._insert("idempotency", [tenant, workspace, principal, key, row.tool, row.target, row.request_digest,
                                     json.dumps(row.outcome, sort_keys=True), at_ms])
        if self._member is not None:
            self._member.pending.idempotency[(tenant, workspace, principal, key)] = row

    def use_confirmation(self, grant_id: str, tenant: str, workspace: str, at_ms: int) -> bool:
        if any(grant_id in p.confirmations for p in self._pendings()):
            return False
        if self._store.used_grants.may_contain(grant_id) and self._one(
                "SELECT 1 FROM used_confirmations WHERE grant_id = ?", [grant_id], overlaid=_CONFIRMATIONS):
            return False
        self._store.used_grants.add(grant_id)  # before the row can commit
        self._insert("used_confirmations", [grant_id, tenant, workspace, at_ms])
        if self._member is not None:
            self._member.pending.confirmations.add(grant_id)
        return True

    # -- candidates ------------------------------------------------------------
    def insert_candidate(self, row: CandidateRow) -> None:
        self._insert(
            "candidates",
            [row.candidate_id, row.tenant, row.workspace, row.principal, row.agent_id, row.session, row.state,
             row.payload_digest, row.record_digest, row.trust_class, json.dumps(row.facts, sort_keys=True),
             row.sealed_envelope, row.captured_at_ms, row.cursor,
             json.dumps(row.decision, sort_keys=True) if row.decision else None, row.key_slot],
            cols=f" ({_CANDIDATE_COLS})",
        )
        if row.facts:
            self._store.facts_in_clear.add(row.candidate_id)
        if self._member is not None:
            self._member.pending.candidates[row.candidate_id] = row

    def candidate(self, tenant: str, workspace: str, candidate_id: str) -> CandidateRow | None:
        member = self._member
        if member is None or "candidates" in member.sql_tables:
            row = self._one(f"SELECT {_CANDIDATE_COLS} FROM candidates WHERE candidate_id = ?", [candidate_id])
            found = _candidate(row) if row else None
        else:  # the database's row, or a batch's, with the batch's then the member's pending changes
            batch, own = self._batch.pending, member.pending  # type: ignore[union-attr]
            found = batch.candidates.get(candidate_id) or own.candidates.get(candidate_id)
            if found is None:
                row = self._one(f"SELECT {_CANDIDATE_COLS} FROM candidates WHERE candidate_id = ?", [candidate_id],
                                overlaid=_CANDIDATES)
                found = _candidate(row) if row else None
            for pending in (batch, own):
                change = pending.candidate_states.get(candidate_id)
                if found is not None and change is not None:
                    state, decision, drop = change
                    found = replace(found, state=state,
                                    decision=json.loads(decision) if decision else found.decision,
                                    sealed_envelope=None if drop else found.sealed_envelope)
        # The scope is checked here, not in SQL (see ``record``).
        return found if found is not None and found.tenant == tenant and found.workspace == workspace else None

    def candidates_in_state(self, tenant: str, workspace: str, state: str) -> list[CandidateRow]:
        rows = self._all(
            f"SELECT {_CANDIDATE_COLS} FROM candidates WHERE tenant = ? AND workspace = ? AND state = ? "
            "ORDER BY cursor",
            [tenant, workspace, state],
        )
        return [_candidate(r) for r in rows]

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
        row = self._one("SELECT slot FROM data_keys WHERE owner = ?", [owner], overlaid=_DATA_KEYS)
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

    def live_key_slots(self) -> dict[int, str]:
        return {int(s): o for o, s in self._all("SELECT owner, slot FROM data_keys")}

    def key_destruction(self, owner: str) -> KeyDestruction | None:
        row = self._one("SELECT owner, destroyed_at_ms, reason, generation FROM key_destructions WHERE owner = ?",
                        [owner])
        return KeyDestruction(row[0], int(row[1]), row[2], row[3]) if row else None

    def key_destructions(self) -> list[KeyDestruction]:
        return [KeyDestruction(r[0], int(r[1]), r[2], r[3]) for r in self._all(
            "SELECT owner, destroyed_at_ms, reason, generation FROM key_destructions ORDER BY owner")]

    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None:
        self._exec("INSERT INTO key_destructions VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                   [owner, at_ms, reason, generation])

    # -- records -----------------------------------------------------------------
    def insert_record(self, row: RecordRow) -> None:
        self._store.payload_keys.add(row.tenant, row.workspace, row.payload_digest)  # before the row can commit
        self._insert(
            "records",
            [row.record_id, row.tenant, row.workspace, row.candidate_id, row.record_digest, row.payload_digest,
             row.state, row.trust_class, row.principal, row.agent_id, row.valid_t, row.valid_t_end,
             row.expires_at_ms, row.derivative_rule, row.accepted_at_ms, row.accepted_cursor, row.state_cursor,
             row.successor_id, row.sealed_body, row.key_slot, row.session, row.captured_at_ms],
            cols=f" ({RECORD_COLS})",
        )
        if self._member is not None and row.state == "accepted_current":
            self._member.pending.current_payloads.setdefault(
                (row.tenant, row.workspace, row.payload_digest), (row.accepted_cursor, row.record_id))

    def record(self, tenant: str, workspace: str, record_id: str) -> RecordRow | None:
        row = self._one(f"SELECT {RECORD_COLS} FROM records WHERE record_id = ?", [record_id])
        # The scope is checked here, not in SQL: with several scopes in the table, DuckDB plans
        # `record_id = ? AND tenant = ? AND workspace = ?` an order of magnitude slower (11 vs
        # 1.4 ms at 100k records) than the id alone.
        return record_of(row) if row and row[1] == tenant and row[2] == workspace else None

    def records(self, tenant: str, workspace: str, record_ids: list[str]) -> dict[str, RecordRow]:
        # Ids only in SQL, the scope checked here (see ``record``): with several scopes in the
        # table, adding `tenant = ? AND workspace = ?` made fetching 10 records 31 ms instead of 2.7.
        if not record_ids:
            return {}
        rows = [r for chunk in iter_chunks(record_ids, 1000) for r in self._all(
            f"SELECT {RECORD_COLS} FROM records WHERE record_id IN ({', '.join('?' * len(chunk))})", chunk)]
        return {r[0]: record_of(r) for r in rows if r[1] == tenant and r[2] == workspace}

    def scope_records(self, tenant: str, workspace: str, states: tuple[str, ...] | None = None) -> list[RecordRow]:
        sql = f"SELECT {RECORD_COLS} FROM records WHERE tenant = ? AND workspace = ?"
        params: list[Any] = [tenant, workspace]
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

    def payload_standing(self, tenant: str, workspace: str, payload_digest: str) -> tuple[str | None, bool]:
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
        ) if self._store.payload_keys.may_contain(tenant, workspace, payload_digest) else []
        mine = [r for r in rows if r[0] == tenant and r[1] == workspace]
        current = min(((int(r[3]), r[4]) for r in mine if not r[5] and r[2] == "accepted_current"),
                      default=(0, None))[1]
        tombstoned = any(r[5] for r in mine)
        if overlay:
            key = (tenant, workspace, payload_digest)
            for pending in self._pendings():
                if current is None and key in pending.current_payloads:
                    current = pending.current_payloads[key][1]
                tombstoned = tombstoned or key in pending.tombstones
        return current, tombstoned

    # -- tombstone ledger ---------------------------------------------------------
    def add_tombstone(self, tenant: str, workspace: str, payload_digest: str, record_id: str, cursor: int, at_ms: int) -> None:
        self._store.payload_keys.add(tenant, workspace, payload_digest)  # before the row can commit
        self._insert("tombstones", [tenant, workspace, payload_digest, record_id, cursor, at_ms])
        if self._member is not None:
            self._member.pending.tombstones.add((tenant, workspace, payload_digest))

    def tombstoned(self, tenant: str, workspace: str, payload_digest: str) -> bool:
        return self._one(
            "SELECT 1 FROM tombstones WHERE tenant = ? AND workspace = ? AND payload_digest = ? LIMIT 1",
            [tenant, workspace, payload_digest],
        ) is not None

    def tombstone_rows(self) -> list[dict[str, Any]]:
        keys = ("tenant", "workspace", "payload_digest", "record_id", "cursor", "at_ms")
        rows = self._all(f"SELECT {', '.join(keys)} FROM tombstones ORDER BY tenant, workspace, cursor, record_id")
        return [{**dict(zip(keys, r, strict=True)), "cursor": int(r[4])} for r in rows]

    # -- sealed projections (opaque blobs) ------------------------------------------------------
    def put_projection(self, tenant: str, workspace: str, record_id: str, sealed: bytes, *, new: bool) -> None:
        # A record inserted by this transaction has no projection yet: a plain INSERT (~0.6 ms
        # cheaper than INSERT OR REPLACE, which a re-index of an older record needs).
        self._insert("projections", [record_id, tenant, workspace, sealed],
                     verb="INSERT" if new else "INSERT OR REPLACE")

    def delete_projection(self, record_id: str) -> None:
        # Whether or not a row is there: asking first cost a read (~0.8 ms) on every forget.
        self._exec("DELETE FROM projections WHERE record_id = ?", [record_id])  # ids are unique across scopes

    def projection_blob(self, record_id: str) -> tuple[bytes, RecordRow] | None:
        found = self._one(f"SELECT p.sealed, {_RECORD_COLS_R} "
                          "FROM projections p JOIN records r USING (record_id) WHERE p.record_id = ?", [record_id])
        return (bytes(found[0]), record_of(found[1:])) if found is not None else None

    def scope_projection_blobs(self, tenant: str, workspace: str) -> list[tuple[RecordRow, bytes]]:
        return [(record_of(found[1:]), bytes(found[0])) for found in self._all(
            f"SELECT p.sealed, {_RECORD_COLS_R} FROM projections p JOIN records r USING (record_id) "
            "WHERE p.tenant = ? AND p.workspace = ?", [tenant, workspace])]

    def update_projection_blobs(self, blobs: list[tuple[str, bytes]]) -> None:
        # One multi-row statement per chunk, not three per record (a store re-analyzed at start-up:
        # ~5 ms per record that way).
        for chunk in iter_chunks(blobs, 2048):
            self._exec("UPDATE projections SET sealed = u.sealed FROM (SELECT unnest($1::VARCHAR[]) AS "
                       "record_id, unnest($2::BLOB[]) AS sealed) u WHERE projections.record_id = u.record_id",
                       [[r for r, _ in chunk], [b for _, b in chunk]])

    def drop_scope_projections(self, tenant: str, workspace: str) -> None:
        self._exec("DELETE FROM projections WHERE tenant = ? AND workspace = ?", [tenant, workspace])

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
            columns = [list(c) for c in zip(*(_audit_values(d) for d in docs), strict=True)]
            picks = ", ".join(f"unnest(${i + 1}::{t}[])" for i, t in enumerate(_AUDIT_TYPES))
            self._con.execute(f"INSERT INTO audit ({', '.join(_AUDIT_KEYS)}) SELECT {picks}"
                              + (" ON CONFLICT DO NOTHING" if if_absent else ""), columns)
            for doc in docs:
                self.audit_heads_changed[doc.get("chain", LEGACY_CHAIN)] = (int(doc["seq"]), doc["row_digest"])
            return
        for doc in docs:
            self._insert("audit", _audit_values(doc), verb="INSERT OR IGNORE" if if_absent else "INSERT")
            self.audit_heads_changed[doc.get("chain", LEGACY_CHAIN)] = (int(doc["seq"]), doc["row_digest"])

    def audit_rows(self, tenant: str | None, workspace: str | None, from_seq: int, to_seq: int | None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(_AUDIT_KEYS)} FROM audit WHERE seq >= ? AND seq <= ?"
        params: list[Any] = [from_seq, to_seq if to_seq is not None else 2**63]
        if tenant is not None:
            sql += " AND tenant = ? AND workspace = ?"
            params += [tenant, workspace]
        return [_audit_doc(r) for r in self._all(sql + " ORDER BY chain, seq", params)]

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        return [(r[0], int(r[1])) for r in self._all(
            "SELECT context_nonce, at_ms FROM audit WHERE at_ms >= ? AND context_nonce <> ''", [since_ms])]

    def put_page_pin(self, pin: SharedPin) -> None:
        raise ValueError("page pins are shared only where other cores write the store")

    def all_audit_heads(self) -> dict[str, tuple[int, str]]:
        return {r[0]: (int(r[1]), r[2]) for r in self._all(
            "SELECT chain, seq, row_digest FROM audit WHERE (chain, seq) IN "
            "(SELECT chain, max(seq) FROM audit GROUP BY chain)")}

    # -- trusted host keys ------------------------------------------------------------
    def trusted_host_keys(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._all("SELECT key_id, public_key_pem FROM trusted_host_keys ORDER BY key_id")]

    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        """Trust the key if it is not stored yet; a key stored so serves nothing until bound."""
        self._exec("INSERT INTO trusted_host_keys (key_id, public_key_pem, added_at_ms) VALUES (?, ?, ?) "
                   "ON CONFLICT DO NOTHING", [key_id, pem, at_ms])

    def host_key_rows(self) -> list[HostKeyRow]:
        rows = self._all("SELECT key_id, public_key_pem, added_at_ms, tenants, all_tenants, maintenance_scopes "
                         "FROM trusted_host_keys ORDER BY key_id")
        return [HostKeyRow(key_id=r[0], public_key_pem=r[1], added_at_ms=int(r[2]),
                           tenants=tuple(json.loads(r[3] or "[]")), all_tenants=bool(r[4]),
                           maintenance_scopes=tuple(json.loads(r[5] or "[]"))) for r in rows]

    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        self._exec("INSERT INTO trusted_host_keys (key_id, public_key_pem, added_at_ms, tenants, all_tenants, "
                   "maintenance_scopes) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key_id) DO UPDATE SET "
                   "tenants = excluded.tenants, all_tenants = excluded.all_tenants, "
                   "maintenance_scopes = excluded.maintenance_scopes",
                   [row.key_id, row.public_key_pem, row.added_at_ms, json.dumps(list(row.tenants)), row.all_tenants,
                    json.dumps(list(row.maintenance_scopes))])

    def remove_trusted_host_key(self, key_id: str) -> bool:
        n = self._one("SELECT count(*) FROM trusted_host_keys WHERE key_id = ?", [key_id])[0]  # type: ignore[index]
        self._exec("DELETE FROM trusted_host_keys WHERE key_id = ?", [key_id])
        return bool(n)

    def meta(self, key: str) -> str | None:
        row = self._one("SELECT v FROM store_meta WHERE k = ?", [key])
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._exec("INSERT INTO store_meta VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                          [key, value])

    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        return dict(self._all("SELECT k, v FROM store_meta WHERE starts_with(k, ?)", [prefix]))

    # -- the store as a whole ------------------------------------------------------------------------
    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def is_empty(self) -> bool:
        """True when nothing but trusted host keys and metadata was ever written (a restore target)."""
        for table in ("scopes", "journal", "records", "candidates", "audit", "tombstones", "data_keys"):
            if self._one(f"SELECT 1 FROM {table} LIMIT 1") is not None:
                return False
        return True

    def counts(self) -> dict[str, Any]:
        """What the store holds, for the start-up summary: scopes, records and candidates by state."""
        return {
            "scopes": int(self._one("SELECT count(*) FROM scopes")[0]),  # type: ignore[index]
            "records": dict(self._all("SELECT state, count(*) FROM records GROUP BY state ORDER BY state")),
            "candidates": dict(self._all("SELECT state, count(*) FROM candidates GROUP BY state ORDER BY state")),
            "audit_rows": int(self._one("SELECT count(*) FROM audit")[0]),  # type: ignore[index]
        }


class DuckDBEngine:
    """The DuckDB file engine (``engine.Engine``). ``open`` fences, migrates and loads its caches."""

    # The flock fence: no other process opens the file while this one has it. A standalone audit
    # row's own transaction would cost a commit: spooled. The key vault (a file) says which KEK
    # generation wraps a key.
    capabilities = EngineCapabilities(sole_writer=True, spools_audit=True)
    shared = SOLE_WRITER_STATE  # nothing to share with another core (shared_state.py)
    tx_class: type[DuckDBEngineTx] = DuckDBEngineTx

    def __init__(self, data_dir: Path, *, migrate: bool = True, keys: DataKeys | None = None) -> None:
        """``keys``: the key vault, needed only by migration 6 (it sealed the plain projections
        of older stores)."""
        self.data_dir = data_dir
        self._keys = keys
        self._hooks: CommitHooks | None = None
        # Observability (``StoreObservers``, the kernel's): seconds per COMMIT. Its ``on_scope_lock``
        # is never called: one writer lock, not scope locks.
        self.observers = StoreObservers()
        self.path = data_dir / "engram.duckdb"
        # Held for the process lifetime; created owner-only whatever the process umask.
        self._lock_file = os.fdopen(os.open(data_dir / "engram.lock", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600),
                                    "a+")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise EngramError(Code.FENCE_LOST, "another process holds the store") from None
        try:
            self._con = _connect(self.path)
        except duckdb.Error as exc:
            self._lock_file.close()
            raise EngramError(Code.STORE_UNAVAILABLE, f"open failed: {type(exc).__name__}") from None
        self._write_lock = threading.RLock()
        # Group commit (group_commit.py): the open batch, and how many threads wait for the
        # writer lock (a member leaves the batch open only while someone is queued to close it).
        self._batch: Batch | None = None
        self._waiting = 0
        self._waiting_lock = threading.Lock()
        self._local = threading.local()
        self._open = True
        # DuckDB's memory limit as opened (the index build bounds it for a while: _bounded_cache).
        self._memory_limit = str(self._con.execute("SELECT current_setting('memory_limit')").fetchone()[0])  # type: ignore[index]
        self.migrations_applied_at_open = self.check_migrations(apply=migrate)
        if migrate and self._con.execute("SELECT 1 FROM store_meta WHERE k = 'compact_pending'").fetchall():
            self._compact()
        self._load_key_digests()
        # The committed scope rows and audit chain heads the writer reads instead of the database,
        # updated after each COMMIT; None after a commit of unknown outcome (then read again).
        self._copies_lock = threading.Lock()
        self._scopes: dict[tuple[str, str], ScopeRow] | None = None
        self._heads: dict[str, tuple[int, str]] | None = None
        if migrate:
            self._load_copies()

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

    # -- migrations ------------------------------------------------------------------
    def check_migrations(self, *, apply: bool) -> list[int]:
        """Verify the ledger against the code; apply missing migrations when ``apply``."""
        con = self._con
        con.execute(LEDGER_DDL)
        ledger = {int(v): (n, c) for v, n, c in con.execute(
            "SELECT version, name, checksum FROM schema_migrations ORDER BY version").fetchall()}
        known = {m.version: m for m in MIGRATIONS}
        for version, (_name, checksum) in ledger.items():
            if version not in known or known[version].checksum != checksum:
                raise EngramError(Code.MIGRATION_LEDGER_INVALID, f"ledger version {version} does not match code")
        if ledger and sorted(ledger) != list(range(1, max(ledger) + 1)):
            raise EngramError(Code.MIGRATION_LEDGER_INVALID, "ledger has gaps")
        pending = [m for m in MIGRATIONS if m.version not in ledger]
        if pending and not apply:
            raise EngramError(Code.MIGRATION_LEDGER_INVALID, "migrations pending")
        applied = []
        for m in pending:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(m.sql)
                if m.step is not None:
                    getattr(self, m.step)(con)
                con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, ?)",
                            [m.version, m.name, m.checksum, time.time_ns() // 1_000_000])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            applied.append(m.version)
        return applied

    def seal_legacy_projections(self, con: duckdb.DuckDBPyConnection) -> None:
        """Migration 6: each record's plain postings and vector become one sealed projection,
        the plain tables go, and the file is rewritten once this commits (``_compact``)."""
        by_record: dict[str, dict[int, Counter[int]]] = {}
        for term, record_id, name, tf in con.execute("SELECT term, record_id, field, tf FROM postings").fetchall():
            by_record.setdefault(record_id, {}).setdefault(FIELD_CODE[name], Counter())[int(term)] = int(tf)
        vectors = {rid: (model, list(values)) for rid, model, values in
                   con.execute("SELECT record_id, model, embedding FROM vectors").fetchall()}
        # Migration 6 runs on the records table of its time: the columns before migration 12.
        rows = con.execute(f"SELECT {RECORD_COLS_BEFORE_12} FROM records WHERE record_id IN "
                           "(SELECT record_id FROM postings UNION SELECT record_id FROM vectors)").fetchall()
        sealed = []
        for found in rows:
            rec = record_of(found)
            key = self._record_key(rec)
            if key is None:
                continue  # its key is gone: the projection is unreadable anyway, like its body
            model, vector = vectors.get(rec.record_id, ("", None))
            projection = Projection.of(by_record.get(rec.record_id, {}), model, vector)
            sealed.append((rec.record_id, rec.tenant, rec.workspace, seal_projection(key, rec.record_id, projection)))
        for chunk in iter_chunks(sealed, 2048):
            con.execute("INSERT INTO projections SELECT unnest($1::VARCHAR[]), unnest($2::VARCHAR[]), "
                        "unnest($3::VARCHAR[]), unnest($4::BLOB[])", [list(c) for c in zip(*chunk, strict=True)])
        con.execute("DROP TABLE postings; DROP TABLE vectors; DROP TABLE field_stats")
        if rows:
            con.execute("INSERT OR REPLACE INTO store_meta VALUES ('compact_pending', 'migration 6')")

    def destructions_wrapped_by_active_generation(self, con: duckdb.DuckDBPyConnection) -> None:
        """Migration 10: destructions recorded before generations were tracked were wrapped by the
        KEKs up to the one active now; recorded as wrapped by it (pending until it retires)."""
        active = getattr(self._keys, "active_generation", None)
        if active is not None:
            con.execute("UPDATE key_destructions SET generation = ?", [int(active())])

    def _compact(self) -> None:
        """Rewrite the database into a fresh file and swap it in: DuckDB keeps freed pages (with
        whatever rows they held) in its file, a copy carries only live data. Crash-safe: the
        old file stays until the copy is complete and synced, and the pending mark is cleared
        only in the new file."""
        con = self._con
        con.execute("CHECKPOINT")
        fresh = self.path.with_name(self.path.name + ".compact")
        fresh.unlink(missing_ok=True)
        name = con.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        con.execute(f"ATTACH '{fresh}' AS engram_compact")
        con.execute(f'COPY FROM DATABASE "{name}" TO engram_compact')
        con.execute("DETACH engram_compact")
        con.close()
        fd = os.open(fresh, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(fresh, self.path)
        Path(str(self.path) + ".wal").unlink(missing_ok=True)
        dir_fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._con = _connect(self.path)
        self._con.execute("DELETE FROM store_meta WHERE k = 'compact_pending'")
        self._con.execute("CHECKPOINT")

    def _record_key(self, rec: RecordRow) -> bytes | None:
        """Migration 6 only: the record's data key from the vault the engine was opened with."""
        if self._keys is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "migration 6 needs the key vault")
        if rec.key_slot is None:
            return None
        return self._keys.data_key(int(rec.key_slot), f"record:{rec.record_id}")

    def migrate(self) -> list[int]:
        """Re-verify the ledger and apply pending migrations, serialized with writers."""
        with self._exclusive():
            return self.check_migrations(apply=True)

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def migration_code(self) -> list[dict[str, Any]]:
        return [{"version": m.version, "name": m.name, "checksum": m.checksum} for m in MIGRATIONS]

    def migration_ledger(self) -> list[dict[str, Any]]:
        # On a cursor of its own: the store's connection belongs to the writer, and DuckDB refuses
        # a statement on a connection busy in another thread (the writer's COMMIT then fails).
        cur = self._con.cursor()
        try:
            rows = cur.execute(
                "SELECT version, name, checksum, applied_at_ms FROM schema_migrations ORDER BY version").fetchall()
        finally:
            cur.close()
        return [{"version": r[0], "name": r[1], "checksum": r[2], "applied_at_ms": r[3]} for r in rows]

    # -- the writer's committed copies ---------------------------------------------------------
    def _load_copies(self) -> None:
        cur = self._con.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            scopes = {(r[0], r[1]): ScopeRow(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4], int(r[5]), r[6])
                      for r in cur.execute("SELECT tenant, workspace, activated, tools, authorization_epoch, "
                                           "last_cursor, last_event_digest FROM scopes").fetchall()}
            heads = {r[0]: (int(r[1]), r[2]) for r in cur.execute(
                "SELECT chain, seq, row_digest FROM audit WHERE (chain, seq) IN "
                "(SELECT chain, max(seq) FROM audit GROUP BY chain)").fetchall()}
            cur.execute("ROLLBACK")
        finally:
            cur.close()
        with self._copies_lock:
            self._scopes, self._heads = scopes, heads

    def committed_scopes(self) -> dict[tuple[str, str], ScopeRow] | None:
        """The writer's view of committed scope rows; None (read the database) when stale."""
        return self._scopes

    def scope_now(self, tenant: str, workspace: str) -> ScopeRow | None:
        scopes = self._scopes
        if scopes is not None:
            return scopes.get((tenant, workspace))
        with self.read(snapshot=False) as tx:
            return tx.scope(tenant, workspace)

    def changes_since(self, tenant: str, workspace: str, after: int) -> ScopeChanges:
        with self.read(snapshot=True) as tx:
            return read_changes_since(tx, tenant, workspace, after)

    def audit_head(self, chain: str) -> tuple[int, str]:
        """A chain's committed head ((0, GENESIS) for a chain with no row yet)."""
        heads = self._heads
        if heads is None:
            self._load_copies()
            heads = self._heads or {}
        return heads.get(chain, (0, GENESIS))

    def _committed(self, scope_changes: dict[tuple[str, str], ScopeRow],
                   heads: dict[str, tuple[int, str]]) -> None:
        with self._copies_lock:
            if self._scopes is not None:
                self._scopes.update(scope_changes)
            if self._heads is not None:
                self._heads.update(heads)

    def _stale(self) -> None:
        with self._copies_lock:
            self._scopes = self._heads = None

    def reload(self) -> None:
        """Re-read the committed copies and negative-lookup digests (after writes that bypassed
        the engine's transactions, e.g. a bulk loader)."""
        with self._exclusive():
            self._load_key_digests()
            self._load_copies()

    def _require_open(self) -> None:
        if not self._open:
            raise EngramError(Code.STORE_UNAVAILABLE, "store closed")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The writer lock, counted while waited for (group commit)."""
        with self._waiting_lock:
            self._waiting += 1
        self._write_lock.acquire()
        with self._waiting_lock:
            self._waiting -= 1
        try:
            yield
        finally:
            self._write_lock.release()

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The writer lock with no batch open: an open batch is committed first."""
        if self.in_write():  # this thread already holds the lock, inside its own transaction
            with self._write_lock:
                yield
            return
        with self._locked():
            if self._batch is not None:
                self._settle()
            yield

    @contextmanager
    def write(self, *, batched: bool = False, effects: TxEffects | None = None,
              scope: tuple[str, str] | None = None) -> Iterator[DuckDBEngineTx]:
        """A read-write transaction. ``batched``: a member of a group commit (group_commit.py),
        for the mutations agents make at rate; otherwise a transaction of its own. ``scope`` is
        not needed: one writer batches every scope's members."""
        self._require_open()
        effects = effects if effects is not None else TxEffects()
        if batched:
            with tracing.span("engram.store.transaction"):
                yield from self._batched(effects)
            return
        hooks = self._hooks
        assert hooks is not None, "the store kernel sets the commit hooks"
        with tracing.span("engram.store.transaction"), self._exclusive():
            con = self._con
            tx = self.tx_class(con, self, writing=True)
            con.execute("BEGIN TRANSACTION")
            self._local.writing = True
            try:
                yield tx
            except BaseException:
                _rollback(con)
                hooks.rolled_back([effects])
                raise
            finally:
                self._local.writing = False
            try:
                hooks.prepare([effects], tx, hooks.before_flush([effects]))
            except BaseException as exc:
                _rollback(con)
                hooks.rolled_back([effects])
                raise self._refusal(exc) from None
            self._commit(con)
            self._committed(tx.scope_changes, tx.audit_heads_changed)
            hooks.committed([effects], tx.scope_changes)

    def _batched(self, effects: TxEffects) -> Iterator[DuckDBEngineTx]:
        with self._locked():
            batch = self._batch
            if batch is None:
                self._con.execute("BEGIN TRANSACTION")
                batch = self._batch = Batch()
            tx = self.tx_class(self._con, self, writing=True, batch=batch)
            self._local.writing = True
            try:
                yield tx
            except BaseException:
                self._local.writing = False
                if tx.promoted or batch.members == 0:
                    # Promoted: its writes are in the shared transaction, so nothing of it may commit.
                    self._abandon([effects])
                else:
                    # Commit the others now, queued writers or not: this failure may come from
                    # what the batch holds uncommitted (a family member or equal content admitted
                    # by an earlier member: POLICY_STALE), and its caller's retry decides again
                    # from committed state. Left open while writers queue, the batch made every
                    # such retry fail against it again: a livelock under load.
                    self._hooks.rolled_back([effects])  # type: ignore[union-attr]
                    self._settle()
                raise
            self._local.writing = False
            try:
                batch.join(self._con, tx._member)  # type: ignore[arg-type]
            except BaseException as exc:
                self._abandon([effects])
                raise self._refusal(exc) from None
            batch.members += 1
            batch.effects.append(effects)
            batch.scope_changes.update(tx.scope_changes)
            if self._waiting == 0 or batch.members >= MAX_MEMBERS:
                self._settle()
        batch.done.wait()
        if batch.error is not None:
            raise batch.error

    @staticmethod
    def _refusal(exc: BaseException) -> BaseException:
        """What members of a batch rolled back for ``exc`` are told: nothing of theirs happened."""
        if isinstance(exc, EngramError):
            return exc
        return EngramError(Code.STORE_UNAVAILABLE, f"write batch rolled back: {type(exc).__name__}")

    def _abandon(self, extra: list[TxEffects]) -> None:
        """Roll the open batch back; its members are refused, retriably (under the writer lock)."""
        batch, self._batch = self._batch, None
        _rollback(self._con)
        self._hooks.rolled_back([*(batch.effects if batch is not None else []), *extra])  # type: ignore[union-attr]
        if batch is not None:
            batch.fail(EngramError(Code.STORE_UNAVAILABLE, "write batch rolled back: retry"))

    def _settle(self) -> None:
        """Commit the open batch and answer its members (under the writer lock): their rows
        flushed, the kernel's ``prepare`` (audit rows chained and written, the key vault synced
        meanwhile, audit devices), COMMIT, then the kernel's ``committed``."""
        batch, self._batch = self._batch, None
        assert batch is not None
        hooks = self._hooks
        assert hooks is not None
        con = self._con
        if batch.members == 0:
            _rollback(con)
            batch.done.set()
            return
        try:
            token = hooks.before_flush(batch.effects)  # the key vault's fdatasync runs meanwhile
            batch.flush(con)
            hooks.prepare(batch.effects, _BatchAudit(self, batch), token)
            batch.flush(con)
        except BaseException as exc:
            _rollback(con)
            hooks.rolled_back(batch.effects)
            batch.fail(self._refusal(exc))
            return
        try:
            self._commit(con, batch.members)
        except EngramError as exc:
            batch.fail(exc)
            return
        self._committed(batch.scope_changes, batch.audit_heads)
        hooks.committed(batch.effects, batch.scope_changes)
        batch.done.set()

    def _commit(self, con: duckdb.DuckDBPyConnection, transactions: int = 1) -> None:
        started = time.perf_counter()
        try:
            con.execute("COMMIT")
            if self.observers.on_commit is not None:
                self.observers.on_commit(time.perf_counter() - started, transactions)
        except duckdb.Error as exc:
            # The commit may or may not have reached the WAL; the committed copies cannot know either.
            self._stale()
            self._hooks.commit_unknown()  # type: ignore[union-attr]
            raise EngramError(Code.MUTATION_OUTCOME_UNKNOWN, f"commit failed: {type(exc).__name__}") from None

    def in_write(self) -> bool:
        return getattr(self._local, "writing", False)

    def _load_key_digests(self) -> None:
        """Every idempotency key, every scope's payload digests (records and tombstones) and every
        used confirmation, as 64-bit digests (key_digests.py), read in one vectorized query each;
        and the ids that appear in a record link (record_links.py)."""
        cur = self._con.cursor()
        try:
            self.idempotency_keys = KeyDigests(cur.execute(
                "SELECT md5_number_upper(concat_ws(chr(0), tenant, workspace, principal, key)) AS d "
                "FROM idempotency").fetchnumpy()["d"])
            self.payload_keys = KeyDigests(cur.execute(
                "SELECT md5_number_upper(concat_ws(chr(0), tenant, workspace, payload_digest)) AS d FROM records "
                "UNION ALL SELECT md5_number_upper(concat_ws(chr(0), tenant, workspace, payload_digest)) "
                "FROM tombstones").fetchnumpy()["d"])
            self.used_grants = KeyDigests(cur.execute(
                "SELECT md5_number_upper(grant_id) AS d FROM used_confirmations").fetchnumpy()["d"])
            self.linked_ids = {r[0] for r in cur.execute(
                "SELECT record_id FROM record_families UNION SELECT record_id FROM record_sources "
                "UNION SELECT source_id FROM record_sources").fetchall()}
            # Candidates whose facts are stored in clear: only those captured before the facts
            # were sealed in the envelope (issue 26.7), never scrubbed since. Every other one
            # stores '{}', and scrubbing it is a statement (0.34 ms) that changes nothing.
            self.facts_in_clear = {r[0] for r in cur.execute(
                "SELECT candidate_id FROM candidates WHERE facts <> '{}'").fetchall()}
        finally:
            cur.close()

    # -- what the search index is built from ------------------------------------------------------
    @contextmanager
    def index_scan(self) -> Iterator[_IndexScan]:
        """One snapshot: the rows of the records that have a projection, in table order (= document
        order: rows are only appended, updates keep their place), then the projections in any
        order; neither joined nor sorted by DuckDB (a join ordered by document held every row
        and projection at once: ~9 KB a record at its peak). DuckDB's block cache is bounded
        meanwhile (``_bounded_cache``)."""
        self._require_open()
        cur = self._con.cursor()
        try:
            with self._bounded_cache():
                cur.execute("BEGIN TRANSACTION")
                try:
                    yield _IndexScan(cur)
                finally:
                    _rollback(cur)
        finally:
            cur.close()

    @contextmanager
    def _bounded_cache(self) -> Iterator[None]:
        """Bound DuckDB's block cache while the index is built (``BUILD_CACHE_BYTES`` above what
        it held), then evict the table blocks it cached and restore the limit. Only the cache is
        bounded: indexes and anything pinned keep their memory, so concurrent writers (the server
        builds the index while it already listens) keep the headroom. Best effort: a limit DuckDB
        refuses leaves the build unbounded, never failed. On a cursor of its own, outside the
        build's transaction: a refused SET aborts the transaction it runs in."""
        ctl = self._con.cursor()

        def held() -> tuple[int, int]:
            rows = ctl.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
            return sum(n for _, n in rows), sum(n for tag, n in rows if tag == "BASE_TABLE")

        def limit(nbytes: int) -> bool:
            try:
                ctl.execute(f"SET memory_limit = '{max(int(nbytes), 1 << 20)}B'")
                return True
            except duckdb.Error:
                return False

        try:
            try:
                used, _ = held()
                limit(used + BUILD_CACHE_BYTES)
            except duckdb.Error:
                pass
            yield
        finally:
            try:
                used, cached = held()
                # Evicts the cached table blocks (a refused limit evicts them too; the second, met,
                # makes DuckDB hand the freed memory back).
                if not limit(used - cached + CACHE_AFTER_BUILD):
                    limit(held()[0] + CACHE_AFTER_BUILD)
                ctl.execute("RESET memory_limit")
                if ctl.execute("SELECT current_setting('memory_limit')").fetchone()[0] != self._memory_limit:  # type: ignore[index]
                    ctl.execute(f"SET memory_limit = '{self._memory_limit}'")
            except duckdb.Error:
                log.warning("could not restore DuckDB's memory limit after building the search index")
            finally:
                ctl.close()

    @contextmanager
    def read(self, *, snapshot: bool = True) -> Iterator[DuckDBEngineTx]:
        """A reader on this thread's cursor: one consistent snapshot, or (``snapshot=False``)
        each statement on its own latest committed state, which saves the transaction's
        statements where the caller revalidates what it reads (search)."""
        self._require_open()
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cursor = cur
        if not snapshot:
            yield self.tx_class(cur, self)
            return
        cur.execute("BEGIN TRANSACTION")
        try:
            yield self.tx_class(cur, self)
        finally:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass

    def describe(self) -> dict[str, Any]:
        with self.read() as tx:
            counts = tx.counts()
        return {"engine": "duckdb", "store": str(self.path), "migrations_applied": self.migrations_applied_at_open,
                **counts}

    def is_open(self) -> bool:
        return self._open

    def analyze(self) -> None:
        """Nothing to do: DuckDB keeps its tables' statistics as it writes them."""

    def checkpoint(self, *, attempts: int = 20, pause_s: float = 0.01) -> None:
        """CHECKPOINT under the writer lock. DuckDB refuses while it still counts another
        transaction as writing (seen under concurrent reads right after a commit), so a
        refusal is retried briefly; a forget reports ``pending`` only if it never succeeds."""
        with self._exclusive():
            for attempt in range(attempts):
                try:
                    self._con.execute("CHECKPOINT")
                    return
                except duckdb.TransactionException:
                    if attempt == attempts - 1:
                        raise
                    time.sleep(pause_s * (attempt + 1))

    def close(self) -> None:
        """Close the file and release the fence (the kernel moved what it had to first)."""
        if not self._open:
            return
        self._open = False
        with self._exclusive():
            try:
                self._con.execute("CHECKPOINT")
            except duckdb.Error:
                pass
            self._con.close()
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
        finally:
            self._lock_file.close()


class _BatchAudit:
    """Where a group commit's audit rows go (``engine.AuditSink``): the batch's pending rows, after
    the heads the engine committed."""

    def __init__(self, engine: DuckDBEngine, batch: Batch) -> None:
        self._engine = engine
        self._batch = batch

    def audit_heads(self, chains: list[str]) -> dict[str, tuple[int, str]]:
        return {c: self._batch.audit_heads.get(c) or self._engine.audit_head(c) for c in chains}

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        for doc in docs:
            self._batch.pending.add_row("audit", "INSERT OR IGNORE" if if_absent else "INSERT", "", _audit_values(doc))
            self._batch.audit_heads[doc.get("chain", LEGACY_CHAIN)] = (int(doc["seq"]), doc["row_digest"])


class _IndexScan:
    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur

    def indexed_rows(self) -> Iterator[tuple[Any, ...]]:
        self._cur.execute(f"SELECT {RECORD_COLS} FROM records WHERE record_id IN (SELECT record_id FROM projections)")
        while rows := self._cur.fetchmany(OPEN_CHUNK):
            yield from rows

    def projection_blobs(self) -> Iterator[tuple[str, bytes]]:
        self._cur.execute("SELECT record_id, sealed FROM projections")
        while rows := self._cur.fetchmany(OPEN_CHUNK):
            yield from rows

    def scopes(self) -> dict[tuple[str, str], ScopeRow]:
        return {(r[0], r[1]): ScopeRow(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4], int(r[5]), r[6])
                for r in self._cur.execute("SELECT tenant, workspace, activated, tools, authorization_epoch, "
                                           "last_cursor, last_event_digest FROM scopes").fetchall()}


def remove_store_files(data_dir: Path) -> None:
    for name in ("engram.duckdb", "engram.duckdb.wal", SPOOL_NAME):
        p = data_dir / name
        if p.exists():
            os.remove(p)
