"""The store kernel: what every engine's store does the same way, above the engine port.

Services see the kernel as the ``Store`` port (``port.py``); under it an engine
(``engine.py``: DuckDB, PostgreSQL) keeps rows. The kernel owns, for every engine:

- **Hash chains**: journal event digests (computed from the scope head the engine holds for
  the transaction) and audit chaining (``chain.py``): a write transaction's rows join their
  scopes' chains when it commits (the engine's ``prepare`` hook), the rows of calls that change
  nothing join this process's writer chain at once.
- **The audit spool and devices**: a standalone row is durable before its call answers,
  appended to the spool (``audit_spool.py``; engines where a row of its own costs milliseconds)
  or written by the engine at once; every row goes to the audit devices first
  (``audit_device.py``), and a row no device took fails its call (SPEC §10 fail closed).
- **Sealed projections**: a record's postings and vector sealed under its own data key
  (``projection.py``) before the engine sees them; opened with the key when read.
- **Key durability around COMMIT**: data keys created unsynced are synced before the
  transaction naming them commits (beside the engine's own statements), destroyed keys are
  zeroed only after it committed.
- **The search index** (``store/search_index/``), fed after each COMMIT with the transaction's
  committed changes (``changes.py``) under one publish lock, together with the committed scope
  rows searches pin. An engine whose database others also write (``sole_writer`` False) is
  asked for the scope head instead, and the index catches up from the journal when it is
  behind (``catch_up``), so a read on one core sees what another core acknowledged.

The kernel reads what the engine is from its ``capabilities`` (``engine.EngineCapabilities``:
sole writer, spooled audit rows, scopes loaded on first use) and asks the state cores share of
its ``shared`` (``engine.SharedState``). It calls nothing of an engine that ``engine.Engine``
does not declare (a type checker proves it: tests/unit/test_type_check.py). Its ``Tx``,
``KernelTx``, is ``kernel_tx.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import KeyVault, WrappedKey, record_data_key, record_data_keys
from engram_core.store.audit_spool import AuditSpool
from engram_core.store.chain import audit_doc, chain_heads, new_writer_chain, scope_chain
from engram_core.store.changes import (
    Posting,
    RecordIndexed,
    RecordUnindexed,
    ScopeProjectionsDropped,
    VectorIndexed,
)
from engram_core.store.engine import (
    AuditWriter,
    Engine,
    StoreObservers,
    TxEffects,
    records_of_event,
)
from engram_core.store.index_residency import IndexResidency, ResidencyStats
from engram_core.store.kernel_tx import KernelTx
from engram_core.store.page_pins import MAX_PINS, PinStore
from engram_core.store.port import (
    AuditRow,
    ContextClaim,
    Event,
    RecordRow,
    ScopeRow,
    SharedPin,
    Store,
    Tx,
)
from engram_core.store.projection import Projection, open_plain, open_projection
from engram_core.store.search_index import FIELDS, IndexBuilder, SearchIndex
from engram_core.store.usage_counters import QuotaCounters, UsageRead

SPOOL_BATCH = 512  # spooled audit rows moved into the engine in one transaction
log = logging.getLogger(__name__)


class StoreKernel:
    """The ``Store`` port over one engine, one key vault and (optionally) a spool directory."""

    def __init__(self, engine: Engine, keys: KeyVault | None, *, spool_dir: Path | None = None,
                 load_index: bool = True, recover: bool = True, index_max_records: int = 0,
                 sketch_vectors: bool = True, observers: StoreObservers | None = None) -> None:
        """``keys``: the key vault (projections are sealed under record keys; a kernel opened
        without one, for offline tools, has no search index). ``spool_dir``: the core's data
        directory, where standalone audit rows are spooled if the engine ``spools_audit`` (None,
        or an engine that does not: the engine writes each at once). ``load_index=False``
        leaves the search index to ``reload_indexes`` (the server builds it after it listens);
        ``recover=False`` leaves rows a previous process spooled where they are (offline tools
        that read what a crash left). An engine with ``lazy_scopes`` (one other cores share: a
        read reads the scope's head from the database anyway) has a scope's index loaded on its
        first read, not at open, and the least recently used scopes evicted once the loaded ones
        hold more than ``index_max_records`` records (0: never; ``index_residency.py``).
        ``sketch_vectors`` False: a core that serves no semantic search does not build the
        vectors' int8 sketch when it loads a scope (``IndexBuilder``). ``observers``: what
        operators watch (``engine.StoreObservers``; the engine reports to the same object)."""
        self.engine = engine
        self.capabilities = capabilities = engine.capabilities
        self._keys = keys
        self.observers = observers if observers is not None else StoreObservers()
        engine.set_hooks(self, self.observers)
        self.writer_chain = new_writer_chain()
        # The writer chain's head and who may append to it: a standalone row holds this lock
        # from taking its place in the chain until it is durable.
        self._audit_lock = threading.RLock()
        self._writer_head: tuple[int, str] = (0, "sha256:" + "0" * 64)
        # Spooled rows waiting for a batch (``_append_spooled``), and whose turn it is to lead one.
        self._turn = threading.Condition(threading.Lock())
        self._queue: list[_Queued] = []
        self._leading = False
        self._devices: Any = None
        self._spool = AuditSpool(spool_dir) if spool_dir is not None and capabilities.spools_audit else None
        # Rows a previous process acknowledged but did not move in (it did not close cleanly).
        self.spool_replayed_rows = len(self._spool.pending) if self._spool is not None else 0
        self._mover = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-audit-move")
        self._move_scheduled = False
        self._syncer: ThreadPoolExecutor | None = None  # the key vault's sync beside a commit's statements
        # What searches read instead of the database: the search index and the scope rows as of
        # the last commit, published together after each COMMIT under one lock. Stale after a
        # commit of unknown outcome or a failed apply: rebuilt from one snapshot before next use.
        self._publish = threading.Lock()
        self._index = SearchIndex()
        self._scopes: dict[tuple[str, str], ScopeRow] | None = None
        # Per scope, the journal cursor up to which the index holds every committed change.
        self._applied: dict[tuple[str, str], int] = {}
        # Scopes loaded on first use (None: every scope is loaded at open).
        self._residency = IndexResidency(index_max_records) if capabilities.lazy_scopes else None
        self.on_scope_refresh: Callable[[Scope], None] | None = None  # Store.on_scope_refresh
        self._sketch_vectors = sketch_vectors
        self._stale = True
        self._rebuilding = 0  # reload_indexes calls running (index_current)
        self._open = True
        if recover and self._spool is not None and self._spool.pending:
            self._move_spool()
        if load_index:
            with self._publish:
                self._reload()

    # -- transactions ------------------------------------------------------------------------------
    @contextmanager
    def write(self, *, batched: bool = False, scope: Scope | None = None) -> Iterator[KernelTx]:
        self._require_open()
        effects = TxEffects()
        with self.engine.write(batched=batched, effects=effects, scope=scope) as etx:
            yield KernelTx(self, etx, effects)

    @contextmanager
    def read(self, *, snapshot: bool = True, as_writer: bool = False) -> Iterator[KernelTx]:
        self._require_open()
        if snapshot and self._spool is not None and self._spool.pending and not self.engine.in_write():
            # A snapshot sees every audit row acknowledged before it began (audit export,
            # verification and backup read the engine's rows).
            self._move_spool()
        with self.engine.read(snapshot=snapshot, as_writer=as_writer) as etx:
            yield KernelTx(self, etx, None, latest=not snapshot)

    # -- standalone audit rows (the writer chain) -----------------------------------------------------
    def append_audit(self, row: AuditRow, *, page_pins: Sequence[SharedPin] = ()) -> str:
        """Audit a call that changed nothing, durably, on this process's writer chain; its digest.
        ``page_pins`` go into the engine with it: in the row's own transaction where the engine
        writes the row at once, else each on its own first."""
        self._require_open()
        if self.engine.in_write():
            # Its durability would wait for, or be undone with, the open transaction.
            raise EngramError(Code.STORE_UNAVAILABLE, "standalone audit row inside a write transaction")
        shelf = self.engine.shared.pin_shelf()
        if page_pins and shelf is None:
            raise ValueError("page pins are shared only where other cores write the store")
        if page_pins and shelf is not None and self._spool is not None:
            for pin in page_pins:
                shelf.put_page_pin(pin.pin_id, Scope(pin.tenant, pin.workspace), pin.pin, pin.expires_at_ms)
            page_pins = ()
        if self._spool is not None:
            return self._append_spooled(row)
        with self._audit_lock:
            doc = audit_doc(row, self.writer_chain, self._writer_head)
            if self._devices:
                self._devices.write_rows([doc])  # STORE_UNAVAILABLE when no device took it: nothing written
            try:
                with self.engine.write(effects=TxEffects(spooled_audit=[doc])) as etx:
                    for pin in page_pins:
                        etx.put_page_pin(pin)
            except EngramError:
                if self._devices:
                    self._devices.abort(self.writer_chain, [doc["seq"]])
                raise
            self._writer_head = (doc["seq"], doc["row_digest"])
        return doc["row_digest"]

    def _append_spooled(self, row: AuditRow) -> str:
        """Group commit of the reads' rows: a row is queued; while another caller leads a batch
        the others wait for their turn, and the first whose row is not yet done leads the next:
        it appends every row queued by then, chained in queue order, with one write and one
        ``fdatasync``. So the reads that arrive while a sync runs share the next one, and each
        returns only once its own row is durable (docs/reliability.md, "Audit rows of reads")."""
        spool = self._spool
        assert spool is not None
        queued = _Queued(row)
        with self._turn:
            self._queue.append(queued)
            while self._leading and not queued.done:
                self._turn.wait()
            batch = None
            if not queued.done:
                self._leading = True
                batch, self._queue = self._queue, []
        if batch is not None:
            due = False
            try:
                with self._audit_lock:
                    self._append_batch(spool, batch)
                    due = len(spool.pending) >= SPOOL_BATCH and not self._move_scheduled
                    if due:
                        self._move_scheduled = True
            finally:
                for member in batch:
                    if not member.done:  # (only if the batch was cut short by an interrupt)
                        member.finish(error=EngramError(Code.STORE_UNAVAILABLE, "audit write interrupted"))
                with self._turn:
                    self._leading = False
                    self._turn.notify_all()
            if due:
                self._mover.submit(self._move_spool_quietly)
        if queued.error is not None:
            raise queued.error
        assert queued.digest is not None
        return queued.digest

    def _append_batch(self, spool: AuditSpool, batch: list[_Queued]) -> None:
        """Chain, write and sync ``batch`` under the audit lock, setting each member's outcome.
        A row that cannot be chained fails alone; a failed device write, spool write or sync
        fails every other row of the batch (none acknowledged) and leaves the chain's head."""
        head = self._writer_head
        docs: list[dict[str, Any]] = []
        members: list[_Queued] = []
        for queued in batch:
            try:
                doc = audit_doc(queued.row, self.writer_chain, head)
            except Exception as exc:  # not canonical JSON: its caller's own error, as before grouping
                queued.finish(error=exc)
                continue
            head = (doc["seq"], doc["row_digest"])
            docs.append(doc)
            members.append(queued)
        if not docs:
            return
        try:
            if self._devices:
                self._devices.write_rows(docs)  # STORE_UNAVAILABLE when no device took them: nothing written
            try:
                spool.append(docs)
            except EngramError:
                if self._devices:
                    self._devices.abort(self.writer_chain, [d["seq"] for d in docs])
                raise
        except BaseException as exc:
            # Each caller raises an error of its own (one instance raised in several threads
            # would share its traceback).
            code, detail = ((exc.code, exc.detail) if isinstance(exc, EngramError)
                            else (Code.STORE_UNAVAILABLE, f"audit write failed: {type(exc).__name__}"))
            for queued in members:
                queued.finish(error=EngramError(code, detail))
            if not isinstance(exc, EngramError):
                raise
            return
        self._writer_head = head
        for queued, doc in zip(members, docs, strict=True):
            queued.finish(digest=doc["row_digest"])

    def _move_spool_quietly(self) -> None:
        try:
            self._move_spool()
        except EngramError as exc:  # the rows stay durable in the spool; moved later
            log.warning("audit spool not moved: %s", exc.detail)

    def _move_spool(self) -> None:
        """Move the spooled rows into the engine in one transaction; rows already there (moved
        before a crash cut the spool's truncation) are skipped by the engine's key."""
        spool = self._spool
        assert spool is not None
        with self._audit_lock:
            self._move_scheduled = False
            if not spool.pending:
                return
            with self.engine.write(effects=TxEffects(spooled_audit=list(spool.pending))):
                pass
            spool.clear()

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        """The context nonces claimed by calls audited since ``since_ms``: (nonce ref, at_ms),
        from the engine's rows and the spool's."""
        with self.engine.read(snapshot=False) as tx:
            found = tx.recent_context_nonces(since_ms)
        pending = self._spool.pending if self._spool is not None else []
        found += [(d["context_nonce"], int(d["at_ms"])) for d in pending
                  if d.get("context_nonce") and int(d["at_ms"]) >= since_ms]
        return found

    def claim_context_nonce(self, ref: str, expires_at_ms: int) -> bool:
        """Claim a context's nonce where every core of the store sees it: True when it was not
        claimed before. An engine that is the sole writer of its database needs no such claim
        (the process's ledger, seeded from the audit log at open, is exact): its shared state
        (``shared_state.SoleWriterState``) says True."""
        return self.engine.shared.claim_context_nonce(ref, expires_at_ms)

    def claim_context(self, ref: str, expires_at_ms: int, *, usage: UsageRead | None = None) -> ContextClaim:
        """The claim, the host-key trust version and ``usage``'s buckets, in one round trip of the
        engine's (``port.py``)."""
        claimed, version, found = self.engine.shared.claim_context_nonce_and_trust(ref, expires_at_ms, usage=usage)
        return ContextClaim(claimed=claimed, host_keys_version=version, usage=found)

    def host_keys_version(self) -> int | None:
        return self.engine.shared.host_keys_version()

    @contextmanager
    def leader_lease(self, job: str) -> Iterator[bool]:
        """The job's leader lease (``port.py``): held by the sole writer, else the engine's."""
        with self.engine.shared.leader_lease(job) as held:
            yield held

    def page_pins(self, now_ms: Callable[[], int], *, capacity: int = MAX_PINS) -> PinStore:
        """Where search pins are kept: this process's memory, at most ``capacity`` of them, and the
        database too when other cores share it (a cursor from one core pages on another)."""
        return PinStore(now_ms=now_ms, capacity=capacity, shelf=self.engine.shared.pin_shelf())

    def usage_counters(self, now_ms: Callable[[], int]) -> QuotaCounters:
        """The usage counters quotas are decided on: in memory for the sole writer, the database's
        when other cores share it (one quota however a principal's calls are spread)."""
        return QuotaCounters(now_ms, shared=self.engine.shared.shared_usage())

    def audit_spool_state(self) -> tuple[int, int | None]:
        """(audit rows spooled but not yet in the engine, ``at_ms`` of the oldest of them)."""
        pending = self._spool.pending if self._spool is not None else []
        return len(pending), (int(pending[0]["at_ms"]) if pending else None)

    def attach_audit_devices(self, devices: Any) -> None:
        """Stream every audit row written from now on to ``devices`` (``AuditDevices``), fail closed."""
        with self._audit_lock:
            with self.read() as tx:
                heads = tx.audit_heads()
            self._devices = devices
            devices.opened(heads)

    def audit_device_failures(self) -> dict[str, int]:
        """Failed writes per configured audit device since start (empty without devices)."""
        devices = self._devices
        return dict(devices.failures) if devices else {}

    # -- commit hooks (engine.CommitHooks) --------------------------------------------------------------
    def before_flush(self, effects: list[TxEffects]) -> Future[None] | None:
        if self._keys is None or not self._keys.syncs or not any(e.names_new_keys for e in effects):
            return None
        # The key vault's fdatasync (~0.4 ms) runs while the engine executes the statements; the
        # COMMIT waits for it (``prepare``): no row naming a key commits before the key is durable.
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engram-keysync")
        return self._syncer.submit(self._keys.sync)

    def prepare(self, effects: list[TxEffects], tx: AuditWriter, token: Future[None] | None) -> None:
        if token is not None:
            token.result()
        spooled = [d for e in effects for d in e.spooled_audit]
        if spooled:
            tx.insert_audit(spooled, if_absent=True)
        restored = [d for e in effects for d in e.restored_audit]
        if restored:  # verbatim, before the rows chained after them (a restore's own row)
            tx.insert_audit(restored)
        rows = [(e, r) for e in effects for r in e.audit_rows]
        fresh = []
        if rows:
            chains = sorted({scope_chain(r.tenant, r.workspace) for _, r in rows})
            heads = tx.audit_heads(chains)
            for e, r in rows:
                chain = scope_chain(r.tenant, r.workspace)
                doc = audit_doc(r, chain, heads[chain])
                heads[chain] = (doc["seq"], doc["row_digest"])
                e.audit_docs.append(doc)
                fresh.append(doc)
            tx.insert_audit(fresh)
        if self._devices and (restored or fresh):
            # Before COMMIT: a row no device accepted must not become a mutation (fail closed).
            self._devices.write_rows(restored + fresh)

    def committed(self, effects: list[TxEffects], scopes: dict[tuple[str, str], ScopeRow]) -> None:
        changes = [c for e in effects for c in e.changes]
        appended = sorted({c for e in effects for c in e.appended_cursors})
        if changes or scopes:
            with self._publish:
                try:
                    runs = _runs(appended)
                    if self._residency is not None:
                        # A scope not loaded here is loaded whole by its first read: its part of a
                        # commit would make a partial index of it.
                        changes = [c for c in changes if self._loaded_or_unknown(c)]
                        runs = {k: v for k, v in runs.items() if k in self._residency}
                    self._index.apply(changes)
                    if self._scopes is not None:
                        self._scopes.update(scopes)
                    for (t, w), cursors in runs.items():
                        if self._applied.get((t, w), 0) == cursors[0] - 1:  # no other core's event between
                            self._applied[(t, w)] = cursors[-1]
                        if self._residency is not None:
                            self._residency.resized((t, w), self._index.scope_documents(Scope(t, w)))
                except Exception:
                    log.exception("search index change not applied; rebuilding before the next search")
                    self._stale = True
        for e in effects:
            if e.destroyed_slots and self._keys is not None:
                try:
                    self._keys.destroy_many(e.destroyed_slots)
                except OSError:
                    e.key_destruction_outcome = "pending"  # reconcile at next start completes it
                    e.keys_zeroed = False
                    continue
                if not all(self._keys.destruction_complete(g) for g in e.destroyed_generations):
                    e.key_destruction_outcome = "pending"  # copies under retained generations remain

    def rolled_back(self, effects: list[TxEffects]) -> None:
        for e in effects:
            e.audit_docs.clear()

    def commit_unknown(self) -> None:
        with self._publish:
            self._stale, self._scopes = True, None

    def index_current(self) -> bool:
        return not self._stale and not self._rebuilding

    def spooled_audit_heads(self) -> dict[str, tuple[int, str]]:
        """Each chain's head among the spooled rows not yet moved into the engine (none: {})."""
        spool = self._spool
        return chain_heads(spool.pending) if spool is not None and spool.pending else {}

    def key_generation_of(self, slot: int) -> int | None:
        """The KEK generation wrapping ``slot``'s data key (None without a key vault)."""
        return self._keys.generation_of(slot) if self._keys is not None else None

    # -- the search index ---------------------------------------------------------------------------------
    @contextmanager
    def search_index(self, scope: Scope | None = None) -> Iterator[SearchIndex]:
        """The in-memory search index (rebuilt from the engine first if it may be behind), with
        ``scope``'s part loaded when scopes are loaded on first use."""
        key = (scope.tenant, scope.workspace) if scope is not None else None
        for _ in range(8):
            if scope is not None and key is not None and self._residency is not None:
                with self._publish:
                    loaded = key in self._residency and not self._stale
                if not loaded:
                    self._load_scope(scope)
            with self._publish:
                if self._stale:
                    self._reload()
                if key is None or self._residency is None or key in self._residency:
                    if key is not None and self._residency is not None:
                        self._residency.touch(key)
                    yield self._index
                    return
            # Evicted by another scope's load between the two: load it again.
        raise EngramError(Code.STORE_UNAVAILABLE, "the search index budget is too small for the scopes in use")

    def indexed_postings(self, scope: Scope, record_id: str) -> int | None:
        """How many postings the search index holds for a record; None when it does not hold it
        here, without loading its scope: a write that asks under its scope lock (a forget's
        coverage count) must not wait for a whole scope's load there, which stalled every core's
        writes to the scope for seconds at 100k records."""
        key = (scope.tenant, scope.workspace)
        if self._residency is not None:
            with self._publish:
                if self._stale or key not in self._residency:
                    return None
                self._residency.touch(key)
                return self._index.indexed_postings(scope, record_id)
        with self.search_index(scope) as index:
            return index.indexed_postings(scope, record_id)

    def _loaded_or_unknown(self, change: Any) -> bool:
        scope = _scope_of_change(change)
        assert self._residency is not None
        return scope is None or scope in self._residency

    def _load_scope(self, scope: Scope) -> int:
        """Load one scope's index from its sealed projections at one snapshot (outside the
        publish lock: other scopes' reads go on), then evict what the budget no longer holds."""
        key = (scope.tenant, scope.workspace)
        started = time.perf_counter()
        builder = IndexBuilder(sketch_vectors=self._sketch_vectors)
        with self.engine.read(snapshot=True) as etx:
            row = etx.scope(scope)
            head = row.last_cursor if row is not None else 0
            blobs = etx.scope_projection_blobs(scope) if row is not None else []
        for rec, _ in blobs:
            builder.add_row(rec)
        keys = self._record_keys([rec for rec, _ in blobs])
        for rec, sealed in blobs:
            record_key = keys.get(rec.record_id)
            if record_key is not None:  # destroyed by a forget committing now: not indexed
                builder.add_projection(rec.record_id, open_plain(record_key, rec.record_id, sealed))
        built = builder.finish()
        evicted: list[tuple[str, str]] = []
        with self._publish:
            if self._stale:
                self._reload()
            assert self._residency is not None
            if key not in self._residency:  # else another read loaded it meanwhile: keep that one
                self._index.replace_scope(scope, built)
                self._applied[key] = head
                self._residency.loaded(key, self._index.scope_documents(scope))
                evicted = self._residency.victims(keep=key)
                for victim in evicted:
                    self._index.drop_scope(Scope(*victim))
                    self._applied.pop(victim, None)
        if self.observers.on_scope_load is not None:
            self.observers.on_scope_load(time.perf_counter() - started, len(blobs))
        if self.on_scope_refresh is not None:
            self.on_scope_refresh(scope)
        if evicted and self.observers.on_scope_evict is not None:
            self.observers.on_scope_evict(len(evicted))
        return len(blobs)

    def residency(self) -> ResidencyStats | None:
        """The loaded scopes (metrics), or None when every scope is loaded at open."""
        if self._residency is None:
            return None
        with self._publish:
            return self._residency.stats()

    def committed_scope(self, scope: Scope) -> ScopeRow | None:
        """The scope row as of the last commit whose changes the search index holds: the index is
        at least as new as this row, so its ``last_cursor`` can pin a search. Where other cores
        write the same database, the row is read from it and the index caught up to its head
        first (``catch_up``): a read here sees what any core acknowledged before it."""
        if not self.capabilities.sole_writer:
            return self.catch_up(scope)
        with self._publish:
            if self._stale:
                self._reload()
            return self._scopes.get((scope.tenant, scope.workspace)) if self._scopes is not None else None

    def latest_scope(self, scope: Scope) -> ScopeRow | None:
        """The scope row as last committed by any core, without bringing the index to it: a
        write's authorization reads the row alone, so a write on a core another core writes
        beside costs one round trip here instead of a catch-up (a second round trip, the new
        records' keys and indexing them) on every call; reads catch up, several writes at once."""
        if self.capabilities.sole_writer:
            return self.committed_scope(scope)
        return self.engine.scope_now(scope)

    def catch_up(self, scope: Scope) -> ScopeRow | None:
        """The scope row as last committed by any core, with the scope's part of the search
        index brought to its head first: the records the events since the index's cursor named
        are indexed as they are in the same snapshot as the row (``Engine.changes_since``: one
        round trip, the one a read with nothing new makes too); an event that rebuilt or dropped
        the scope's projections reloads the scope. A scope not loaded here yet is loaded whole."""
        key = (scope.tenant, scope.workspace)
        with self._publish:
            if self._stale:
                self._reload()
            known = self._applied.get(key)
        if known is None and self._residency is not None:
            row = self.engine.scope_now(scope)
            if row is not None:
                self._load_scope(scope)  # the whole scope, at a head no older than ``row``
            return row
        applied = known or 0
        found = self.engine.changes_since(scope, applied)
        if not found.events:
            return found.row
        if any(e.operation in SCOPE_WIDE_OPERATIONS for e in found.events):
            with self.engine.read(snapshot=True) as etx:
                events = etx.events(scope, applied + 1, None)
                rows = {r.record_id: r for r in etx.scope_records(scope)}
                touched = list(rows)
                blobs = {rid: b[0] for rid in touched if rid in rows and (b := etx.projection_blob(rid)) is not None}
            self._index_caught_up(scope, touched, rows, blobs, events, applied, dropped=True)
            return found.row
        touched = list(dict.fromkeys(rid for e in found.events for rid in records_of_event(e)))
        self._index_caught_up(scope, touched, found.rows, found.blobs, found.events, applied,
                              dropped=False, keys=found.keys)
        return found.row

    def _index_caught_up(self, scope: Scope, touched: list[str], rows: dict[str, RecordRow],
                         blobs: dict[str, bytes], events: list[Event], applied: int, *, dropped: bool,
                         keys: Mapping[int, WrappedKey] | None = None) -> None:
        """Index ``touched`` records as read (``rows``, ``blobs``: one snapshot that also held
        ``events``; ``keys``: their wrapped data keys where the engine read them too);
        ``dropped``: the scope's projections are replaced by these."""
        changes: list[Any] = [ScopeProjectionsDropped(scope.tenant, scope.workspace)] if dropped else []
        data_keys = self._record_keys([rows[rid] for rid in touched if rid in rows and rid in blobs], stored=keys)
        for rid in touched:
            row, blob = rows.get(rid), blobs.get(rid)
            key_bytes = data_keys.get(rid) if row is not None and blob is not None else None
            if row is None or blob is None or key_bytes is None:
                changes.append(RecordUnindexed(scope.tenant, scope.workspace, rid))
                continue
            projection = open_projection(key_bytes, rid, blob)
            changes.append(RecordIndexed(row, _postings_of(projection)))
            if projection.vector is not None:
                changes.append(VectorIndexed(scope.tenant, scope.workspace, rid, projection.model, projection.vector))
        reached = max((e.cursor for e in events), default=applied)
        key = (scope.tenant, scope.workspace)
        with self._publish:
            if dropped and reached <= self._applied.get(key, 0):
                return  # another read's catch-up put a snapshot at least as new in meanwhile: keep that one
            # What this core committed itself meanwhile is newer than what was read: keep it.
            changes = [c for c in changes if not _older_than_indexed(self._index, c)] if not dropped else changes
            self._index.apply(changes)
            self._applied[key] = max(self._applied.get(key, 0), reached)
        if dropped and self.on_scope_refresh is not None:  # a scope-wide change another core made
            self.on_scope_refresh(scope)

    def index_ready(self) -> bool:
        """The search index is built and current (readiness)."""
        return not self._stale

    def reload_indexes(self, *, key_digests: bool = True) -> None:
        """Rebuild the search index and committed scope rows from the engine (after writes that
        bypassed the kernel); ``key_digests``: the engine's own caches too."""
        self._rebuilding += 1
        try:
            if key_digests:
                self.engine.reload()
            # Writes answered but not in the database yet (DuckDB's intent log) are committed
            # first, outside the publish lock: their engine holds its writer lock while it
            # publishes. None are answered that way again until the rebuild is done.
            self.engine.commit_answered()
            with self._publish:
                self._reload()
        finally:
            self._rebuilding -= 1

    def _reload(self) -> None:
        started = time.perf_counter()
        builder = IndexBuilder(sketch_vectors=self._sketch_vectors)
        with self.engine.index_scan() as scan:
            if self._keys is not None and self._residency is None:
                for values in scan.indexed_rows():
                    builder.add_values(values)
                for record_id, sealed in scan.projection_blobs():
                    rec = builder.row(record_id)
                    if rec is None:
                        continue
                    key = self._record_key(rec)
                    if key is None:  # destroyed with a forget whose commit raced a crash: the body is gone too
                        log.warning("record %s has a projection but no data key; not indexed", record_id)
                        continue
                    builder.add_projection(record_id, open_plain(key, record_id, sealed))
            scopes = scan.scopes()
        index = builder.finish()
        self._index, self._scopes, self._stale = index, scopes, False
        if self._residency is not None:
            self._residency.clear()  # every scope loads again on its first read
            self._applied = {}
        else:
            self._applied = {k: row.last_cursor for k, row in scopes.items()}
        if self.observers.on_index_rebuild is not None:
            self.observers.on_index_rebuild(time.perf_counter() - started, index.document_count())

    def document_count(self) -> int | None:
        """Records the search index holds (None while it is being built)."""
        return self._index.document_count() if not self._stale else None

    # -- keys -------------------------------------------------------------------------------------------------
    def _record_key(self, rec: RecordRow) -> bytes | None:
        if self._keys is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "search projections need the key vault")
        return record_data_key(self._keys, rec)

    def _record_keys(self, recs: list[RecordRow], *, stored: Mapping[int, WrappedKey] | None = None) -> dict[str, bytes]:
        """The data keys of many records at once, by record id (one vault read where it is remote,
        none for those in ``stored``)."""
        if self._keys is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "search projections need the key vault")
        return {rid: key for rid, (_ref, key) in record_data_keys(self._keys, recs, stored=stored).items()}

    def data_key(self, rec: RecordRow) -> bytes:
        """The record's data key, which seals its search projection."""
        key = self._record_key(rec)
        if key is None:
            raise EngramError(Code.BLOB_MISSING, "record data key missing")
        return key

    # -- the store as a whole ---------------------------------------------------------------------------------
    def _require_open(self) -> None:
        if not self._open:
            raise EngramError(Code.STORE_UNAVAILABLE, "store closed")

    def is_open(self) -> bool:
        return self._open and self.engine.is_open()

    def schema_version(self) -> int:
        return self.engine.schema_version()

    def migrate(self) -> list[int]:
        return self.engine.migrate()

    def migration_ledger(self) -> list[dict[str, Any]]:
        return self.engine.migration_ledger()

    def migration_code(self) -> list[dict[str, Any]]:
        return self.engine.migration_code()

    def checkpoint(self) -> None:
        self.engine.checkpoint()

    def analyze(self) -> None:
        self.engine.analyze()

    def describe(self) -> dict[str, Any]:
        return {**self.engine.describe(), "audit_spool_replayed_rows": self.spool_replayed_rows}

    def close(self) -> None:
        if not self._open:
            return
        self._mover.shutdown(wait=True)
        try:
            if self._spool is not None and self._spool.pending:
                self._move_spool()
        except EngramError:
            pass  # still durable in the spool: moved at the next open
        self._open = False
        # An index build in progress (the server builds it after it listens) reads the engine:
        # it finishes before the engine closes (a stop right after a start raced it).
        with self._publish:
            if self._spool is not None:
                self._spool.close()
            if self._devices:
                self._devices.close()
            self.engine.close()
        if self._syncer is not None:
            self._syncer.shutdown()


# Journal operations after which a replica reloads the scope's index rather than single records.
SCOPE_WIDE_OPERATIONS = frozenset({"invalidate_projections", "rebuild_projections"})


class _Queued:
    """A spooled row waiting for its batch: its outcome once the batch is durable or failed."""

    __slots__ = ("row", "done", "digest", "error")

    def __init__(self, row: AuditRow) -> None:
        self.row = row
        self.done = False
        self.digest: str | None = None
        self.error: Exception | None = None

    def finish(self, *, digest: str | None = None, error: Exception | None = None) -> None:
        self.digest, self.error, self.done = digest, error, True


def _postings_of(projection: Projection) -> tuple[Posting, ...]:
    out = []
    for code, (terms, tfs) in sorted(projection.fields.items()):
        name, length = FIELDS[code], int(tfs.sum())
        out += [Posting(int(t), name, int(tf), length) for t, tf in zip(terms.tolist(), tfs.tolist(), strict=True)]
    return tuple(out)


def _scope_of_change(change: Any) -> tuple[str, str] | None:
    """The scope a committed change is about (None: one named by its record alone)."""
    if isinstance(change, RecordIndexed):
        return (change.row.tenant, change.row.workspace)
    if isinstance(change, (RecordUnindexed, VectorIndexed, ScopeProjectionsDropped)):
        return (change.tenant, change.workspace)
    return None


def _older_than_indexed(index: SearchIndex, change: Any) -> bool:
    if not isinstance(change, (RecordIndexed, VectorIndexed)):
        return False
    if isinstance(change, VectorIndexed):
        return False
    held = index.state_cursor_of(Scope(change.row.tenant, change.row.workspace), change.row.record_id)
    return held is not None and held > change.row.state_cursor


def _runs(appended: list[tuple[str, str, int]]) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for t, w, c in appended:
        out.setdefault((t, w), []).append(c)
    return out


if TYPE_CHECKING:  # the kernel is the port: a type checker fails here when it is not (test_type_check.py)
    def _kernel_is_a_store(kernel: StoreKernel) -> Store:
        return kernel

    def _kernel_tx_is_a_tx(tx: KernelTx) -> Tx:
        return tx
