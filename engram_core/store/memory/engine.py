"""The in-memory engine: the engine port (``store/engine.py``) over Python dictionaries.

A reference and a test bed, not a place to keep memories: nothing is durable beyond the
process (a ``MemoryDatabase`` lives as long as whoever holds it; closing an engine leaves it to
the next engine opened on it, as a file outlives its process). It is written against the port
alone, so it shows what the port asks of an engine and nothing more, and it runs the store
conformance suite (``store/conformance``) in a fraction of a second per check.

- **Sole writer.** One engine is open on a database at a time (a second is refused, FENCE_LOST,
  as DuckDB's file lock refuses a second process); one write transaction at a time (a writer
  lock), so every scope is the writer's until it commits.
- **Transactions.** A write transaction changes a copy of the committed tables and its commit
  publishes the copy (``tables.py``): atomic, and a failure leaves nothing. A snapshot read
  holds one committed state; a read without a snapshot reads the latest at each call.
- **What cores share** is this process's (``shared_state.SoleWriterState``); no audit spool (a
  standalone row is written at once: it costs nothing here); the key vault is the caller's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import astuple
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.engine import (
    CommitHooks,
    EngineCapabilities,
    ScopeChanges,
    StoreObservers,
    TxEffects,
    read_changes_since,
)
from engram_core.store.memory.tables import Tables
from engram_core.store.memory.tx import SCHEMA_VERSION, MemoryEngineTx
from engram_core.store.port import ScopeRow
from engram_core.store.shared_state import SOLE_WRITER_STATE

LOCATION = "memory:"


class MemoryDatabase:
    """What an in-memory store holds: its committed tables, and whether an engine has it open."""

    def __init__(self) -> None:
        self.tables = Tables()
        self.lock = threading.Lock()  # guards ``opened``
        self.opened = False


class _IndexScan:
    def __init__(self, tables: Tables) -> None:
        self._tables = tables

    def indexed_rows(self) -> Iterator[tuple[Any, ...]]:
        t = self._tables
        return (astuple(t.records[rid]) for rid in t.projections if rid in t.records)

    def projection_blobs(self) -> Iterator[tuple[str, bytes]]:
        return ((rid, sealed) for rid, (_, _, sealed) in self._tables.projections.items())

    def scopes(self) -> dict[tuple[str, str], ScopeRow]:
        return dict(self._tables.scopes)


class MemoryEngine:
    """The in-memory engine (``engine.Engine``) over ``database`` (a fresh one when None)."""

    capabilities = EngineCapabilities(sole_writer=True)
    shared = SOLE_WRITER_STATE

    def __init__(self, database: MemoryDatabase | None = None) -> None:
        self.database = database if database is not None else MemoryDatabase()
        with self.database.lock:
            if self.database.opened:
                raise EngramError(Code.FENCE_LOST, "another engine holds the store")
            self.database.opened = True
        self._hooks: CommitHooks | None = None
        self.observers = StoreObservers()
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._open = True

    def set_hooks(self, hooks: CommitHooks, observers: StoreObservers) -> None:
        self._hooks, self.observers = hooks, observers

    def reload(self) -> None:
        """Nothing: the engine keeps no cache."""

    def _require_open(self) -> None:
        if not self._open:
            raise EngramError(Code.STORE_UNAVAILABLE, "store closed")

    # -- transactions ---------------------------------------------------------------------------------
    def in_write(self) -> bool:
        return bool(getattr(self._local, "writing", False))

    @contextmanager
    def write(self, *, batched: bool = False, effects: TxEffects,
              scope: Scope | None = None) -> Iterator[MemoryEngineTx]:
        """A write transaction, committed alone (``batched`` changes nothing: a commit costs nothing)."""
        self._require_open()
        if self.in_write():
            raise EngramError(Code.STORE_UNAVAILABLE, "a write transaction inside a write transaction")
        hooks = self._hooks
        with self._write_lock:
            self._local.writing = True
            try:
                work = self.database.tables.copy()
                tx = MemoryEngineTx(lambda: work, writing=True)
                try:
                    yield tx
                    if hooks is not None:  # what the body did decides what the hooks do (keys to sync)
                        hooks.prepare([effects], tx, hooks.before_flush([effects]))
                except BaseException:
                    if hooks is not None:
                        hooks.rolled_back([effects])
                    raise
                started = time.perf_counter()
                self.database.tables = work  # the commit: one assignment, atomic for every reader
                if self.observers.on_commit is not None:
                    self.observers.on_commit(time.perf_counter() - started, 1)
                # Under the writer lock, as the commit itself: the kernel publishes commits in order.
                if hooks is not None:
                    hooks.committed([effects], dict(tx.scope_changes))
            finally:
                self._local.writing = False

    def commit_answered(self) -> None:
        """Nothing to do: every write is answered at its COMMIT."""

    @contextmanager
    def read(self, *, snapshot: bool = True, as_writer: bool = False) -> Iterator[MemoryEngineTx]:
        self._require_open()
        if snapshot:
            held = self.database.tables
            yield MemoryEngineTx(lambda: held)
        else:
            yield MemoryEngineTx(lambda: self.database.tables)

    @contextmanager
    def index_scan(self) -> Iterator[_IndexScan]:
        self._require_open()
        yield _IndexScan(self.database.tables)

    def scope_now(self, scope: Scope) -> ScopeRow | None:
        return self.database.tables.scopes.get((scope.tenant, scope.workspace))

    def changes_since(self, scope: Scope, after: int) -> ScopeChanges:
        with self.read(snapshot=True) as tx:
            return read_changes_since(tx, scope, after)

    # -- the store as a whole -------------------------------------------------------------------------
    def migrate(self) -> list[int]:
        return []  # no schema: nothing to migrate

    def migration_ledger(self) -> list[dict[str, Any]]:
        return []

    def migration_code(self) -> list[dict[str, Any]]:
        return []

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def checkpoint(self) -> None:
        """Nothing: freed rows are gone once no transaction holds the state that had them."""

    def analyze(self) -> None:
        """Nothing: no query planner."""

    def describe(self) -> dict[str, Any]:
        t = self.database.tables
        by_state: dict[str, dict[str, int]] = {"records": {}, "candidates": {}}
        for name, rows in (("records", t.records.values()), ("candidates", t.candidates.values())):
            for row in rows:
                by_state[name][row.state] = by_state[name].get(row.state, 0) + 1
        return {"engine": "memory", "store": LOCATION, "migrations_applied": [], "scopes": len(t.scopes),
                **{k: dict(sorted(v.items())) for k, v in by_state.items()},
                "audit_rows": sum(len(rows) for rows in t.audit.values())}

    def is_open(self) -> bool:
        return self._open

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        with self.database.lock:
            self.database.opened = False
