"""The PostgreSQL engine's own statements (fenced lookups by key, the journal with its records,
audit heads) and the pieces of its transactions' plumbing (buffered statements, scope locks,
batch members' marks). Columns and row codecs both SQL engines share are ``engram_core/store/sql/``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engram_core.store.port import ScopeRow
from engram_core.store.sql.codecs import (
    AUDIT_KEYS,
    CANDIDATE_COLS,
    EVENT_COLS,
    RECORD_COLS,
    qualified,
)

MAX_BIGINT = 2**63 - 1
RECORD_COLS_R = qualified(RECORD_COLS, "r")
EVENT_WIDTH = len(EVENT_COLS.split(","))  # an events-with-records row's record columns start here
# Reads by key within a scope. psycopg prepares a statement a connection has run a few times, and
# the server may then keep a generic plan, chosen without the parameters' values: for ``record_id
# = $1 AND tenant = $2 AND workspace = $3`` that plan may take a (tenant, workspace, ...) index and
# filter the whole scope (measured: the catch-up's records took 1.3 ms at 5,000 records, growing
# with the scope, where the primary key takes 0.1), and for ``cursor > $3`` it estimates a third of
# the journal and may scan all of it. So the key lookups sit behind a MATERIALIZED fence that leaves
# the planner nothing but the key, the scope checked on the row found, and a journal range is
# bounded on both sides (a generic plan estimates a closed range as narrow). Test:
# test_postgres_engine.py's plans.
RECORD_BY_ID = (f"WITH r AS MATERIALIZED (SELECT {RECORD_COLS} FROM records WHERE record_id = %s) "
                 "SELECT * FROM r WHERE tenant = %s AND workspace = %s")
RECORDS_BY_ID = (f"WITH r AS MATERIALIZED (SELECT {RECORD_COLS} FROM records WHERE record_id = ANY(%s)) "
                  "SELECT * FROM r WHERE tenant = %s AND workspace = %s")
CANDIDATE_BY_ID = (f"WITH c AS MATERIALIZED (SELECT {CANDIDATE_COLS} FROM candidates WHERE candidate_id = %s) "
                    "SELECT * FROM c WHERE tenant = %s AND workspace = %s")
EVENTS_BETWEEN = (f"SELECT {EVENT_COLS} FROM journal WHERE tenant = %s AND workspace = %s AND cursor >= %s "
                   "AND cursor <= %s ORDER BY cursor")
EVENT_BY_ID = (f"WITH e AS MATERIALIZED (SELECT {EVENT_COLS} FROM journal WHERE tenant = %s AND workspace = %s "
                "AND event_id = %s) SELECT * FROM e ORDER BY cursor LIMIT 1")  # the fence: not the scope in cursor order
PAYLOAD_STANDING = (
    "SELECT state, accepted_cursor, record_id, false FROM records "
    "WHERE tenant = %s AND workspace = %s AND payload_digest = %s UNION ALL "
    "SELECT '', 0, record_id, true FROM tombstones WHERE tenant = %s AND workspace = %s AND payload_digest = %s")
FAMILY_MEMBERS = (
    f"SELECT {RECORD_COLS_R}, f.primary_kind, array_agg(f.family_ref ORDER BY f.family_ref) "
    "FROM record_families f JOIN records r ON r.record_id = f.record_id "
    "WHERE f.tenant = %s AND f.workspace = %s AND f.family_ref = ANY(%s) AND r.state = ANY(%s) "
    "AND r.tenant = %s AND r.workspace = %s GROUP BY r.record_id, f.primary_kind ORDER BY r.record_id")
DERIVATIVES = (
    f"SELECT {RECORD_COLS_R} FROM record_sources s JOIN records r ON r.record_id = s.record_id "
    "WHERE s.tenant = %s AND s.workspace = %s AND s.source_id = %s AND r.tenant = %s AND r.workspace = %s "
    "ORDER BY r.record_id")
# The journal from a cursor on, each event with the records it names (``records_of_event``: a
# record target, an admission body's ``record_id``), their sealed projections and wrapped data keys:
# one row per event and record (one with NULLs for an event that names none). The lateral read is
# fenced (OFFSET 0) so that it stays a lookup by primary key per event whatever the plan; the scope
# of a record found is checked by the caller.
EVENTS_WITH_RECORDS = (
    f"SELECT {qualified(EVENT_COLS, 'j')}, {qualified(RECORD_COLS, 'c')}, c.sealed, c.owner, "
    "c.version, c.generation, c.wrapped FROM "
    f"(SELECT {EVENT_COLS} FROM journal WHERE tenant = %s AND workspace = %s AND cursor >= %s AND cursor <= %s) j "
    f"LEFT JOIN LATERAL (SELECT {RECORD_COLS_R}, p.sealed, v.owner, v.version, v.generation, v.wrapped "
    "FROM records r LEFT JOIN projections p ON p.record_id = r.record_id LEFT JOIN vault_keys v ON v.ref = r.key_slot "
    "WHERE r.record_id = ANY(ARRAY[j.target, j.body::jsonb ->> 'record_id']) OFFSET 0) c ON true ORDER BY j.cursor")
INSERT_AUDIT = f"INSERT INTO audit ({', '.join(AUDIT_KEYS)}) VALUES ({', '.join(['%s'] * len(AUDIT_KEYS))})"
# A chain's head moves forward only: a spooled row moved in twice, or restored verbatim, never
# moves it back.
UPSERT_HEAD = ("INSERT INTO audit_heads (chain, seq, row_digest) VALUES (%s, %s, %s) ON CONFLICT (chain) DO UPDATE "
                "SET seq = EXCLUDED.seq, row_digest = EXCLUDED.row_digest WHERE audit_heads.seq < EXCLUDED.seq")


def conflict(exc: BaseException) -> bool:
    """A failure a retry of the whole mutation resolves (deadlock, lock timeout, serialization)."""
    return getattr(exc, "sqlstate", None) in ("40P01", "40001", "55P03")


NUL_FREE = "\x01engram-hex:"


class WritesAhead(RuntimeError):
    """A call given to ``read_ahead`` wrote (a caller's mistake, never swallowed)."""


def frozen(value: Any) -> Any:
    """``value`` (statement parameters) hashable: lists as tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def text_key(key: str) -> str:
    """A key as a PostgreSQL text column can hold it, one to one: a key without NUL (and not
    starting with the marker) is itself; any other is the marker and its UTF-8 bytes in hex, so
    two keys never share a stored form."""
    if "\x00" not in key and not key.startswith(NUL_FREE):
        return key
    return NUL_FREE + key.encode("utf-8").hex()


@dataclass
class Statement:
    sql: str
    params: Sequence[Any] | None = None
    on_rows: Callable[[list[tuple[Any, ...]]], object] | None = None  # called with its rows after the round trip
    many: bool = False  # params is a sequence of parameter rows (executemany)


def unflushed(statement: Statement) -> list[Statement]:
    """``statement`` in a transaction of its own that commits with ``synchronous_commit = off``:
    visible to every core at once, not waiting for the WAL flush (the WAL writer flushes it within
    a few hundred ms). Statements after these in the same pipeline run in a transaction of theirs."""
    return [Statement("BEGIN"), Statement("SET LOCAL synchronous_commit = off"), statement, Statement("COMMIT")]


@dataclass
class ScopeLock:
    """A scope this write transaction locked: its row as this transaction sees it."""

    row: ScopeRow | None = None  # None until the lock's round trip answered
    known: bool = False
    created: bool = False  # the lock inserted the row (the scope was never written)
    materialized: bool = False  # something was written to it: a created row stays
    dirty: bool = False  # changed here: an UPDATE goes with the next round trip


@dataclass
class Mark:
    """Where a batch member began (``PostgresEngineTx.member_begin``): its savepoint and what
    the transaction held in memory then, restored if the member fails."""

    savepoint: str
    pending: int  # len(_pending) with the SAVEPOINT statement in it
    round_trips: int
    scopes: dict[tuple[str, str], ScopeLock]
    heads: dict[str, tuple[int, str]]
    seen: set[str]
