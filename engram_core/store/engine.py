"""The engine port: what a storage engine implements under the store kernel (SPEC §10).

An engine keeps persistence only: rows, the journal, insert-if-absent ledgers
(idempotency, used confirmations, tombstones), record links, the data-key ledger,
sealed projection blobs, audit rows as they are handed to it, trusted host keys and
metadata, with versioned migrations. Everything every engine must do the same way lives
in the kernel above it (``kernel.py``): hash chains and their digests, audit chaining,
the audit spool and devices, sealing and opening projections, the order of key
durability around COMMIT, and the in-memory search index, which the kernel feeds with
committed changes (``changes.py``). Services never see an engine: they see the kernel's
``Store``/``Tx`` (``port.py``).

Three engines implement it: DuckDB (``store/duckdb``, one process, the embedded default),
PostgreSQL (``store/postgres``, several processes over one database) and an in-memory engine
(``store/memory``: no durability, the reference and a test bed). All three pass the store
conformance suite (``store/conformance``, run by ``tests/store/``), which is the executable form
of this page; an engine outside this repository runs it the same way (docs/engines.md).

An engine declares what it is (``EngineCapabilities``: the sole writer of its database or one of
several, whether standalone audit rows are spooled, whether scopes load on first use) and the
kernel reads that; the state several cores share (context-nonce claims, the host-key trust
version, leader leases, the page-pin shelf, usage counters) is the engine's ``shared``
(``SharedState``): ``shared_state.SoleWriterState`` for a sole writer, the database's otherwise.

## Guarantees every engine gives

- **Atomic, durable transactions.** Everything done through one ``EngineTx`` of ``write()``
  commits together or not at all; it is durable when the ``with`` block exits normally (the
  commit hooks' ``committed`` runs after that point, never before). A failure whose commit
  outcome is unknown is raised as ``MUTATION_OUTCOME_UNKNOWN``; any other failure has rolled
  everything back (``STORE_UNAVAILABLE`` when the engine itself failed).
- **Scope serialization.** From a write transaction's first statement about a scope
  ``(tenant, workspace)`` until it commits, no other write transaction, in this process or
  another, changes that scope (DuckDB: one writer at a time; PostgreSQL: the scope row locked
  ``FOR UPDATE`` at first touch). So a check made inside a write transaction (an idempotency
  key absent, a lifecycle state, a family's members, a grant unused) still holds at its
  commit, and each scope's journal cursors are dense and its chains unforked.
- **Insert-if-absent is exact.** ``idempotency_put``, ``use_confirmation`` and the primary
  keys behind them are the last arbiters: a second insert of the same key never commits. An
  engine may keep caches (negative-lookup digests, committed copies of rows), but a cache
  only ever saves a query: a stale or missing entry costs a read of the database, never a
  wrong answer. An engine that is not the only writer of its database (``sole_writer``
  False) therefore keeps no cache of anything another process can change.
- **Reads.** ``read(snapshot=True)`` sees one committed state for its whole block;
  ``read(snapshot=False)`` runs each statement on the latest committed state. Neither sees
  an uncommitted write of another transaction. A write transaction sees its own writes.
- **Audit rows as given.** The kernel chains audit rows; the engine stores the documents
  verbatim and keeps, per chain, the head the next row must follow: ``audit_heads`` inside a
  write transaction returns them locked for that transaction (no other transaction extends
  those chains until it commits).
- **Only what it is given.** Sealed bodies, envelopes and projections are opaque bytes; the
  engine never sees plaintext or keys (data keys live in the key vault; the ledger maps each
  owner to the vault's reference only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import WrappedKey
from engram_core.store.changes import Change
from engram_core.store.port import (
    AuditRow,
    CandidateRow,
    Event,
    HostKeyRow,
    IdempotencyRow,
    KeyDestruction,
    RecordRow,
    ScopeRow,
    SharedPin,
)

if TYPE_CHECKING:
    from engram_core.store.page_pins import PinShelf
    from engram_core.store.usage_counters import SharedUsage, UsageRead

# Usage buckets as ``SharedUsage.usage_buckets`` answers them: (subject, window) -> (start, metric, total).
UsageBuckets = dict[tuple[str, str], list[tuple[int, str, int]]]


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine is, which the kernel reads (nobody else chooses for it).

    ``sole_writer``: no other process writes its database (a fence keeps them out), so the
    kernel's copies of committed state are exact and what cores share lives in this process
    (``shared_state.SoleWriterState``); False: other cores write the same database, the kernel
    asks the engine for scope heads and the engine's ``shared`` is the database's.
    ``spools_audit``: a standalone audit row of its own transaction costs milliseconds here, so
    the kernel appends such rows to a spool file in the core's data directory and moves them in
    by batches (``audit_spool.py``); False: the engine writes each at once.
    ``lazy_scopes``: each scope's search index loads on its first read and the least recently
    used are evicted under a budget (``index_residency.py``): for an engine of several writers,
    whose reads ask the database for the scope head anyway. Only with ``sole_writer`` False.
    ``records_key_generations``: the engine records the KEK generation wrapping a destroyed
    key itself, read in the destroying transaction after the key's ledger row is gone (its
    vault's keys are in its own database), so a rotation on another process cannot re-wrap the
    key after the generation was read: the kernel then passes no generation and asks the vault
    for none. ``holds_key_vault``: the engine keeps the key vault's rows in its database and
    reads records' wrapped keys with them (``ScopeChanges.keys``)."""

    sole_writer: bool
    spools_audit: bool = False
    lazy_scopes: bool = False
    records_key_generations: bool = False
    holds_key_vault: bool = False

    def __post_init__(self) -> None:
        if self.lazy_scopes and self.sole_writer:
            raise ValueError("lazy_scopes is for an engine other cores share (sole_writer False)")


class SharedState(Protocol):
    """The state every core of one store shares, besides its rows (``Engine.shared``).

    Where one process is the sole writer this is that process's memory
    (``shared_state.SoleWriterState``: every claim succeeds, there is no trust version, every
    lease is held, pins and usage counts stay in the kernel's in-memory stores). Where several
    cores share the database it is the database's (``postgres/shared_state.py``), and every
    answer is what all cores see: a claim is refused to the second core that makes it, a lease
    is held by one core at a time, a pin put by one core is found by another."""

    def claim_context_nonce(self, ref: str, expires_at_ms: int) -> bool:
        """Claim a context's nonce for every core: True when none claimed it before."""
        ...

    def claim_context_nonce_and_trust(self, ref: str, expires_at_ms: int, *, usage: UsageRead | None = None,
                                      ) -> tuple[bool, int | None, UsageBuckets | None]:
        """The claim, the host-key trust version (``host_keys_version``) and ``usage``'s buckets
        (None when not asked), in one round trip (``Store.claim_context``)."""
        ...

    def host_keys_version(self) -> int | None:
        """The trust version as last committed by any core (``Store.host_keys_version``); None
        for a sole writer, whose copy of the keys is exact."""
        ...

    def leader_lease(self, job: str) -> AbstractContextManager[bool]:
        """Whether this core holds ``job``'s lease for the block (``Store.leader_lease``)."""
        ...

    def pin_shelf(self) -> PinShelf | None:
        """Where search pins are put besides this process's memory (None: memory alone)."""
        ...

    def shared_usage(self) -> SharedUsage | None:
        """The usage buckets every core adds to (None: this process's counters alone)."""
        ...


class StoreObservers:
    """What operators watch of a store (app/observed_ports.py), handed to the kernel when it is
    built and by the kernel to its engine (``Engine.set_hooks``): one object both report to.
    Each is a callable or None (nothing watches). ``observe`` sets them once a watcher exists."""

    def __init__(self) -> None:
        self.on_commit: Callable[[float, int], None] | None = None  # seconds per COMMIT, transactions
        # Seconds waited for a write transaction's first scope lock and seconds it was held (an
        # engine of scope locks; DuckDB has one writer lock and never calls it).
        self.on_scope_lock: Callable[[float, float], None] | None = None
        self.on_index_rebuild: Callable[[float, int], None] | None = None  # seconds, documents
        self.on_scope_load: Callable[[float, int], None] | None = None  # seconds, records of a cold load
        self.on_scope_evict: Callable[[int], None] | None = None  # scopes evicted

    def observe(self, **callbacks: Callable[..., None] | None) -> None:
        """Set the named observers (a name that is none of them is a TypeError)."""
        for name, callback in callbacks.items():
            if not hasattr(self, name):
                raise TypeError(f"no store observer {name!r}")
            setattr(self, name, callback)


@dataclass(frozen=True)
class ScopeChanges:
    """What a core whose index holds a scope's journal up to a cursor must read to catch up
    (``Engine.changes_since``): all of it as of one committed state."""

    row: ScopeRow | None  # the scope row (None: the scope was never written)
    events: list[Event]  # the journal after the cursor, up to ``row.last_cursor``, in order
    rows: dict[str, RecordRow]  # the records those events name (``records_of_event``) that exist, by id
    blobs: dict[str, bytes]  # the sealed projections of those of them that have one, by record id
    # Their data keys as the key vault stores them, by ref, where the engine holds the vault's
    # rows and read them in the same query (PostgreSQL); empty otherwise: the vault reads them.
    keys: dict[int, WrappedKey] = field(default_factory=dict)


def records_of_event(event: Event) -> list[str]:
    """The records a journal event changed: its target when that is a record, and the record an
    admission created (its body's ``record_id``)."""
    out = [event.target] if event.target.startswith("mem_") else []
    created = event.body.get("record_id") if isinstance(event.body, dict) else None
    if isinstance(created, str) and created.startswith("mem_"):
        out.append(created)
    return out


def read_changes_since(tx: EngineTx, scope: Scope, after: int) -> ScopeChanges:
    """``Engine.changes_since`` from the transaction's own reads (``tx`` a snapshot): for an
    engine whose reads are local calls, or as the reference the one-round-trip versions keep."""
    row = tx.scope(scope)
    if row is None or row.last_cursor <= after:
        return ScopeChanges(row, [], {}, {})
    events = tx.events(scope, after + 1, row.last_cursor)
    touched = list(dict.fromkeys(rid for e in events for rid in records_of_event(e)))
    rows = tx.records(scope, touched)
    blobs = {}
    for rid in touched:
        found = tx.projection_blob(rid) if rid in rows else None
        if found is not None:
            blobs[rid] = found[0]
    return ScopeChanges(row, events, rows, blobs)


@dataclass
class TxEffects:
    """What one write transaction hands the kernel at commit, collected as it runs.

    The kernel fills it through its ``Tx``; the engine carries it to the commit hooks, one per
    transaction (several when the engine commits transactions together, as DuckDB's group
    commit does)."""

    audit_rows: list[AuditRow] = field(default_factory=list)  # chained by the kernel at commit
    restored_audit: list[dict[str, Any]] = field(default_factory=list)  # verbatim documents (restore)
    # Spooled documents moved in (each may be there already: moved before a crash cut the spool).
    spooled_audit: list[dict[str, Any]] = field(default_factory=list)
    audit_docs: list[dict[str, Any]] = field(default_factory=list)  # the chained documents, once chained
    changes: list[Change] = field(default_factory=list)  # for the search index, after commit
    appended_cursors: list[tuple[str, str, int]] = field(default_factory=list)  # journal events it wrote
    names_new_keys: bool = False  # data keys created unsynced: the vault is synced before COMMIT
    destroyed_slots: list[int] = field(default_factory=list)  # zeroed in the vault after COMMIT
    destroyed_generations: list[int | None] = field(default_factory=list)  # the KEKs that wrapped them
    # After COMMIT: "complete" when every destroyed key is zeroed and every generation that wrapped
    # it retired; "pending" until then (docs/admin.md, "Keys").
    key_destruction_outcome: str = "complete"
    keys_zeroed: bool = True  # every destroyed key is gone from this vault (slot zeroed)


class AuditWriter(Protocol):
    """What the kernel's ``prepare`` writes audit rows through: the committing transaction (an
    ``EngineTx``), or, for transactions an engine commits together, what writes for all of them."""

    def audit_heads(self, chains: list[str]) -> dict[str, tuple[int, str]]:
        """As ``EngineTx.audit_heads``."""
        ...

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        """As ``EngineTx.insert_audit``."""
        ...


class CommitHooks(Protocol):
    """The kernel's part of every commit, called by the engine in this order."""

    def before_flush(self, effects: list[TxEffects]) -> Any:
        """The transactions are about to write their rows: start what can run meanwhile (the key
        vault's sync); returns a token for ``prepare``."""
        ...

    def prepare(self, effects: list[TxEffects], tx: AuditWriter, token: Any) -> None:
        """Inside the transaction, just before COMMIT: the audit rows chained and written through
        ``tx``, new data keys durable, audit devices written. Raising rolls everything back."""
        ...

    def committed(self, effects: list[TxEffects], scopes: dict[tuple[str, str], ScopeRow]) -> None:
        """After COMMIT returned: ``scopes`` are the scope rows as committed. Never raises."""
        ...

    def rolled_back(self, effects: list[TxEffects]) -> None:
        """The transactions did not commit (``prepare`` or the engine failed before COMMIT)."""
        ...

    def commit_unknown(self) -> None:
        """COMMIT failed: whether it took effect is unknown; copies of committed state are stale."""
        ...

    def index_current(self) -> bool:
        """The search index holds every change published and no rebuild of it is running. Only
        then may an engine answer a write before its database holds it (DuckDB's intent log): a
        rebuild reads the database, and must find every write whose change it replaces."""
        ...


class EngineTx(Protocol):
    """Persistence inside one transaction. Rows are the frozen dataclasses of ``port.py``."""

    def read_ahead(self, *reads: Callable[[], object]) -> None:
        """See ``port.Tx.read_ahead``."""
        ...

    # -- scopes and the journal -------------------------------------------------------------
    def scope(self, scope: Scope) -> ScopeRow | None:
        """The scope row (activation, tools, authorization epoch, journal head), or None."""
        ...

    def scope_for_update(self, scope: Scope) -> ScopeRow:
        """The scope row, created (not activated, epoch 0, empty journal) when absent; in a write
        transaction the scope is then this transaction's until it commits."""
        ...

    def scopes(self) -> list[ScopeRow]: ...
    def set_activation(self, scope: Scope, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow: ...
    def bump_epoch(self, scope: Scope) -> int:
        """Raise the scope's authorization epoch by one; returns the new epoch."""
        ...

    def insert_event(self, event: Event) -> None:
        """Append a journal event whose cursor is the scope head's + 1 and whose ``prev_digest`` is
        the head's digest (the kernel computed both from ``scope_for_update``), and move the head
        to it."""
        ...

    def set_scope_head(self, scope: Scope, cursor: int, event_digest: str) -> None:
        """Move the journal head past events a bulk loader inserted itself (benchmarks only)."""
        ...

    def events(self, scope: Scope, from_cursor: int, to_cursor: int | None) -> list[Event]: ...
    def event_by_id(self, scope: Scope, event_id: str) -> Event | None: ...
    def restore_scope(self, row: ScopeRow) -> None: ...
    def restore_event(self, e: Event) -> None:
        """Insert a verified event verbatim (restore): the restored scope row carries its head."""
        ...

    # -- idempotency, confirmations, tombstones (insert-if-absent) -------------------------------
    def idempotency_get(self, scope: Scope, principal: str, key: str) -> IdempotencyRow | None: ...
    def idempotency_put(self, scope: Scope, principal: str, key: str, row: IdempotencyRow,
                        at_ms: int) -> None:
        """Record a key's outcome. Callers check ``idempotency_get`` first in the same write
        transaction (scope serialization makes that exact); a second put of one key never commits."""
        ...

    def use_confirmation(self, grant_id: str, scope: Scope, at_ms: int) -> bool:
        """Mark a grant used; False (nothing written) when it was used before."""
        ...

    def add_tombstone(self, scope: Scope, payload_digest: str, record_id: str, cursor: int,
                      at_ms: int) -> None: ...
    def tombstoned(self, scope: Scope, payload_digest: str) -> bool: ...
    def tombstone_rows(self) -> list[dict[str, Any]]: ...

    # -- candidates and records ---------------------------------------------------------------
    def insert_candidate(self, row: CandidateRow) -> None: ...
    def candidate(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        """The candidate if it is in this scope (another scope's is None, as an unknown id)."""
        ...

    def candidates_in_state(self, scope: Scope, state: str) -> list[CandidateRow]: ...
    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None = None,
                            drop_envelope: bool = False) -> None: ...
    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None: ...
    def scrub_candidate_facts(self, candidate_id: str) -> None:
        """Replace the candidate's ``facts`` with an empty object (``{}``) in this transaction:
        its sizes, family refs, findings and retention are derived from its content, and nothing
        content-derived outlives a forget, withdrawal or rejection (issue 26.7). The candidate's
        control columns (state, cursor, trust class, decision) stay."""
        ...

    def insert_record(self, row: RecordRow) -> None: ...
    def record(self, scope: Scope, record_id: str) -> RecordRow | None:
        """The record if it is in this scope (another scope's is None, as an unknown id)."""
        ...

    def records(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]: ...
    def scope_records(self, scope: Scope, states: tuple[str, ...] | None = None) -> list[RecordRow]: ...
    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None:
        """``successor_id``: None keeps it, "" clears it, a value sets it; ``drop_body`` removes the
        sealed body in the same write."""
        ...

    def set_record_trust_class(self, record_id: str, trust_class: str) -> None: ...
    def payload_standing(self, scope: Scope, payload_digest: str) -> tuple[str | None, bool]:
        """(the earliest-admitted current record with this payload or None, whether this payload
        was forgotten in the scope)."""
        ...

    # -- record links ---------------------------------------------------------------------------
    def add_record_links(self, scope: Scope, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None: ...
    def drop_record_links(self, record_id: str) -> None: ...
    def family_members(self, scope: Scope, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]: ...
    def derivatives(self, scope: Scope, source_id: str) -> list[RecordRow]: ...

    # -- the data-key ledger (the key vault holds the keys) ---------------------------------------
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None: ...
    def data_key_slot(self, owner: str) -> int | None: ...
    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None,
                      generation: int | None = None) -> int | None:
        """Remove ``owner``'s ledger row and record its destruction (with the KEK generation that
        wrapped the key: ``generation``, or, when None and ``records_key_generations``, the one
        the engine reads itself); returns its slot (None: it had no live key). ``slot``: the
        caller already knows it (no read)."""
        ...

    def live_key_slots(self) -> dict[int, str]: ...
    def key_destruction(self, owner: str) -> KeyDestruction | None: ...
    def key_destructions(self) -> list[KeyDestruction]: ...
    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None: ...

    # -- sealed projections (opaque blobs) ----------------------------------------------------------
    def put_projection(self, scope: Scope, record_id: str, sealed: bytes, *, new: bool) -> None:
        """Store a record's sealed projection; ``new``: the record was inserted by this transaction."""
        ...

    def delete_projection(self, record_id: str) -> None: ...
    def projection_blob(self, record_id: str) -> tuple[bytes, RecordRow] | None: ...
    def scope_projection_blobs(self, scope: Scope) -> list[tuple[RecordRow, bytes]]: ...
    def update_projection_blobs(self, blobs: list[tuple[str, bytes]]) -> None: ...
    def drop_scope_projections(self, scope: Scope) -> None: ...

    # -- audit rows -----------------------------------------------------------------------------------
    def audit_heads(self, chains: list[str]) -> dict[str, tuple[int, str]]:
        """Each chain's head (last seq, its row digest; (0, GENESIS) for a new chain), locked for
        this write transaction."""
        ...

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        """Store chained audit documents verbatim (each follows its chain's head, in order);
        ``if_absent``: a document whose (chain, seq) is stored already is skipped."""
        ...

    def audit_rows(self, scope: Scope | None, from_seq: int,
                   to_seq: int | None) -> list[dict[str, Any]]:
        """Audit documents (optionally of one scope's rows), ordered by chain then seq."""
        ...

    def all_audit_heads(self) -> dict[str, tuple[int, str]]:
        """Every chain's head as this transaction sees it."""
        ...

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        """(``context_nonce``, ``at_ms``) of the audit rows written since ``since_ms`` that name one."""
        ...

    def put_page_pin(self, pin: SharedPin) -> None:
        """A search pin where every core reads it (``SharedState.pin_shelf``), written with this
        transaction (a standalone audit row's, where the engine spools no rows). Only asked of an
        engine of several writers; a sole writer's raises ValueError."""
        ...

    # -- trusted host keys, metadata, the store as a whole --------------------------------------------
    def trusted_host_keys(self) -> list[tuple[str, str]]: ...
    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        """Store the key if its id is not stored yet (a stored key's binding is left as it is); a key
        stored so has the default binding, which serves nothing: no tenants, not all tenants, no
        maintenance scopes."""
        ...

    def host_key_rows(self) -> list[HostKeyRow]:
        """Every trusted host key with its binding (migration 13: ``tenants`` and
        ``maintenance_scopes`` as stored lists, ``all_tenants`` a boolean), by key id."""
        ...

    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        """Insert the key with ``row``'s binding, or, when its id is stored already, replace that key's
        binding (tenants, all tenants, maintenance scopes) and keep its PEM and ``added_at_ms``."""
        ...

    def remove_trusted_host_key(self, key_id: str) -> bool: ...
    def meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def meta_with_prefix(self, prefix: str) -> dict[str, str]: ...
    def is_empty(self) -> bool:
        """Nothing but trusted host keys and metadata was ever written (a restore target)."""
        ...

    def schema_version(self) -> int: ...


class IndexScan(Protocol):
    """One consistent snapshot of what the search index is built from."""

    def indexed_rows(self) -> Iterator[tuple[Any, ...]]:
        """The rows (``RecordRow`` field order) of records that have a projection."""
        ...

    def projection_blobs(self) -> Iterator[tuple[str, bytes]]:
        """(record id, sealed projection) of every projection, in any order."""
        ...

    def scopes(self) -> dict[tuple[str, str], ScopeRow]: ...


class Engine(Protocol):
    """A storage engine: transactions, migrations, and the scans the kernel builds from.

    Everything the kernel asks of an engine is declared here (a static type checker proves it:
    tests/unit/test_type_check.py)."""

    @property
    def capabilities(self) -> EngineCapabilities:
        """What the engine is (sole writer or one of several, spool, lazy scopes)."""
        ...

    @property
    def shared(self) -> SharedState:
        """The state the store's cores share (``SharedState``)."""
        ...

    def set_hooks(self, hooks: CommitHooks, observers: StoreObservers) -> None:
        """The kernel's commit hooks, and the observers the engine reports commits and scope
        locks to (``StoreObservers.on_commit``, ``on_scope_lock``); called once, by the kernel."""
        ...

    def reload(self) -> None:
        """Rebuild the engine's own caches (negative-lookup digests, committed copies) from its
        database, after writes that bypassed it; nothing where it keeps none."""
        ...

    def write(self, *, batched: bool = False, effects: TxEffects,
              scope: Scope | None = None) -> AbstractContextManager[EngineTx]:
        """A read-write transaction (see the guarantees above); ``batched``: the engine may commit
        it together with other batched transactions, each member's ``effects`` handed to the
        hooks; a failure of the shared commit is raised from every member's ``with``. ``scope``:
        the scope a batched transaction writes (an engine may batch by scope)."""
        ...

    def read(self, *, snapshot: bool = True, as_writer: bool = False) -> AbstractContextManager[EngineTx]: ...

    def commit_answered(self) -> None:
        """Commit the writes answered before the database held them (DuckDB's intent log); an
        engine that answers at COMMIT has none."""

    def in_write(self) -> bool:
        """This thread is inside a write transaction."""
        ...

    def index_scan(self) -> AbstractContextManager[IndexScan]: ...

    def scope_now(self, scope: Scope) -> ScopeRow | None:
        """The scope row as last committed by anyone (a query unless ``sole_writer``)."""
        ...

    def changes_since(self, scope: Scope, after: int) -> ScopeChanges:
        """The scope row as last committed by anyone, with the journal events after cursor
        ``after`` up to its head and the current rows and sealed projections of the records they
        name, all from one snapshot (``read_changes_since`` is the reference): so a core whose
        index holds the journal up to ``after`` catches up to exactly the head it answers from.
        With nothing after ``after``, only the row. An engine over a network answers it in one
        round trip: it is asked before every read of a scope another process may write."""
        ...

    def migrate(self) -> list[int]: ...
    def migration_ledger(self) -> list[dict[str, Any]]: ...
    def migration_code(self) -> list[dict[str, Any]]: ...
    def schema_version(self) -> int: ...
    def checkpoint(self) -> None: ...
    def analyze(self) -> None:
        """The planner statistics, refreshed after a bulk change (``Store.analyze``)."""
        ...
    def describe(self) -> dict[str, Any]:
        """What the start-up summary says of the store: engine, location, migrations applied at
        open, rows by kind."""
        ...

    def is_open(self) -> bool: ...
    def close(self) -> None: ...


