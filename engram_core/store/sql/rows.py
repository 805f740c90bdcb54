"""The ``EngineTx`` members whose SQL is the same in both SQL engines, written once
(``SqlRows``, a mixin). An engine's transaction class provides three primitives (``_sql_all``,
``_sql_one``, ``_sql_exec``: read rows, read one row, write, each taking its dialect's SQL) and
its ``dialect``; members that need an engine's locking or caches stay in the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engram_core.contract.scope import Scope
from engram_core.store.port import HostKeyRow, KeyDestruction, iter_chunks
from engram_core.store.sql.codecs import (
    AUDIT_KEYS,
    HOST_KEY_COLS,
    KEY_DESTRUCTION_COLS,
    TOMBSTONE_KEYS,
    audit_doc,
    host_key_of,
    host_key_values,
    key_destruction_of,
    tombstone_doc,
)
from engram_core.store.sql.dialect import Dialect

TOMBSTONE_ROWS = f"SELECT {', '.join(TOMBSTONE_KEYS)} FROM tombstones ORDER BY tenant, workspace, cursor, record_id"
TOMBSTONED = "SELECT 1 FROM tombstones WHERE tenant = ? AND workspace = ? AND payload_digest = ? LIMIT 1"
LIVE_KEY_SLOTS = "SELECT owner, slot FROM data_keys"
DATA_KEY_SLOT = "SELECT slot FROM data_keys WHERE owner = ?"
KEY_DESTRUCTION = f"SELECT {KEY_DESTRUCTION_COLS} FROM key_destructions WHERE owner = ?"
KEY_DESTRUCTIONS = f"SELECT {KEY_DESTRUCTION_COLS} FROM key_destructions ORDER BY owner"
RESTORE_KEY_DESTRUCTION = "INSERT INTO key_destructions VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
AUDIT_ROWS = f"SELECT {', '.join(AUDIT_KEYS)} FROM audit WHERE seq >= ? AND seq <= ?"
AUDIT_ROWS_OF_SCOPE = AUDIT_ROWS + " AND tenant = ? AND workspace = ?"
RECENT_NONCES = "SELECT context_nonce, at_ms FROM audit WHERE at_ms >= ? AND context_nonce <> ''"
HOST_KEYS = "SELECT key_id, public_key_pem FROM trusted_host_keys ORDER BY key_id"
ADD_HOST_KEY = ("INSERT INTO trusted_host_keys (key_id, public_key_pem, added_at_ms) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING")
HOST_KEY_ROWS = f"SELECT {HOST_KEY_COLS} FROM trusted_host_keys ORDER BY key_id"
BIND_HOST_KEY = (f"INSERT INTO trusted_host_keys ({HOST_KEY_COLS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key_id) "
                 "DO UPDATE SET tenants = excluded.tenants, all_tenants = excluded.all_tenants, "
                 "maintenance_scopes = excluded.maintenance_scopes")
META = "SELECT v FROM store_meta WHERE k = ?"
SET_META = "INSERT INTO store_meta VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
META_WITH_PREFIX = "SELECT k, v FROM store_meta WHERE starts_with(k, ?)"
COUNTED = {"scopes": False, "records": True, "candidates": True, "audit_rows": False}  # by state?
COUNTED_TABLE = {"audit_rows": "audit"}


class SqlRows:
    """Mixin of ``DuckDBEngineTx`` and ``PostgresEngineTx``: the members written once."""

    dialect: Dialect
    update_blobs_sql: str  # the engine's: projections' sealed blobs set from two arrays, ids and blobs


    def _sql_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # by the engine

    def _sql_one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        raise NotImplementedError  # by the engine

    def _sql_exec(self, sql: str, params: Sequence[Any] = ()) -> None:
        raise NotImplementedError  # by the engine

    # -- tombstones and data keys ----------------------------------------------------------------
    def tombstone_rows(self) -> list[dict[str, Any]]:
        return [tombstone_doc(r) for r in self._sql_all(self.dialect(TOMBSTONE_ROWS))]

    def live_key_slots(self) -> dict[int, str]:
        return {int(s): o for o, s in self._sql_all(self.dialect(LIVE_KEY_SLOTS))}

    def key_destruction(self, owner: str) -> KeyDestruction | None:
        row = self._sql_one(self.dialect(KEY_DESTRUCTION), [owner])
        return key_destruction_of(row) if row else None

    def key_destructions(self) -> list[KeyDestruction]:
        return [key_destruction_of(r) for r in self._sql_all(self.dialect(KEY_DESTRUCTIONS))]

    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None:
        self._sql_exec(self.dialect(RESTORE_KEY_DESTRUCTION), [owner, at_ms, reason, generation])

    # -- sealed projections ----------------------------------------------------------------------
    def update_projection_blobs(self, blobs: list[tuple[str, bytes]]) -> None:
        # One multi-row statement per chunk, not three per record (a store re-analyzed at start-up:
        # ~5 ms per record that way).
        for chunk in iter_chunks(blobs, 2048):
            self._sql_exec(self.update_blobs_sql, [[r for r, _ in chunk], [b for _, b in chunk]])

    # -- audit rows ------------------------------------------------------------------------------
    def audit_rows(self, scope: Scope | None, from_seq: int,
                   to_seq: int | None) -> list[dict[str, Any]]:
        # Audit rows are only ever appended: reading them needs no scope lock.
        params: list[Any] = [from_seq, to_seq if to_seq is not None else self.dialect.max_seq]
        sql = AUDIT_ROWS
        if scope is not None:
            sql = AUDIT_ROWS_OF_SCOPE
            params += [scope.tenant, scope.workspace]
        return [audit_doc(r) for r in self._sql_all(self.dialect(sql + " ORDER BY chain, seq"), params)]

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        return [(r[0], int(r[1])) for r in self._sql_all(self.dialect(RECENT_NONCES), [since_ms])]

    # -- trusted host keys and metadata ----------------------------------------------------------
    def trusted_host_keys(self) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in self._sql_all(self.dialect(HOST_KEYS))]

    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        """Trust the key if it is not stored yet; a key stored so serves nothing until bound."""
        self._sql_exec(self.dialect(ADD_HOST_KEY), [key_id, pem, at_ms])

    def host_key_rows(self) -> list[HostKeyRow]:
        return [host_key_of(r) for r in self._sql_all(self.dialect(HOST_KEY_ROWS))]

    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        self._sql_exec(self.dialect(BIND_HOST_KEY), host_key_values(row))

    def meta(self, key: str) -> str | None:
        row = self._sql_one(self.dialect(META), [key])
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._sql_exec(self.dialect(SET_META), [key, value])

    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        return dict(self._sql_all(self.dialect(META_WITH_PREFIX), [prefix]))  # type: ignore[arg-type]

    # -- the store as a whole --------------------------------------------------------------------
    def counts(self, estimates: dict[str, float] | None = None) -> dict[str, Any]:
        """What the store holds, for the start-up summary: scopes, records and candidates by state.
        A table in ``estimates`` (the engine's planner estimates it chose to trust) is reported by
        its estimate (``"~N"``, without its split by state) instead of counted."""
        out: dict[str, Any] = {}
        for key, by_state in COUNTED.items():
            table = COUNTED_TABLE.get(key, key)
            estimate = (estimates or {}).get(table)
            if estimate is not None:
                out[key] = {"all": f"~{int(estimate)}"} if by_state else f"~{int(estimate)}"
            elif by_state:
                out[key] = dict(self._sql_all(f"SELECT state, count(*) FROM {table} GROUP BY state ORDER BY state"))
            else:
                out[key] = int(self._sql_one(f"SELECT count(*) FROM {table}")[0])  # type: ignore[index]
        return out
