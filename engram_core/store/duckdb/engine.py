"""The DuckDB engine (SPEC §10): one process, one file, the embedded default.

One process writes (an exclusive ``flock`` on ``DIR/engram.lock`` is the fence; DuckDB's
own file lock backs it up), so the engine is its database's ``sole_writer``: its caches
(committed scope rows, audit chain heads, negative-lookup digests) are exact. Writes are
serialized by one writer lock and run in one DuckDB transaction each, or share one as
members of a group commit (``group_commit.py``); reads use per-thread cursors. The
durability point is ``COMMIT`` (DuckDB's WAL is flushed before it returns) or, for a batch a
lone writer settles, its synced frame in the intent log (``intent_log.py``), DuckDB committing
the batch later; the kernel's ``committed`` hook (which publishes to searches) runs only after
that point, and a reader of the database commits what was answered before it reads.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.observability import tracing
from engram_core.store.audit_spool import SPOOL_NAME
from engram_core.store.chain import GENESIS, chain_of
from engram_core.store.duckdb import answer_check
from engram_core.store.duckdb.candidate_cache import CommittedCandidates
from engram_core.store.duckdb.group_commit import MAX_MEMBERS, Batch
from engram_core.store.duckdb.intent_log import (
    EPOCH_KEY,
    INTENTS_NAME,
    IntentLog,
    IntentLogBroken,
    Unloggable,
)
from engram_core.store.duckdb.migrating import Migrating, connect
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
    ScopeRow,
)
from engram_core.store.projection import DataKeys
from engram_core.store.shared_state import SOLE_WRITER_STATE
from engram_core.store.sql.codecs import RECORD_COLS, SCOPE_COLS, audit_values, scope_of
from engram_core.store.sql.hooks import HeldHooks
from engram_core.store.sql.rows import SET_META

__all__ = ["SCHEMA_VERSION", "DuckDBEngine", "DuckDBEngineTx", "remove_store_files"]
OPEN_CHUNK = 4096  # rows / projections fetched per round trip when the index is built
# While the index is built, DuckDB may cache this much beyond what it held before (the scans read
# every row and projection once; with its default limit, 80% of RAM, it kept them all: ~3 KB a
# record, 3 GB at a million). Afterwards the table blocks the build cached are evicted.
BUILD_CACHE_BYTES = 256 << 20
CACHE_AFTER_BUILD = 32 << 20  # of table blocks the build read, at most this much stays cached
# Members acknowledged from the intent log that one open batch holds before DuckDB commits them
# (bounds the batch's memory and the replay at open; 64 amortize DuckDB's per-statement costs).
MAX_ACKED = 64
# While reads arrive (one began within this many seconds), a batch commits before it is answered,
# as it would without the intent log: a reader first commits the writes answered before it, and
# with writers and readers interleaved each reader paid that COMMIT for the few members answered
# since the last (~16 ms under four writers at 10k records; a search's p50 32-42 ms against 12-15
# with every batch committed by its writers). Write bursts with no reader keep the log.
READS_HOLD_OFF_S = 0.1
log = logging.getLogger(__name__)


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back, where a failed ROLLBACK (no transaction left) must not hide the error being raised."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


class DuckDBEngine(Migrating, HeldHooks):
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
            self._con = connect(self.path)
        except duckdb.Error as exc:
            self._lock_file.close()
            raise EngramError(Code.STORE_UNAVAILABLE, f"open failed: {type(exc).__name__}") from None
        self._write_lock = threading.RLock()
        # Group commit (group_commit.py): the open batch, and how many threads wait for the
        # writer lock (a member leaves the batch open only while someone is queued to close it).
        self._batch: Batch | None = None
        self._waiting = 0
        self._read_at = float("-inf")  # when the last reader of the database began (READS_HOLD_OFF_S)
        self._waiting_lock = threading.Lock()
        self._local = threading.local()
        self._open = True
        self._closed = False
        # DuckDB's memory limit as opened (the index build bounds it for a while: _bounded_cache).
        self._memory_limit = str(self._con.execute("SELECT current_setting('memory_limit')").fetchone()[0])  # type: ignore[index]
        self.migrations_applied_at_open = self.check_migrations(apply=migrate)
        self._intents: IntentLog | None = None
        self._epoch = 0
        self._columns: dict[str, tuple[str, ...]] | None = None
        if migrate:  # a store opened without migrating (a check) is read, never written
            self._intents = IntentLog(data_dir / INTENTS_NAME)
            self._replay_intents()
            self._answers = answer_check.AnswerCheck(self._con)
            self._columns = {t: spec.columns for t, spec in self._answers.schema.items()}
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
            if self._intents is not None:
                self._answers.stale()

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
            if self._intents is not None:  # what it wrote joins the answer check's digests
                self._answers.noted(tx.direct_ops)
            self._commit(con)
            if tx.wrote_candidates:
                self._candidates.clear()
            self._committed(tx.scope_changes, tx.audit_heads_changed)
            hooks.committed([effects], tx.scope_changes)

    def _batched(self, effects: TxEffects) -> Iterator[DuckDBEngineTx]:
        with self._locked():
            batch = self._batch
            if batch is None:
                batch = self._batch = Batch(self._columns)  # its transaction begins with its first write
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
            segment = batch.segment
            if self._waiting == 0 or batch.members >= MAX_MEMBERS:
                self._ack_or_settle()
        segment.done.wait()
        if segment.error is not None:
            raise segment.error

    @staticmethod
    def _refusal(exc: BaseException) -> BaseException:
        """What members of a batch rolled back for ``exc`` are told: nothing of theirs happened."""
        if isinstance(exc, EngramError):
            return exc
        return EngramError(Code.STORE_UNAVAILABLE, f"write batch rolled back: {type(exc).__name__}")

    def _abandon(self, extra: list[TxEffects], error: BaseException | None = None, *, rebuild: bool = True) -> None:
        """Roll the open batch back; its unanswered members are refused with ``error`` (default:
        retriably) (under the writer lock). Members answered from the intent log stay: the
        batch is rebuilt with them (``rebuild``)."""
        batch, self._batch = self._batch, None
        _rollback(self._con)
        self._hooks.rolled_back([*(batch.effects if batch is not None else []), *extra])  # type: ignore[union-attr]
        if batch is not None:
            batch.fail(error or EngramError(Code.STORE_UNAVAILABLE, "write batch rolled back: retry"))
            if rebuild:
                self._rebuild(batch)

    def _rebuild(self, batch: Batch) -> None:
        """After a rollback: the open batch again as its logged segments left it (nothing if
        none). A failure here stops the engine; reopening replays the log."""
        if not batch.acked:
            return
        fresh = Batch(self._columns)
        try:
            fresh.replay(self._con, batch.acked)
            # Into the transaction now: the hot lookups (idempotency keys, candidates, data keys,
            # payloads, tombstones) came with the members' joins, not with their writes, so the
            # rebuilt batch has none and its readers must find the rows in the database.
            fresh.flush(self._con)
        except BaseException:
            _rollback(self._con)
            self._fail_stop("rebuilding the open batch after a rollback failed")
            return
        fresh.log_ops, fresh.candidate_changes, fresh.changed_candidates = [], [], set()
        fresh.acked, fresh.acked_members = batch.acked, batch.acked_members
        fresh.audit_heads, fresh.acked_heads = dict(batch.acked_heads), dict(batch.acked_heads)
        fresh.candidates_by_sql = batch.candidates_by_sql
        fresh.keys = batch.keys
        self._batch = fresh

    def _fail_stop(self, why: str) -> None:
        """Writes acknowledged from the intent log are not in DuckDB and cannot be put there:
        stop serving (reads would miss them); a restart replays the log."""
        log.error("store stopped: %s; restart the core (the intent log is replayed at open)", why)
        self._stale()
        self._open = False

    def _ack_or_settle(self) -> None:
        """Answer the open batch's current members: from the intent log when their writes allow
        it (``intent_log.py``), else by committing the batch."""
        batch = self._batch
        assert batch is not None
        hooks = self._hooks
        assert hooks is not None
        if (self._intents is None or batch.acked_members + batch.members > MAX_ACKED or not hooks.index_current()
                or time.monotonic() - self._read_at < READS_HOLD_OFF_S
                or any(op[0] == "sql" or (op[0] == "row" and op[1] == "tombstones") for op in batch.log_ops)):
            # A forget commits before it is answered, and the log is emptied with it: its answer
            # says the record's rows are gone, and a frame would keep a copy until the next COMMIT.
            # A statement by condition (not by key) commits too: what it deletes or changes is not
            # known here, so neither is what a later row of the batch may collide with.
            self._settle()
            return
        try:
            token = hooks.before_flush(batch.effects)  # the key vault's fdatasync, awaited in prepare
            hooks.prepare(batch.effects, _BatchAudit(self, batch), token)
            self._answers.check(batch.keys, batch.log_ops)
            if batch.log_ops:  # members that wrote nothing have nothing to make durable
                started = time.perf_counter()
                self._intents.append(self._epoch, batch.log_ops)
                if self.observers.on_commit is not None:  # the members' durability point: counted here
                    self.observers.on_commit(time.perf_counter() - started, batch.members)
        except Unloggable:
            self._settle(prepared=True)  # the audit rows it prepared are in the batch
            return
        except IntentLogBroken:
            self._abandon([], EngramError(Code.STORE_UNAVAILABLE, "intent log unwritable"), rebuild=False)
            self._fail_stop("the intent log could not be written or cut back to its last frame")
            return
        except BaseException as exc:
            self._abandon([], self._refusal(exc))
            return
        self._publish(batch)
        answered = batch.next_segment()
        if not hooks.index_current():  # publishing failed: the index is rebuilt from the database,
            self._settle()             # which must then hold what was answered
        answered.done.set()

    def _publish(self, batch: Batch) -> None:
        """The current members' writes are durable (committed, or in the intent log): the
        writer's copies take them, then the kernel's ``committed`` (searches see them)."""
        if batch.candidates_by_sql:
            self._candidates.clear()
        else:
            self._candidates.committed(batch.new_candidates, batch.candidate_changes)
        self._committed(batch.scope_changes, batch.audit_heads)
        self._hooks.committed(batch.effects, batch.scope_changes)  # type: ignore[union-attr]

    def _apply_acked(self, *, wait: bool = True) -> None:
        """Commit the writes answered from the intent log, for a reader of the database.
        ``wait`` False: only if the writer lock is free now (the index build, which holds the
        kernel's publish lock, which a writer holding the writer lock may be waiting for; none
        is answered from the log while the index is not current: ``index_current``)."""
        batch = self._batch
        if batch is None or not batch.acked or self.in_write():
            return
        if not wait:
            if not self._write_lock.acquire(blocking=False):
                log.error("search index built while writes answered from the intent log wait for their COMMIT")
                return
            try:
                self._settle_for_reader()
            finally:
                self._write_lock.release()
            return
        with self._locked():
            self._settle_for_reader()

    def _settle_for_reader(self) -> None:
        """Under the writer lock: commit the open batch if it holds answered writes, or members
        left unanswered because this reader was counted as a queued writer (``_locked``)."""
        if self._batch is not None and (self._batch.acked or self._batch.members):
            self._settle()

    def commit_answered(self) -> None:
        """Commit what was answered before the database holds it (the index build's first step)."""
        if self._open:
            self._apply_acked()

    def _replay_intents(self) -> None:
        """At open: commit the frames DuckDB has not (a crash after their answer, before their
        COMMIT), in order, then empty the log."""
        assert self._intents is not None
        row = self._con.execute("SELECT v FROM store_meta WHERE k = ?", [EPOCH_KEY]).fetchone()
        applied = int(row[0]) if row else 0
        frames = [ops for epoch, ops in self._intents.frames() if epoch > applied]
        self._epoch = applied + 1
        if frames:
            batch = Batch()
            try:
                batch.replay(self._con, frames)
                batch.flush(self._con)
                batch.execute(self._con, SET_META, [EPOCH_KEY, str(self._epoch)])
                self._con.execute("COMMIT")
            except Exception as exc:  # the frames stay for the next open; nothing is half-applied
                _rollback(self._con)
                self._con.close()
                self._intents.close()
                self._lock_file.close()
                raise EngramError(Code.STORE_UNAVAILABLE, f"intent log replay failed: {type(exc).__name__}") from None
            log.info("intent log: %d acknowledged write(s) committed at open", len(frames))
            self._epoch += 1
        self._intents.clear()

    def _settle(self, *, prepared: bool = False, retry: bool = True) -> None:
        """Commit the open batch and answer its members (under the writer lock): their rows
        flushed, the kernel's ``prepare`` (audit rows chained and written, the key vault synced
        meanwhile, audit devices), COMMIT, then the kernel's ``committed``. ``prepared``: the
        kernel's ``prepare`` already ran for the current members. Members answered from the
        intent log are committed with them; if the batch fails, those are committed alone
        (``retry``), and if that fails too the engine stops."""
        batch, self._batch = self._batch, None
        assert batch is not None
        hooks = self._hooks
        assert hooks is not None
        con = self._con
        if batch.members == 0 and not batch.acked:
            if batch.begun:
                _rollback(con)
            batch.segment.done.set()
            return
        try:
            if batch.members and not prepared:
                token = hooks.before_flush(batch.effects)  # the key vault's fdatasync runs meanwhile
                # The rows now, beside the fdatasync; the updates and deletes that must follow rows
                # of their tables wait to share the audit rows' statement (group_commit.statements_of).
                batch.flush(con, hold_overlaps=True)
                hooks.prepare(batch.effects, _BatchAudit(self, batch), token)
            batch.flush(con)
            if self._intents is not None:  # the members committed without a check: their keys
                self._answers.noted(batch.log_ops)
            if batch.acked:  # the log's frames of this epoch are in this COMMIT
                batch.execute(con, SET_META, [EPOCH_KEY, str(self._epoch)])
        except BaseException as exc:
            _rollback(con)
            hooks.rolled_back(batch.effects)
            batch.fail(self._refusal(exc))
            if batch.acked:  # commit what was answered without the members that failed it
                if not retry:
                    self._fail_stop("committing writes answered from the intent log failed")
                    return
                self._rebuild(batch)
                if self._batch is not None:
                    self._settle(retry=False)
            return
        try:
            if batch.begun:  # else its members wrote nothing: nothing to commit
                self._commit(con, batch.members)  # the answered ones were counted at their frame
        except EngramError as exc:
            batch.fail(exc)
            if batch.acked:
                self._fail_stop("COMMIT of writes answered from the intent log failed")
            return
        if batch.acked:
            self._epoch += 1
            try:
                self._intents.clear()  # type: ignore[union-attr]
            except OSError:  # its frames are of a committed epoch: replay skips them
                log.warning("intent log not emptied after its COMMIT")
        self._publish(batch)
        batch.segment.done.set()

    def _commit(self, con: duckdb.DuckDBPyConnection, transactions: int = 1) -> None:
        started = time.perf_counter()
        try:
            con.execute("COMMIT")
            if self.observers.on_commit is not None and transactions:
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
        self._apply_acked(wait=False)
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
    def read(self, *, snapshot: bool = True, as_writer: bool = False) -> Iterator[DuckDBEngineTx]:
        """A reader on this thread's cursor: one consistent snapshot, or (``snapshot=False``)
        each statement on its own latest committed state, which saves the transaction's
        statements where the caller revalidates what it reads (search). Writes answered from the
        intent log are committed first: a read sees every write answered before it, or, with
        ``as_writer`` (and ``snapshot=False``), are read where they are: through the open batch
        on the writer's connection, under the writer lock (a write's checks before its
        transaction; committing there would cost each mutation its own COMMIT again)."""
        self._require_open()
        if as_writer and not snapshot and not self.in_write() and self._intents is not None:
            # Under the writer lock for the whole read: no answer lands between what it reads
            # from the committed copies and what it reads from the database (an admission racing
            # its own retry once saw its candidate admitted and the idempotency row not there).
            # Not counted as waiting (``_locked``): a member that joins meanwhile must answer
            # itself, not leave its answer to this reader.
            with self._write_lock:
                if self._batch is not None and self._batch.members:
                    self._ack_or_settle()  # members left for a queued writer: never read unanswered
                batch = self._batch
                if batch is not None and batch.acked:
                    yield self.tx_class(self._con, self, batch=batch, latest=True)
                else:
                    yield self.tx_class(self._cursor(), self, latest=True)
                return
        self._read_at = time.monotonic()
        self._apply_acked()
        cur = self._cursor()
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

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's reading cursor."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cursor = cur
        return cur

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
        if self._closed:
            return
        self._closed = True
        stopped, self._open = not self._open, False
        with self._locked() if stopped else self._exclusive():
            if stopped and self._batch is not None:
                self._batch = None  # a stopped engine's open batch: its log replays at the next open
                _rollback(self._con)
            try:
                self._con.execute("CHECKPOINT")
            except duckdb.Error:
                pass
            self._con.close()
            if self._intents is not None:
                self._intents.close()
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
            op = ("row", "audit", "INSERT OR IGNORE" if if_absent else "INSERT", "", audit_values(doc))
            self._batch.pending.note(op)
            self._batch.log_ops.append(op)
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
    for name in ("engram.duckdb", "engram.duckdb.wal", SPOOL_NAME, INTENTS_NAME):
        p = data_dir / name
        if p.exists():
            os.remove(p)
