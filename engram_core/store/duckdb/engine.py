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
The engine's transaction is ``tx.py``; the SQL it shares with PostgreSQL, ``engram_core/store/sql/``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import record_data_key
from engram_core.observability import tracing
from engram_core.store.audit_spool import SPOOL_NAME
from engram_core.store.chain import GENESIS, chain_of
from engram_core.store.duckdb.candidate_cache import CommittedCandidates
from engram_core.store.duckdb.group_commit import MAX_MEMBERS, Batch
from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS
from engram_core.store.duckdb.tx import SCHEMA_VERSION, DuckDBEngineTx
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
    RecordRow,
    ScopeRow,
    iter_chunks,
)
from engram_core.store.projection import DataKeys, Projection, seal_projection
from engram_core.store.search_index import FIELD_CODE
from engram_core.store.shared_state import SOLE_WRITER_STATE
from engram_core.store.sql.codecs import RECORD_COLS, SCOPE_COLS, audit_values, record_of, scope_of
from engram_core.store.sql.hooks import HeldHooks
from engram_core.store.sql.ledger import pending_migrations

__all__ = ["SCHEMA_VERSION", "DuckDBEngine", "DuckDBEngineTx", "remove_store_files"]
OPEN_CHUNK = 4096  # rows / projections fetched per round trip when the index is built
# While the index is built, DuckDB may cache this much beyond what it held before (the scans read
# every row and projection once; with its default limit, 80% of RAM, it kept them all: ~3 KB a
# record, 3 GB at a million). Afterwards the table blocks the build cached are evicted.
BUILD_CACHE_BYTES = 256 << 20
CACHE_AFTER_BUILD = 32 << 20  # of table blocks the build read, at most this much stays cached
# The records' columns from migration 3 to 11: what a migration step before 12 may read
# (``record_of`` fills the later ones with None).
RECORD_COLS_BEFORE_12 = RECORD_COLS.removesuffix(", session, captured_at_ms")
log = logging.getLogger(__name__)
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


class DuckDBEngine(HeldHooks):
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
        self._candidates = CommittedCandidates()  # under the writer lock only
        if migrate:
            self._load_copies()

    # -- migrations ------------------------------------------------------------------
    def check_migrations(self, *, apply: bool) -> list[int]:
        """Verify the ledger against the code; apply missing migrations when ``apply``."""
        con = self._con
        con.execute(LEDGER_DDL)
        pending = pending_migrations({int(v): c for v, c in con.execute(
            "SELECT version, checksum FROM schema_migrations ORDER BY version").fetchall()}, MIGRATIONS)
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
        return record_data_key(self._keys, rec)

    def migrate(self) -> list[int]:
        """Re-verify the ledger and apply pending migrations, serialized with writers."""
        with self._exclusive():
            self._candidates.clear()
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
            scopes = {(r[0], r[1]): scope_of(r)
                      for r in cur.execute(f"SELECT {SCOPE_COLS} FROM scopes").fetchall()}
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

    def scope_now(self, scope: Scope) -> ScopeRow | None:
        scopes = self._scopes
        if scopes is not None:
            return scopes.get((scope.tenant, scope.workspace))
        with self.read(snapshot=False) as tx:
            return tx.scope(scope)

    def changes_since(self, scope: Scope, after: int) -> ScopeChanges:
        with self.read(snapshot=True) as tx:
            return read_changes_since(tx, scope, after)

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

    def committed_candidate(self, candidate_id: str) -> CandidateRow | None:
        """A candidate as committed, when the writer has a copy (candidate_cache.py)."""
        return self._candidates.get(candidate_id)

    def _stale(self) -> None:
        self._candidates.clear()
        with self._copies_lock:
            self._scopes = self._heads = None

    def reload(self) -> None:
        """Re-read the committed copies and negative-lookup digests (after writes that bypassed
        the engine's transactions, e.g. a bulk loader)."""
        with self._exclusive():
            self._candidates.clear()
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
              scope: Scope | None = None) -> Iterator[DuckDBEngineTx]:
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
            if tx.wrote_candidates:
                self._candidates.clear()
            self._committed(tx.scope_changes, tx.audit_heads_changed)
            hooks.committed([effects], tx.scope_changes)

    def _batched(self, effects: TxEffects) -> Iterator[DuckDBEngineTx]:
        with self._locked():
            batch = self._batch
            if batch is None:
                batch = self._batch = Batch()  # its transaction begins with its first write
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
                batch.join(self._con, tx.member)  # type: ignore[arg-type]
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
            if batch.begun:
                _rollback(con)
            batch.done.set()
            return
        try:
            token = hooks.before_flush(batch.effects)  # the key vault's fdatasync runs meanwhile
            # The rows now, beside the fdatasync; the updates and deletes that must follow rows of
            # their tables wait to share the audit rows' statement (group_commit.statements_of).
            batch.flush(con, hold_overlaps=True)
            hooks.prepare(batch.effects, _BatchAudit(self, batch), token)
            batch.flush(con)
        except BaseException as exc:
            _rollback(con)
            hooks.rolled_back(batch.effects)
            batch.fail(self._refusal(exc))
            return
        try:
            if batch.begun:  # else its members wrote nothing: nothing to commit
                self._commit(con, batch.members)
        except EngramError as exc:
            batch.fail(exc)
            return
        if batch.candidates_by_sql:
            self._candidates.clear()
        else:
            self._candidates.committed(batch.new_candidates, batch.candidate_changes)
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
            yield self.tx_class(cur, self, latest=True)
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
            self._batch.pending.add_row("audit", "INSERT OR IGNORE" if if_absent else "INSERT", "", audit_values(doc))
            self._batch.audit_heads[chain_of(doc)] = (int(doc["seq"]), doc["row_digest"])


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
        return {(r[0], r[1]): scope_of(r)
                for r in self._cur.execute(f"SELECT {SCOPE_COLS} FROM scopes").fetchall()}


def remove_store_files(data_dir: Path) -> None:
    for name in ("engram.duckdb", "engram.duckdb.wal", SPOOL_NAME):
        p = data_dir / name
        if p.exists():
            os.remove(p)
