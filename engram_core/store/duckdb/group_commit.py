"""Group commit: many mutations, one DuckDB transaction, one COMMIT (SPEC §7, §10).

DuckDB spends about half a millisecond on every statement, however small, and
a mutation is ten of them plus a COMMIT with its WAL fsync. So concurrent
mutations share a transaction: each runs its checks and prepares its writes
alone under the writer lock (its *member* state below), then joins the open
*batch*; the last member in (no other writer queued) commits the batch for
all of them. Every appended row waits in the batch and goes in as one
multi-row INSERT per table; other statements (updates, deletes by
condition) run when their member joins, after the rows they could touch.

What a member prepares is invisible to the database until it joins, so a
member that fails its checks leaves nothing behind and the others go on.
Reads see what the batch and the member hold: the hot lookups (idempotency
keys, grants, candidates, data keys, current payloads, tombstones) consult
the pending rows directly; any other statement first flushes the pending
rows of the tables it names, or, when the member itself has pending writes
there, *promotes* the member (its writes go into the shared transaction now,
and from then on its failure fails the whole batch).

Members' audit rows take their places in their scopes' audit chains (sequence,
previous digest) only when the batch commits (the store kernel chains them in its
``prepare`` hook), so a batch that fails leaves no hole in any chain; a read's audit
row is on a chain of its own (the writer's) and never waits for members.

A batch that cannot commit answers every member alike: a definitive refusal
when it was rolled back, MUTATION_OUTCOME_UNKNOWN when COMMIT itself failed.
Nothing is acknowledged before the COMMIT returned, or before the members'
writes are a synced frame of the intent log (``intent_log.py``; the batch then
stays open for DuckDB to commit later, its answered *segments* kept for a
rollback to rebuild it from).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import duckdb

from engram_core.store.duckdb.answer_check import BatchKeys
from engram_core.store.engine import TxEffects
from engram_core.store.port import CandidateRow, IdempotencyRow, ScopeRow

MAX_MEMBERS = 64  # a batch commits at this size even with writers queued (bounds latency)
ROWS_PER_STATEMENT = 64  # rows per multi-row INSERT (DuckDB plans larger VALUES lists slowly)
_TABLE_NAMES = ("scopes", "journal", "candidates", "data_keys", "key_destructions", "records", "tombstones",
                "idempotency", "used_confirmations", "audit", "projections", "record_families", "record_sources",
                "trusted_host_keys", "store_meta")
_TABLE_RE = re.compile(r"\b(" + "|".join(_TABLE_NAMES) + r")\b")  # our own SQL only, never input
_tables_cache: dict[str, frozenset[str]] = {}


def tables_of(sql: str) -> frozenset[str]:
    """The tables a statement of ours names."""
    found = _tables_cache.get(sql)
    if found is None:
        found = _tables_cache[sql] = frozenset(_TABLE_RE.findall(sql))
    return found


@dataclass
class Pending:
    """Writes not yet in the database, with the lookups reads need (a member's or a batch's)."""

    rows: dict[tuple[str, str, str], list[list[Any]]] = field(default_factory=dict)  # (table, verb, cols)
    deletes: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (table, key column) -> keys
    scope_heads: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    # Lookups over ``rows`` (cleared with them when they are flushed).
    idempotency: dict[tuple[str, str, str, str], IdempotencyRow] = field(default_factory=dict)
    confirmations: set[str] = field(default_factory=set)
    candidates: dict[str, CandidateRow] = field(default_factory=dict)
    # Candidate state changes, applied in one UPDATE: id -> (state, decision JSON or None, drop envelope).
    candidate_states: dict[str, tuple[str, str | None, bool]] = field(default_factory=dict)
    data_keys: dict[str, int] = field(default_factory=dict)
    dropped_keys: set[str] = field(default_factory=set)
    current_payloads: dict[tuple[str, str, str], tuple[int, str]] = field(default_factory=dict)
    tombstones: set[tuple[str, str, str]] = field(default_factory=set)

    def tables(self) -> set[str]:
        out = {t for t, _, _ in self.rows} | {t for t, _ in self.deletes}
        if self.scope_heads:
            out.add("scopes")
        if self.candidate_states:
            out.add("candidates")
        return out

    def set_candidate_state(self, candidate_id: str, state: str, decision: str | None, drop: bool) -> None:
        before = self.candidate_states.get(candidate_id)
        if before is not None:  # as two UPDATEs in order would leave it
            decision, drop = decision or before[1], drop or before[2]
        self.candidate_states[candidate_id] = (state, decision, drop)

    def add_row(self, table: str, verb: str, cols: str, values: list[Any]) -> None:
        self.rows.setdefault((table, verb, cols), []).append(values)

    def note(self, op: tuple[Any, ...]) -> None:
        """Hold a prepared write that waits for the flush (any kind but ``sql``)."""
        kind = op[0]
        if kind == "row":
            self.add_row(*op[1:])
        elif kind == "delete":
            _, table, col, key = op
            self.deletes.setdefault((table, col), []).append(key)
            if table == "data_keys":
                self.dropped_keys.add(key)
        elif kind == "head":
            _, tenant, workspace, cursor, digest = op
            self.scope_heads[(tenant, workspace)] = (cursor, digest)
        else:  # candidate_state
            self.set_candidate_state(*op[1:])

    def clear_lookups(self, table: str) -> None:
        if table == "idempotency":
            self.idempotency.clear()
        elif table == "used_confirmations":
            self.confirmations.clear()
        elif table == "candidates":
            self.candidates.clear()
        elif table == "data_keys":
            self.data_keys.clear()  # dropped_keys: when the deletes are flushed
        elif table == "records":
            self.current_payloads.clear()
        elif table == "tombstones":
            self.tombstones.clear()


def statement_of(op: tuple[Any, ...]) -> tuple[str, list[Any] | tuple]:
    """A prepared write as the one statement that applies it alone (a transaction of its own)."""
    kind = op[0]
    if kind == "sql":
        return op[1], op[2]
    if kind == "row":
        _, table, verb, cols, values = op
        return f"{verb} INTO {table}{cols} VALUES ({', '.join('?' * len(values))})", values
    if kind == "delete":
        _, table, col, key = op
        return f"DELETE FROM {table} WHERE {col} = ?", [key]
    if kind == "head":
        _, tenant, workspace, cursor, digest = op
        return ("UPDATE scopes SET last_cursor = ?, last_event_digest = ? WHERE tenant = ? AND workspace = ?",
                [cursor, digest, tenant, workspace])
    _, candidate_id, state, decision, drop = op  # candidate_state
    return ("UPDATE candidates SET state = ?, decision = coalesce(?, decision), "
            "sealed_envelope = CASE WHEN ? THEN NULL ELSE sealed_envelope END WHERE candidate_id = ?",
            [state, decision, drop, candidate_id])


@dataclass(frozen=True)
class Part:
    """One write of a flush: its table, its SQL with ``?`` placeholders, its parameters."""

    table: str
    sql: str
    params: list[Any]


def _insert_part(table: str, verb: str, cols: str, rows: list[list[Any]]) -> Part:
    one = "(" + ", ".join("?" * len(rows[0])) + ")"
    return Part(table, f"{verb} INTO {table}{cols} VALUES " + ", ".join([one] * len(rows)),
                [v for row in rows for v in row])


def _candidate_states_part(states: dict[str, tuple[str, str | None, bool]]) -> Part:
    if len(states) == 1:  # one row by its key (~0.4 ms), not through the join below (~1.1 ms)
        ((cid, change),) = states.items()
        sql, params = statement_of(("candidate_state", cid, *change))
        return Part("candidates", sql, list(params))
    ids, names, decisions, drops = (list(c) for c in zip(*((cid, *change) for cid, change in states.items()),
                                                           strict=True))
    return Part("candidates",
                "UPDATE candidates SET state = u.state, decision = coalesce(u.decision, candidates.decision), "
                "sealed_envelope = CASE WHEN u.drop_envelope THEN NULL ELSE candidates.sealed_envelope END "
                "FROM (SELECT unnest(?::VARCHAR[]) AS candidate_id, unnest(?::VARCHAR[]) AS state, "
                "unnest(?::VARCHAR[]) AS decision, unnest(?::BOOLEAN[]) AS drop_envelope) u "
                "WHERE candidates.candidate_id = u.candidate_id", [ids, names, decisions, drops])


def _scope_heads_part(heads: dict[tuple[str, str], tuple[int, str]]) -> Part:
    if len(heads) == 1:
        (((tenant, workspace), (cursor, digest)),) = heads.items()
        sql, params = statement_of(("head", tenant, workspace, cursor, digest))
        return Part("scopes", sql, list(params))
    tenants, workspaces, cursors, digests = (list(c) for c in zip(*((t, w, c, d) for (t, w), (c, d) in heads.items()),
                                                                  strict=True))
    return Part("scopes",
                "UPDATE scopes SET last_cursor = u.last_cursor, last_event_digest = u.last_event_digest "
                "FROM (SELECT unnest(?::VARCHAR[]) AS tenant, unnest(?::VARCHAR[]) AS workspace, "
                "unnest(?::UBIGINT[]) AS last_cursor, unnest(?::VARCHAR[]) AS last_event_digest) u "
                "WHERE scopes.tenant = u.tenant AND scopes.workspace = u.workspace",
                [tenants, workspaces, cursors, digests])


def statements_of(parts: list[Part]) -> list[tuple[str, list[Any]]]:
    """``parts`` as few statements as keep their order: the parts of one statement, all but its
    last as data-modifying CTEs, name distinct tables. Within one statement every part sees the
    database as it was before the statement (a DELETE or UPDATE there would miss a row an INSERT
    beside it adds), so a part naming a table the statement already writes starts the next one,
    which runs after it. DuckDB's cost is per statement, hardly per part: a capture's flush
    was five statements and is one."""
    out: list[tuple[str, list[Any]]] = []
    group: list[Part] = []

    def close() -> None:
        if len(group) == 1:
            out.append((group[0].sql, group[0].params))
        elif group:
            params: list[Any] = []
            texts = []
            for part in group:  # its ? become $n, numbered across the statement
                pieces = part.sql.split("?")
                text = pieces[0]
                for value, piece in zip(part.params, pieces[1:], strict=True):
                    params.append(value)
                    text += f"${len(params)}{piece}"
                texts.append(text)
            out.append(("WITH " + ", ".join(f"w{i} AS ({t} RETURNING 0)" for i, t in enumerate(texts[:-1]))
                        + " " + texts[-1], params))
        group.clear()

    for part in parts:
        if any(g.table == part.table for g in group):
            close()
        group.append(part)
    close()
    return out


class Member:
    """One mutation's prepared writes, in order, until it joins its batch."""

    def __init__(self) -> None:
        self.pending = Pending()
        # ("row", table, verb, cols, values) | ("sql", sql, params, tables) | ("delete", table, col, key)
        # | ("head", tenant, workspace, cursor, digest) | ("candidate_state", id, state, decision, drop),
        # in the order the mutation made them.
        self.ops: list[tuple[Any, ...]] = []
        self.sql_tables: set[str] = set()  # tables its deferred statements touch
        self.promoted = False  # its writes are in the shared transaction: its failure fails the batch


class Segment:
    """The members a batch answers at once (at its COMMIT, or when their writes are in the
    intent log: ``intent_log.py``), and how."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class Batch:
    """Members sharing one open DuckDB transaction, and what they hand the kernel at its COMMIT.

    With an intent log, the batch outlives the answers to its members: each *segment* of
    members is answered once its writes are logged (``acked`` keeps them, in order, for a
    rollback to rebuild the batch from), and DuckDB commits them all later."""

    def __init__(self, columns: dict[str, tuple[str, ...]] | None = None) -> None:
        """``columns``: each table's columns in order (``answer_check.tables``), for a delete to
        find the row it cancels (``_cancels``); without them every delete goes to the database."""
        self.columns = columns
        self.pending = Pending()
        self.members = 0  # of the current segment
        self.effects: list[TxEffects] = []  # each member's, in the order they joined
        self.scope_changes: dict[tuple[str, str], ScopeRow] = {}
        self.audit_heads: dict[str, tuple[int, str]] = {}  # chains the batch's audit rows extend
        # What its members did to candidates, kept past the flush for the engine's committed copy
        # (candidate_cache.py): new rows, state changes in order, and whether SQL touched any.
        self.new_candidates: dict[str, CandidateRow] = {}
        self.candidate_changes: list[tuple[str, str, str | None, bool]] = []
        self.changed_candidates: set[str] = set()
        self.candidates_by_sql = False
        self.segment = Segment()
        # Its DuckDB transaction begins with its first write, in that statement's call (one
        # statement fewer a batch); until then members read the latest committed state, which
        # the writer lock keeps still.
        self.begun = False
        # Every write applied since the last logged segment (the next frame), and the logged ones.
        self.log_ops: list[tuple[Any, ...]] = []
        self.acked: list[list[tuple[Any, ...]]] = []
        self.acked_members = 0
        self.acked_heads: dict[str, tuple[int, str]] = {}  # ``audit_heads`` as of the last log
        self.keys = BatchKeys()  # the answered segments' primary keys (answer_check.py)

    def next_segment(self) -> Segment:
        """The current segment's writes are logged: remember them, start the next; the answered
        segment is returned."""
        answered, self.segment = self.segment, Segment()
        self.acked.append(self.log_ops)
        self.log_ops = []
        self.acked_members += self.members
        self.acked_heads = dict(self.audit_heads)
        self.members = 0
        self.effects = []
        self.scope_changes = {}
        self.new_candidates = {}
        self.candidate_changes = []
        self.changed_candidates = set()
        return answered

    def execute(self, con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | tuple) -> None:
        """A write of the batch's, the transaction begun in the same call when it is the first."""
        if not self.begun:
            self.begun = True  # first: a failed first statement leaves a transaction to roll back
            sql = "BEGIN TRANSACTION; " + sql  # parameters bind to the last statement of a call
        con.execute(sql, params)

    # -- joining -----------------------------------------------------------------------------
    def apply(self, con: duckdb.DuckDBPyConnection, op: tuple[Any, ...]) -> None:
        """Apply one prepared write to the batch: rows wait, statements run now (after the
        pending rows of the tables they name, so they see them)."""
        self.log_ops.append(op)
        if op[0] == "candidate_state":
            self.candidate_changes.append(op[1:])
            self.changed_candidates.add(op[1])
        if op[0] == "sql":
            _, sql, params, tables = op
            self.candidates_by_sql = self.candidates_by_sql or "candidates" in tables
            self.flush(con, tables)
            self.execute(con, sql, params)
            return
        if op[0] == "delete" and self._cancels(op):
            return
        if op[0] == "row" and any(t == op[1] for t, _ in self.pending.deletes):
            self.flush(con, {op[1]})  # a row after a delete of its table: keep their order
        self.pending.note(op)

    def replay(self, con: duckdb.DuckDBPyConnection, frames: list[list[tuple[Any, ...]]]) -> None:
        """Apply logged segments' writes again, in order (at open, or after a rollback)."""
        for ops in frames:
            for op in ops:
                self.apply(con, op)

    def _cancels(self, op: tuple[Any, ...]) -> bool:
        """A delete by key of a row this batch inserted and still holds: the row is dropped and
        neither reaches the database (a plain INSERT of the key means the database has no such
        row). An admission deletes the key its capture inserted; with the deletes pending, the
        next capture's key row made the batch flush the table, two statements a pair."""
        _, table, col, key = op
        names = self.columns.get(table) if self.columns else None
        if names is None:
            return False
        for (t, verb, cols), rows in self.pending.rows.items():
            order = tuple(c.strip() for c in cols.strip("() ").split(",")) if cols else names
            if t != table or verb != "INSERT" or col not in order:
                continue
            at = order.index(col)
            for n, row in enumerate(rows):
                if row[at] == key:
                    del rows[n]
                    if not rows:
                        del self.pending.rows[(t, verb, cols)]
                    if table == "data_keys":
                        self.pending.data_keys.pop(key, None)
                    return True
        return False

    def join(self, con: duckdb.DuckDBPyConnection, member: Member) -> None:
        """Move a member's prepared writes and lookups into the batch."""
        for op in member.ops:
            self.apply(con, op)
        member.ops.clear()
        src, dst = member.pending, self.pending
        dst.idempotency.update(src.idempotency)
        dst.confirmations |= src.confirmations
        dst.candidates.update(src.candidates)
        self.new_candidates.update(src.candidates)
        dst.data_keys.update(src.data_keys)
        for k, v in src.current_payloads.items():
            dst.current_payloads.setdefault(k, v)
        dst.tombstones |= src.tombstones
        member.pending = Pending()
        member.sql_tables.clear()

    # -- flushing ----------------------------------------------------------------------------
    def flush(self, con: duckdb.DuckDBPyConnection, tables: set[str] | frozenset[str] | None = None, *,
              hold_overlaps: bool = False) -> None:
        """Write the pending rows, deletes, candidate states and scope heads of ``tables`` (None:
        all) in as few statements as their order allows (``statements_of``). ``hold_overlaps``:
        the deletes and updates of a table whose rows this flush inserts stay pending for the
        next flush (at settle time they then share the audit rows' statement instead of taking
        one of their own)."""
        p = self.pending
        parts: list[Part] = []
        inserted: set[str] = set()
        for key in [k for k in p.rows if tables is None or k[0] in tables]:
            table, verb, cols = key
            rows = p.rows.pop(key)
            for start in range(0, len(rows), ROWS_PER_STATEMENT):
                parts.append(_insert_part(table, verb, cols, rows[start:start + ROWS_PER_STATEMENT]))
            inserted.add(table)
            p.clear_lookups(table)

        def wanted(table: str) -> bool:
            return (tables is None or table in tables) and not (hold_overlaps and table in inserted)

        for key in [k for k in p.deletes if wanted(k[0])]:
            table, col = key
            keys = p.deletes.pop(key)
            for start in range(0, len(keys), ROWS_PER_STATEMENT * 4):
                chunk = keys[start:start + ROWS_PER_STATEMENT * 4]
                parts.append(Part(table, f"DELETE FROM {table} WHERE {col} IN ({', '.join('?' * len(chunk))})",
                                  chunk))
            if table == "data_keys":
                p.dropped_keys.clear()
        if p.candidate_states and wanted("candidates"):
            parts.append(_candidate_states_part(p.candidate_states))
            p.candidate_states.clear()
        if p.scope_heads and wanted("scopes"):
            parts.append(_scope_heads_part(p.scope_heads))
            p.scope_heads.clear()
        for sql, params in statements_of(parts):
            self.execute(con, sql, params)

    def changed_candidate(self, candidate_id: str) -> bool:
        """Whether this batch wrote or may have changed the candidate (then the database, not the
        engine's committed copy, has it as the batch sees it)."""
        return self.candidates_by_sql or candidate_id in self.new_candidates or candidate_id in self.changed_candidates

    def fail(self, error: BaseException) -> None:
        self.segment.fail(error)
