"""DuckDB implementation of the Store port (SPEC §10).

One process writes (an exclusive ``flock`` on ``DIR/engram.lock`` is the
fence; DuckDB's own file lock backs it up). Writes are serialized by a lock
and run in one DuckDB transaction each; reads use per-thread cursors, which
see a consistent snapshot. Commit is the durability point: DuckDB's WAL is
flushed before ``COMMIT`` returns, and nothing is acknowledged before that.
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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb

from engram_core.errors import Code, EngramError
from engram_core.observability import tracing
from engram_core.store.audit_spool import SPOOL_NAME, AuditSpool
from engram_core.store.chain import GENESIS, audit_doc, event_digest_of
from engram_core.store.duckdb.group_commit import MAX_MEMBERS, Batch, Member, Pending, statement_of, tables_of
from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS
from engram_core.store.duckdb.record_links import RecordLinks
from engram_core.store.duckdb.record_sql import RECORD_COLS, record_of
from engram_core.store.duckdb.trust import TrustClasses
from engram_core.store.key_digests import KeyDigests
from engram_core.store.port import (
    AuditRow,
    CandidateRow,
    Event,
    HostKeyRow,
    IdempotencyRow,
    LexicalPage,
    LexicalStats,
    RecordRow,
    ScopeRow,
    iter_chunks,
)
from engram_core.store.projection import (
    DataKeys,
    Projection,
    open_plain,
    open_projection,
    seal_projection,
)
from engram_core.store.search_index import FIELD_CODE, IndexBuilder, Posting, RecordMeta, SearchIndex

SCHEMA_VERSION = max(m.version for m in MIGRATIONS)  # what this engine writes
SPOOL_BATCH = 512  # spooled audit rows moved into the table in one transaction
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
_AUDIT_KEYS = ("seq", "at_ms", "audit_id", "tenant", "workspace", "principal", "agent_id", "operation", "outcome",
               "target_digest", "decisions", "prev_digest", "row_digest")


def _audit_values(doc: dict[str, Any]) -> list[Any]:
    return [json.dumps(doc[k], sort_keys=True) if k == "decisions" else doc[k] for k in _AUDIT_KEYS]


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


class DuckDBTx(RecordLinks, TrustClasses):
    """Domain operations over one DuckDB connection inside a transaction."""

    def __init__(self, con: duckdb.DuckDBPyConnection, store: DuckDBStore, *, writing: bool = False,
                 latest: bool = False, batch: Batch | None = None) -> None:
        self._con = con
        self._store = store
        # A reader without a snapshot (each statement reads the latest commit) may also read the
        # committed copies published with each commit; a snapshot or a writer may not.
        self._latest = latest
        # A writer (the only one: the store's write lock) reads scope rows from the store's
        # committed copy plus its own changes, which the store publishes after COMMIT.
        self._writing = writing
        # A member of a group commit (group_commit.py) prepares its writes and joins ``batch``.
        self._batch = batch
        self._member = Member() if batch is not None else None
        self.scope_changes: dict[tuple[str, str], ScopeRow] = {}
        self._inserted: dict[str, tuple[int, RecordRow]] = {}
        self.audit_head: tuple[int, str] | None = None  # set by append_audit
        self.audit_docs: list[dict[str, Any]] = []  # this transaction's audit rows, for the audit devices
        # A batched member's audit rows: chained (sequence, previous digest) when its group commits.
        self.unchained_audit: list[AuditRow] = []
        # Slots of data keys destroyed in this transaction: the caller zeroes
        # them in the KeyVault after commit (SPEC §10 crypto-shredding).
        self.destroyed_slots: list[int] = []
        # Changes to the in-memory search index, applied by the store once this commits.
        self.index_ops: list[tuple[Any, ...]] = []
        # It names data key slots: the key vault is synced before its COMMIT (callers may create
        # keys without a sync of their own, so one sync serves a whole group commit).
        self.names_new_keys = False

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

    def _ensure_scope(self, tenant: str, workspace: str) -> ScopeRow:
        row = self.scope(tenant, workspace)
        if row is None:
            self._exec("INSERT INTO scopes VALUES (?, ?, false, '[]', 0, 0, ?)", [tenant, workspace, GENESIS])
            row = self._changed(ScopeRow(tenant, workspace, False, (), 0, 0, GENESIS))
        return row

    def set_activation(self, tenant: str, workspace: str, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        row = self._ensure_scope(tenant, workspace)
        self._exec(
            "UPDATE scopes SET activated = ?, tools = ? WHERE tenant = ? AND workspace = ?",
            [activated, json.dumps(sorted(tools)), tenant, workspace],
        )
        return self._changed(replace(row, activated=activated, tools=tuple(sorted(tools))))

    def bump_epoch(self, tenant: str, workspace: str) -> int:
        row = self._ensure_scope(tenant, workspace)
        self._exec(
            "UPDATE scopes SET authorization_epoch = authorization_epoch + 1 WHERE tenant = ? AND workspace = ?",
            [tenant, workspace],
        )
        return self._changed(replace(row, authorization_epoch=row.authorization_epoch + 1)).authorization_epoch

    def append_event(
        self, tenant: str, workspace: str, *, event_id: str, operation: str, target: str,
        from_state: str, to_state: str, at_ms: int, body: dict[str, Any],
    ) -> Event:
        scope = self._ensure_scope(tenant, workspace)
        cursor = scope.last_cursor + 1
        e = {
            "tenant": tenant, "workspace": workspace, "cursor": str(cursor), "event_id": event_id,
            "operation": operation, "target": target, "from_state": from_state, "to_state": to_state,
            "at_ms": at_ms, "body": body, "prev_digest": scope.last_event_digest,
        }
        ed = event_digest_of(e)
        self._insert("journal", [tenant, workspace, cursor, event_id, operation, target, from_state, to_state,
                                 at_ms, json.dumps(body, sort_keys=True), scope.last_event_digest, ed])
        self._scope_head(tenant, workspace, cursor, ed)
        self._changed(replace(scope, last_cursor=cursor, last_event_digest=ed))
        return Event(tenant, workspace, cursor, event_id, operation, target, from_state, to_state, at_ms, body,
                     scope.last_event_digest, ed)

    def _scope_head(self, tenant: str, workspace: str, cursor: int, event_digest: str) -> None:
        self._write(("head", tenant, workspace, cursor, event_digest))

    def set_scope_head(self, tenant: str, workspace: str, cursor: int, event_digest: str) -> None:
        """Move the scope's journal head past events a bulk loader inserted itself (tools/bench)."""
        row = self._ensure_scope(tenant, workspace)
        self._scope_head(tenant, workspace, cursor, event_digest)
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
        self._exec("UPDATE candidates SET facts = '{}' WHERE candidate_id = ?", [candidate_id])

    # -- data keys ---------------------------------------------------------------
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None:
        self._insert("data_keys", [owner, slot, at_ms])
        self.names_new_keys = True
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

    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None) -> int | None:
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
        self._insert("key_destructions", [owner, at_ms, reason])
        self.destroyed_slots.append(slot)
        return slot

    def live_key_slots(self) -> dict[int, str]:
        return {int(s): o for o, s in self._all("SELECT owner, slot FROM data_keys")}

    def key_destruction(self, owner: str) -> int | None:
        row = self._one("SELECT destroyed_at_ms FROM key_destructions WHERE owner = ?", [owner])
        return int(row[0]) if row else None

    # -- records -----------------------------------------------------------------
    def insert_record(self, row: RecordRow) -> None:
        self._store.payload_keys.add(row.tenant, row.workspace, row.payload_digest)  # before the row can commit
        self._insert(
            "records",
            [row.record_id, row.tenant, row.workspace, row.candidate_id, row.record_digest, row.payload_digest,
             row.state, row.trust_class, row.principal, row.agent_id, row.valid_t, row.valid_t_end,
             row.expires_at_ms, row.derivative_rule, row.accepted_at_ms, row.accepted_cursor, row.state_cursor,
             row.successor_id, row.sealed_body, row.key_slot],
            cols=f" ({RECORD_COLS})",
        )
        if self._member is not None and row.state == "accepted_current":
            self._member.pending.current_payloads.setdefault(
                (row.tenant, row.workspace, row.payload_digest), (row.accepted_cursor, row.record_id))
        # index_record (same transaction) needs the eligibility facts.
        self._inserted[row.record_id] = (0, row)

    def record(self, tenant: str, workspace: str, record_id: str) -> RecordRow | None:
        if self._latest:  # the committed copy where the index holds one (a forget's first look)
            return self.records(tenant, workspace, [record_id]).get(record_id)
        row = self._one(f"SELECT {RECORD_COLS} FROM records WHERE record_id = ?", [record_id])
        # The scope is checked here, not in SQL: with several scopes in the table, DuckDB plans
        # `record_id = ? AND tenant = ? AND workspace = ?` an order of magnitude slower (11 vs
        # 1.4 ms at 100k records) than the id alone.
        return record_of(row) if row and row[1] == tenant and row[2] == workspace else None

    def records(self, tenant: str, workspace: str, record_ids: list[str]) -> dict[str, RecordRow]:
        """These records' rows in the scope. A reader without a snapshot gets the latest committed
        rows, from the search index's copy where it holds one (published with each commit)."""
        if not record_ids:
            return {}
        if not self._latest:
            return self._records_from_db(tenant, workspace, record_ids)
        with self._store.search_index() as index:
            found = index.rows(tenant, workspace, record_ids)
        missing = [rid for rid in record_ids if rid not in found]
        if missing:
            found.update(self._records_from_db(tenant, workspace, missing))
        return found

    def _records_from_db(self, tenant: str, workspace: str, record_ids: list[str]) -> dict[str, RecordRow]:
        # Ids only in SQL, the scope checked here (see ``record``): with several scopes in the
        # table, adding `tenant = ? AND workspace = ?` made fetching 10 records 31 ms instead of 2.7.
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
        self.index_ops.append(("state", record_id, state == "accepted_current", state_cursor))
        if drop_body:
            self.index_ops.append(("evict", record_id))
        self._inserted.pop(record_id, None)

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

    # -- projections ----------------------------------------------------------------
    def index_record(self, tenant: str, workspace: str, record_id: str, fields: dict[str, Counter[int]],
                     vector: tuple[str, list[float]] | None = None) -> None:
        """The search projection of one accepted record (after ``insert_record``, in the same
        transaction): postings and the vector (model id, values), stored as one blob sealed under
        the record's own data key (store/projection.py), so a forget shreds them with the body."""
        inserted = self._inserted.get(record_id)
        if inserted is not None and inserted[1].state == "accepted_current":
            r = inserted[1]
        else:  # a record inserted earlier (rebuild, restore), or whose state changed since
            found = self._one(f"SELECT {RECORD_COLS} FROM records WHERE record_id = ?", [record_id])
            if found is None:
                raise EngramError(Code.STORE_UNAVAILABLE, "index_record before insert_record")
            r = record_of(found)
        projection = Projection.of({FIELD_CODE[name]: counts for name, counts in fields.items()},
                                   *(vector if vector is not None else ("", None)))
        key = self._store.data_key(r)
        # A record inserted by this transaction has no projection yet: a plain INSERT (~0.6 ms
        # cheaper than INSERT OR REPLACE, which a re-index of an older record needs).
        self._insert("projections", [record_id, tenant, workspace, seal_projection(key, record_id, projection)],
                     verb="INSERT" if inserted is not None else "INSERT OR REPLACE")
        postings = [Posting(term, name, tf, sum(counts.values()))
                    for name, counts in fields.items() for term, tf in counts.items()]
        self.index_ops.append(("index", tenant, workspace, RecordMeta.of(r), postings))
        if vector is not None:
            self.index_ops.append(("vector", tenant, workspace, record_id, vector[0], vector[1]))

    def unindex_record(self, tenant: str, workspace: str, record_id: str) -> int:
        """Delete the record's sealed projection; returns how many postings it held (as the
        committed index counts them). The DELETE runs whether or not a row is there: asking
        first cost a read (~0.8 ms) on every forget."""
        self.index_ops.append(("unindex", tenant, workspace, record_id))
        with self._store.search_index() as index:
            removed = index.postings_of(tenant, workspace, record_id)
        self._exec("DELETE FROM projections WHERE record_id = ?", [record_id])  # ids are unique across scopes
        return removed

    def projection(self, record_id: str) -> Projection | None:
        """The record's search projection, opened with its data key (None: it has none)."""
        found = self._one(f"SELECT p.sealed, {_RECORD_COLS_R} "
                          "FROM projections p JOIN records r USING (record_id) WHERE p.record_id = ?", [record_id])
        if found is None:
            return None
        return open_projection(self._store.data_key(record_of(found[1:])), record_id, found[0])

    def postings_count(self, record_id: str) -> int:
        projection = self.projection(record_id)
        return projection.postings if projection is not None else 0

    def vector_count(self, record_id: str) -> int:
        projection = self.projection(record_id)
        return int(projection is not None and projection.vector is not None)

    def lexical_stats(self, tenant: str, workspace: str, terms: list[int]) -> LexicalStats:
        """Corpus statistics BM25 needs for ``terms`` in one scope (field statistics and document
        frequencies the in-memory index counts from the projections). Search pins them
        with the first page, so later pages score every record as the first page did (SPEC §5)."""
        with self._store.search_index() as index:
            return index.stats(tenant, workspace, terms)

    def rank_lexical(
        self, tenant: str, workspace: str, stats: LexicalStats, weights: dict[str, float], *, k1: float, b: float,
        now_ms: int, half_life_ms: int, lexical_weight: float, max_accepted_cursor: int,
        best_bm25: float | None, after: tuple[float, int, str] | None, limit: int,
        window: tuple[int, int] | None = None, neighbours: tuple[int, float, int] | None = None,
    ) -> LexicalPage:
        """BM25F ranking of the scope's eligible records (see ``SearchIndex.rank``)."""
        with self._store.search_index() as index:
            return index.rank(tenant, workspace, stats, weights, k1=k1, b=b, now_ms=now_ms, half_life_ms=half_life_ms,
                              lexical_weight=lexical_weight, max_accepted_cursor=max_accepted_cursor,
                              best_bm25=best_bm25, after=after, limit=limit, window=window, neighbours=neighbours)

    def rank_vectors(
        self, tenant: str, workspace: str, model: str, vector: list[float], *, now_ms: int,
        max_accepted_cursor: int, min_similarity: float, limit: int,
        neighbours: tuple[int, float, int] | None = None,
    ) -> list[tuple[str, float, int]]:
        """Nearest eligible records by cosine similarity (see ``SearchIndex.nearest``)."""
        with self._store.search_index() as index:
            return index.nearest(tenant, workspace, model, vector, now_ms=now_ms,
                                 max_accepted_cursor=max_accepted_cursor, min_similarity=min_similarity, limit=limit,
                                 neighbours=neighbours)

    # -- audit -------------------------------------------------------------------------
    def append_audit(self, row: AuditRow) -> str:
        """Append the transaction's audit row; its digest, or "" in a batched transaction, whose
        rows take their place in the chain when the batch commits (``DuckDBStore._settle``)."""
        if self._member is not None:
            self.unchained_audit.append(row)
            return ""
        doc = audit_doc(row, self.audit_head or self._store.audit_head)
        self._insert("audit", _audit_values(doc))
        self.audit_head = (doc["seq"], doc["row_digest"])
        self.audit_docs.append(doc)
        return doc["row_digest"]

    def audit_chain_head(self) -> tuple[int, str]:
        """The last audit row's (seq, row digest) in this snapshot; (0, "") when there is none."""
        row = self._one("SELECT seq, row_digest FROM audit ORDER BY seq DESC LIMIT 1")
        return (int(row[0]), row[1]) if row else (0, "")

    def audit_rows(self, tenant: str | None, workspace: str | None, from_seq: int, to_seq: int | None) -> list[dict[str, Any]]:
        sql = ("SELECT seq, at_ms, audit_id, tenant, workspace, principal, agent_id, operation, outcome, "
               "target_digest, decisions, prev_digest, row_digest FROM audit WHERE seq >= ? AND seq <= ?")
        params: list[Any] = [from_seq, to_seq if to_seq is not None else 2**63]
        if tenant is not None:
            sql += " AND tenant = ? AND workspace = ?"
            params += [tenant, workspace]
        out = []
        for r in self._all(sql + " ORDER BY seq", params):
            d = dict(zip(_AUDIT_KEYS, r, strict=True))
            d["seq"] = int(d["seq"])
            d["decisions"] = json.loads(d["decisions"])
            out.append(d)
        return out

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

    # -- maintenance (SPEC §12): projections, backup and restore -------------------------
    def drop_projections(self, tenant: str, workspace: str) -> dict[str, int]:
        """Delete the sealed projections of one scope; returns what they held (postings, vectors)."""
        counts = self.projection_counts(tenant, workspace)
        self._exec("DELETE FROM projections WHERE tenant = ? AND workspace = ?", [tenant, workspace])
        self.index_ops.append(("drop_scope", tenant, workspace))
        return counts

    def _scope_projections(self, tenant: str, workspace: str) -> Iterator[tuple[RecordRow, bytes, Projection]]:
        """Every sealed projection of a scope with its record row and data key, opened (maintenance)."""
        for found in self._all(f"SELECT p.sealed, {_RECORD_COLS_R} "
                               "FROM projections p JOIN records r USING (record_id) "
                               "WHERE p.tenant = ? AND p.workspace = ?", [tenant, workspace]):
            rec = record_of(found[1:])
            key = self._store.data_key(rec)
            yield rec, key, open_projection(key, rec.record_id, found[0])

    def reseal_projections(self, tenant: str, workspace: str,
                           rewrite: Callable[[RecordRow, Projection], Projection | None]) -> int:
        """Replace the projection of every record in a scope with ``rewrite(record, projection)``
        (None: leave it), in one multi-row statement per chunk, not three per record (a store
        re-analyzed at start-up: ~5 ms per record that way). The in-memory index is not told: the
        caller reloads it after the commit."""
        resealed = []
        for rec, key, old in self._scope_projections(tenant, workspace):
            projection = rewrite(rec, old)
            if projection is not None:
                resealed.append((rec.record_id, seal_projection(key, rec.record_id, projection)))
        for chunk in iter_chunks(resealed, 2048):
            self._exec("UPDATE projections SET sealed = u.sealed FROM (SELECT unnest($1::VARCHAR[]) AS "
                              "record_id, unnest($2::BLOB[]) AS sealed) u WHERE projections.record_id = u.record_id",
                              [[r for r, _ in chunk], [b for _, b in chunk]])
        return len(resealed)

    def projection_counts(self, tenant: str, workspace: str) -> dict[str, int]:
        """Postings and vectors in the scope's sealed projections (opened: maintenance only)."""
        counts = {"projections": 0, "postings": 0, "vectors": 0}
        for _, _, projection in self._scope_projections(tenant, workspace):
            counts["projections"] += 1
            counts["postings"] += projection.postings
            counts["vectors"] += int(projection.vector is not None)
        return counts

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
            "scopes": int(self._one("SELECT count(*) FROM scopes")[0]),
            "records": dict(self._all("SELECT state, count(*) FROM records GROUP BY state ORDER BY state")),
            "candidates": dict(self._all("SELECT state, count(*) FROM candidates GROUP BY state ORDER BY state")),
            "audit_rows": int(self._one("SELECT count(*) FROM audit")[0]),
        }

    def tombstone_rows(self) -> list[dict[str, Any]]:
        keys = ("tenant", "workspace", "payload_digest", "record_id", "cursor", "at_ms")
        rows = self._all(f"SELECT {', '.join(keys)} FROM tombstones ORDER BY tenant, workspace, cursor, record_id")
        return [{**dict(zip(keys, r, strict=True)), "cursor": int(r[4])} for r in rows]

    def key_destructions(self) -> list[tuple[str, int, str]]:
        return [(r[0], int(r[1]), r[2]) for r in
                self._all("SELECT owner, destroyed_at_ms, reason FROM key_destructions ORDER BY owner")]

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

    def restore_audit_row(self, doc: dict[str, Any]) -> None:
        """Insert a verified audit row verbatim (restore) and move the chain head past it."""
        self._exec("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _audit_values(doc))
        self.audit_head = (int(doc["seq"]), doc["row_digest"])
        self.audit_docs.append(doc)

    def restore_key_destruction(self, owner: str, at_ms: int, reason: str) -> None:
        self._exec("INSERT INTO key_destructions VALUES (?, ?, ?) ON CONFLICT DO NOTHING", [owner, at_ms, reason])


class DuckDBStore:
    """The DuckDB file store. ``open`` fences, migrates and loads the audit head."""

    def __init__(self, data_dir: Path, *, migrate: bool = True, load_index: bool = True,
                 keys: DataKeys | None = None) -> None:
        """``load_index=False`` leaves the search index to be built by ``reload_indexes`` (the
        server does so after it starts listening, NOT_SERVING until then) or on first use."""
        self.data_dir = data_dir
        # The key vault's data keys: search projections are sealed under each record's key
        # (store/projection.py). A store opened without them (offline tools) has no search index.
        self._keys = keys
        self._syncer: ThreadPoolExecutor | None = None  # the key vault's sync beside a batch's statements
        # Observability hooks (engram_core/observability/ports.py sets them): seconds per COMMIT,
        # and seconds and documents per search index rebuild.
        self.on_commit: Callable[[float], None] | None = None
        self.on_index_rebuild: Callable[[float, int], None] | None = None
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
            raise EngramError(Code.STORE_UNAVAILABLE, f"open failed: {type(exc).__name__}") from None
        self._write_lock = threading.RLock()
        # The audit chain's head: who may take the next place in it, until that row is durable.
        # Held by a spooled row's append, and by a write from its first audit row (a batch: from
        # chaining its rows) until COMMIT, so a read's audit row need not wait for the writer lock.
        # Order: writer lock first, then this one.
        self._audit_lock = threading.RLock()
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
        # Audit rows of reads acknowledged before a crash, not yet moved into the table.
        self._spool = AuditSpool(data_dir)
        # Sinks outside the data directory every new audit row goes to first (audit_device.py).
        self._devices: Any = None
        # Rows a previous process acknowledged but did not move in (it did not close cleanly).
        self.spool_replayed_rows = len(self._spool.pending)
        if migrate and self._spool.pending:
            self._move_spool()
        row = self._con.execute("SELECT seq, row_digest FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        self.audit_head: tuple[int, str] = (int(row[0]), row[1]) if row else (0, GENESIS)
        if self._spool.pending and self._spool.pending[-1]["seq"] > self.audit_head[0]:
            self.audit_head = (int(self._spool.pending[-1]["seq"]), self._spool.pending[-1]["row_digest"])
        self._load_key_digests()
        # What searches and the writer read instead of the database: the search index and the
        # scope rows as of the last commit, published together after each COMMIT under one lock
        # (search_index.py). Stale (None / True) after a commit of unknown outcome or a failed
        # apply: then both are rebuilt from one database snapshot before they are used again.
        self._publish = threading.Lock()
        self._index = SearchIndex()
        self._scopes: dict[tuple[str, str], ScopeRow] | None = None
        self._stale = True
        if migrate and load_index:
            with self._publish:
                self._reload()

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
        rows = con.execute(f"SELECT {RECORD_COLS} FROM records WHERE record_id IN "
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
        if self._keys is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "search projections need the key vault")
        if rec.key_slot is None:
            return None
        return self._keys.data_key(int(rec.key_slot), f"record:{rec.record_id}")

    def data_key(self, rec: RecordRow) -> bytes:
        """The record's data key, which seals its search projection."""
        key = self._record_key(rec)
        if key is None:
            raise EngramError(Code.BLOB_MISSING, "record data key missing")
        return key

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

    # -- transactions ----------------------------------------------------------------
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
        if self._in_write():  # this thread already holds the lock, inside its own transaction
            with self._write_lock:
                yield
            return
        with self._locked():
            if self._batch is not None:
                self._settle()
            yield

    @contextmanager
    def write(self, *, batched: bool = False) -> Iterator[DuckDBTx]:
        """A read-write transaction. ``batched``: a member of a group commit (group_commit.py),
        for the mutations agents make at rate; otherwise a transaction of its own."""
        self._require_open()
        if batched:
            with tracing.span("engram.store.transaction"):
                yield from self._batched()
            return
        with tracing.span("engram.store.transaction"), self._exclusive(), self._audit_lock:
            con = self._con
            tx = DuckDBTx(con, self, writing=True)
            con.execute("BEGIN TRANSACTION")
            self._local.writing = True
            try:
                yield tx
            except BaseException:
                _rollback(con)
                raise
            finally:
                self._local.writing = False
            try:
                if tx.names_new_keys and self._keys is not None:
                    self._keys.sync()
                if self._devices and tx.audit_docs:
                    # Before COMMIT: a row no device accepted must not become a mutation (fail closed).
                    self._devices.write_rows(tx.audit_docs)
            except BaseException:
                _rollback(con)
                raise
            self._commit(con)
            self._published(tx.index_ops, tx.scope_changes, tx.audit_head)

    def _batched(self) -> Iterator[DuckDBTx]:
        with self._locked():
            batch = self._batch
            if batch is None:
                self._con.execute("BEGIN TRANSACTION")
                batch = self._batch = Batch()
            tx = DuckDBTx(self._con, self, writing=True, batch=batch)
            self._local.writing = True
            try:
                yield tx
            except BaseException:
                self._local.writing = False
                if tx.promoted or batch.members == 0:
                    # Promoted: its writes are in the shared transaction, so nothing of it may commit.
                    self._abandon()
                elif self._waiting == 0:
                    self._settle()  # the others were waiting for this one to commit them
                raise
            self._local.writing = False
            try:
                batch.join(self._con, tx._member)  # type: ignore[arg-type]
            except BaseException as exc:
                self._abandon()
                raise self._refusal(exc) from None
            batch.members += 1
            batch.names_new_keys |= tx.names_new_keys
            batch.scope_changes.update(tx.scope_changes)
            batch.index_ops.extend(tx.index_ops)
            batch.audit_rows.extend(tx.unchained_audit)
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

    def _abandon(self) -> None:
        """Roll the open batch back; its members are refused, retriably (under the writer lock)."""
        batch, self._batch = self._batch, None
        _rollback(self._con)
        if batch is not None:
            batch.fail(EngramError(Code.STORE_UNAVAILABLE, "write batch rolled back: retry"))

    def _settle(self) -> None:
        """Commit the open batch and answer its members (under the writer lock). Its audit rows
        take their places in the chain here, under the audit lock from then until COMMIT (so a
        failed batch leaves no hole, and a read's spooled row waits at most for the audit insert
        and the COMMIT); spooled rows due to move into the table go in with it."""
        batch, self._batch = self._batch, None
        assert batch is not None
        con = self._con
        if batch.members == 0:
            _rollback(con)
            batch.done.set()
            return
        # The key vault's fdatasync (~0.4 ms) runs while DuckDB executes the batch's statements:
        # every member wrote its slots before it joined, and the COMMIT waits for the sync.
        syncing = (self._key_syncer().submit(self._keys.sync)
                   if batch.names_new_keys and self._keys is not None else None)
        try:
            batch.flush(con)  # everything but the audit rows, before the audit lock is taken
            if syncing is not None:
                syncing.result()
        except BaseException as exc:
            _rollback(con)
            batch.fail(self._refusal(exc))
            return
        with self._audit_lock:
            head = self.audit_head
            for row in batch.audit_rows:
                doc = audit_doc(row, head)
                batch.audit_docs.append(doc)
                batch.pending.add_row("audit", "INSERT", "", _audit_values(doc))
                head = (doc["seq"], doc["row_digest"])
            spooled = len(self._spool.pending) >= SPOOL_BATCH
            try:
                batch.flush(con)
                if spooled:
                    self._insert_spooled(con)
                if self._devices and batch.audit_docs:
                    # Before COMMIT: a row no device accepted must not become a mutation (fail closed).
                    self._devices.write_rows(batch.audit_docs)
            except BaseException as exc:
                _rollback(con)
                batch.fail(self._refusal(exc))
                return
            try:
                self._commit(con, batch.members)
            except EngramError as exc:
                batch.fail(exc)
                return
            self.audit_head = head
            if spooled:
                self._spool.clear()
        self._published(batch.index_ops, batch.scope_changes, None)
        batch.done.set()

    def _key_syncer(self) -> ThreadPoolExecutor:
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-keysync")
        return self._syncer

    def _published(self, index_ops: list[tuple[Any, ...]], scope_changes: dict[tuple[str, str], ScopeRow],
                   audit_head: tuple[int, str] | None) -> None:
        """After COMMIT: the committed copies (search index, scope rows) and the audit head move on."""
        if index_ops or scope_changes:
            with self._publish:
                try:
                    self._index.apply(index_ops)
                    if self._scopes is not None:
                        self._scopes.update(scope_changes)
                except Exception:
                    self._stale = True
        if audit_head is not None:
            self.audit_head = audit_head

    def _commit(self, con: duckdb.DuckDBPyConnection, transactions: int = 1) -> None:
        started = time.perf_counter()
        try:
            con.execute("COMMIT")
            if self.on_commit is not None:
                self.on_commit(time.perf_counter() - started, transactions)
        except duckdb.Error as exc:
            # The commit may or may not have reached the WAL; the committed copies cannot know either.
            with self._publish:
                self._stale, self._scopes = True, None
            raise EngramError(Code.MUTATION_OUTCOME_UNKNOWN, f"commit failed: {type(exc).__name__}") from None

    @contextmanager
    def search_index(self) -> Iterator[SearchIndex]:
        """The in-memory search index (rebuilt from the database first if it may be behind)."""
        with self._publish:
            if self._stale:
                self._reload()
            yield self._index

    def committed_scope(self, tenant: str, workspace: str) -> ScopeRow | None:
        """The scope row as of the last commit whose changes the search index holds: the index is
        at least as new as this row, so its ``last_cursor`` can pin a search."""
        with self._publish:
            if self._stale:
                self._reload()
            return self._scopes.get((tenant, workspace)) if self._scopes is not None else None

    def committed_scopes(self) -> dict[tuple[str, str], ScopeRow] | None:
        """The writer's view of committed scope rows; None (read the database) when stale."""
        return None if self._stale else self._scopes

    def reload_indexes(self, *, key_digests: bool = True) -> None:
        """Rebuild the committed copies from the database (after writes that bypass ``DuckDBTx``);
        ``key_digests=False``: the search index and scope rows only (the digests are current)."""
        if key_digests:
            with self._exclusive():
                self._load_key_digests()
        with self._publish:
            self._reload()

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
        finally:
            cur.close()

    def _reload(self) -> None:
        started = time.perf_counter()
        cur = self._con.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            try:
                with self._bounded_cache():
                    index = self._build_index(cur)
            except duckdb.OutOfMemoryException:  # the bound was too tight for this store: once more without
                cur.execute("ROLLBACK")
                cur.execute("BEGIN TRANSACTION")
                index = self._build_index(cur)
            scopes = {(r[0], r[1]): ScopeRow(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4], int(r[5]), r[6])
                      for r in cur.execute("SELECT tenant, workspace, activated, tools, authorization_epoch, "
                                           "last_cursor, last_event_digest FROM scopes").fetchall()}
            cur.execute("ROLLBACK")
        finally:
            cur.close()
        self._index, self._scopes, self._stale = index, scopes, False
        if self.on_index_rebuild is not None:
            self.on_index_rebuild(time.perf_counter() - started, index.document_count())

    def index_ready(self) -> bool:
        """The search index is built and current (readiness)."""
        return not self._stale

    def audit_device_failures(self) -> dict[str, int]:
        """Failed writes per configured audit device since start (empty without devices)."""
        devices = self._devices
        return dict(devices.failures) if devices else {}

    def audit_spool_state(self) -> tuple[int, int | None]:
        """(audit rows spooled but not yet in the table, ``at_ms`` of the oldest of them)."""
        pending = self._spool.pending
        return len(pending), (int(pending[0]["at_ms"]) if pending else None)

    def _build_index(self, cur: duckdb.DuckDBPyConnection) -> SearchIndex:
        """The search index from every record's sealed projection, opened with its data key (empty
        for a store opened without its key vault: offline tools read rows, they do not search).

        Two streaming scans in the caller's snapshot, neither joined nor sorted by DuckDB (a join
        ordered by document held every row and projection at once: ~9 KB a record at its peak):
        the rows of the records that have a projection, in table order (= document order: rows
        are only appended, updates keep their place), then the projections in any order, each
        opened with the key slot of its row."""
        builder = IndexBuilder()
        if self._keys is None:
            return builder.finish()
        cur.execute(f"SELECT {RECORD_COLS} FROM records WHERE record_id IN (SELECT record_id FROM projections)")
        while rows := cur.fetchmany(OPEN_CHUNK):
            for found in rows:
                builder.add_values(found)
        cur.execute("SELECT record_id, sealed FROM projections")
        while rows := cur.fetchmany(OPEN_CHUNK):
            for record_id, sealed in rows:
                rec = builder.row(record_id)
                if rec is None:
                    continue
                key = self._record_key(rec)
                if key is None:  # destroyed with a forget whose commit raced a crash: the body is gone too
                    log.warning("record %s has a projection but no data key; not indexed", record_id)
                    continue
                builder.add_projection(record_id, open_plain(key, record_id, sealed))
        return builder.finish()

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
    def read(self, *, snapshot: bool = True) -> Iterator[DuckDBTx]:
        """A reader on this thread's cursor: one consistent snapshot, or (``snapshot=False``)
        each statement on its own latest committed state, which saves the transaction's
        statements where the caller revalidates what it reads (search)."""
        self._require_open()
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cursor = cur
        if not snapshot:
            yield DuckDBTx(cur, self, latest=True)
            return
        if self._spool.pending and not self._in_write():
            # A snapshot sees every audit row acknowledged before it began (audit export,
            # verification and backup read the table). Not from inside this thread's write
            # transaction: the move is a transaction of its own on the same connection.
            with self._exclusive(), self._audit_lock:
                if self._spool.pending:
                    self._move_spool()
        cur.execute("BEGIN TRANSACTION")
        try:
            yield DuckDBTx(cur, self)
        finally:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass

    def append_audit(self, row: AuditRow) -> str:
        """Append the audit row of a call that changed nothing, durably, to the audit spool
        (audit_spool.py), under the audit lock only: a read does not wait for the writers. The
        spool moves into the table once a batch has built up (here when the writer is free,
        else with the next group commit)."""
        self._require_open()
        if self._in_write():
            # The row's place in the chain would collide with the open transaction's own rows.
            raise EngramError(Code.STORE_UNAVAILABLE, "standalone audit row inside a write transaction")
        with self._audit_lock:
            doc = audit_doc(row, self.audit_head)
            if self._devices:
                self._devices.write_rows([doc])  # STORE_UNAVAILABLE when no device took it: nothing spooled
            try:
                self._spool.append(doc)
            except EngramError:
                if self._devices:
                    self._devices.abort([doc["seq"]])
                raise
            self.audit_head = (doc["seq"], doc["row_digest"])
            due = len(self._spool.pending) >= SPOOL_BATCH
        if due and self._batch is None and self._write_lock.acquire(blocking=False):
            try:
                if self._batch is None:  # the writer's connection is free of any open transaction
                    with self._audit_lock:
                        self._move_spool()
            except EngramError as exc:  # the rows stay durable in the spool; moved later
                log.warning("audit spool not moved: %s", exc.detail)
            finally:
                self._write_lock.release()
        return doc["row_digest"]

    def _in_write(self) -> bool:
        return getattr(self._local, "writing", False)

    def _move_spool(self) -> None:
        """Move the spooled audit rows into the table in one transaction (under the writer lock
        and the audit lock). Rows already there (moved before a crash cut the spool's
        truncation) are skipped."""
        con = self._con
        try:
            con.execute("BEGIN TRANSACTION")
            self._insert_spooled(con)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            _rollback(con)
            raise EngramError(Code.STORE_UNAVAILABLE, f"audit spool move failed: {type(exc).__name__}") from None
        self._spool.clear()

    def _insert_spooled(self, con: duckdb.DuckDBPyConnection) -> None:
        rows = self._spool.pending
        con.execute(
            "INSERT INTO audit SELECT unnest($1::UBIGINT[]), unnest($2::BIGINT[]), unnest($3::VARCHAR[]), "
            "unnest($4::VARCHAR[]), unnest($5::VARCHAR[]), unnest($6::VARCHAR[]), unnest($7::VARCHAR[]), "
            "unnest($8::VARCHAR[]), unnest($9::VARCHAR[]), unnest($10::VARCHAR[]), unnest($11::VARCHAR[]), "
            "unnest($12::VARCHAR[]), unnest($13::VARCHAR[]) ON CONFLICT (seq) DO NOTHING",
            [list(c) for c in zip(*(_audit_values(d) for d in rows), strict=True)])

    def attach_audit_devices(self, devices: Any) -> None:
        """Stream every audit row written from now on to ``devices`` (``AuditDevices``), fail closed."""
        with self._exclusive(), self._audit_lock:
            self._devices = devices
            devices.opened(self.audit_head)

    def is_open(self) -> bool:
        return self._open

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
        if not self._open:
            return
        self._open = False
        with self._exclusive(), self._audit_lock:
            try:
                if self._spool.pending:
                    self._move_spool()
            except EngramError:
                pass  # still durable in the spool: moved at the next open
            self._spool.close()
            if self._devices:
                self._devices.close()
            try:
                self._con.execute("CHECKPOINT")
            except duckdb.Error:
                pass
            self._con.close()
            if self._syncer is not None:
                self._syncer.shutdown()
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
        finally:
            self._lock_file.close()


def remove_store_files(data_dir: Path) -> None:
    for name in ("engram.duckdb", "engram.duckdb.wal", SPOOL_NAME):
        p = data_dir / name
        if p.exists():
            os.remove(p)
