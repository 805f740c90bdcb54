"""The Store port: what core services need from storage, whatever engine keeps it.

Services open a transaction (``store.write()`` / ``store.read()``) and call
domain methods on it. Everything in one ``write()`` block commits atomically
or not at all (SPEC §7: effect, journal event, idempotency outcome, audit row
and projections in one transaction), and is durable when the block exits. A
write transaction holds each scope it touches from its first statement about
it until it commits, against writers in this process and in others (engines
with several writers lock the scope row), so what it checked still holds at
its commit. Services import this module (and the shared ``chain``,
``projection`` modules), never an engine: tests/unit/test_layering.py fails if
one does. The store kernel (``kernel.py``) implements it over any engine
(``engine.py``, whose docstring is the engines' contract); the store
conformance suite (``tests/store/``) proves both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engram_core.contract.scope import Scope
from engram_core.store.projection import Projection

if TYPE_CHECKING:
    from engram_core.store.usage_counters import UsageRead


@dataclass(frozen=True)
class ScopeRow:
    tenant: str
    workspace: str
    activated: bool
    tools: tuple[str, ...]
    authorization_epoch: int
    last_cursor: int
    last_event_digest: str


@dataclass(frozen=True)
class Event:
    tenant: str
    workspace: str
    cursor: int
    event_id: str
    operation: str
    target: str
    from_state: str
    to_state: str
    at_ms: int
    body: dict[str, Any]
    prev_digest: str
    event_digest: str


@dataclass(frozen=True)
class CandidateRow:
    candidate_id: str
    tenant: str
    workspace: str
    principal: str
    agent_id: str
    session: str
    state: str
    payload_digest: str
    record_digest: str
    trust_class: str
    facts: dict[str, Any]
    sealed_envelope: bytes | None
    captured_at_ms: int
    cursor: int
    decision: dict[str, Any] | None = None
    key_slot: int | None = None  # the vault slot of the candidate's data key (None: look it up in data_keys)


@dataclass(frozen=True, slots=True)
class RecordRow:
    record_id: str
    tenant: str
    workspace: str
    candidate_id: str
    record_digest: str
    payload_digest: str
    state: str
    trust_class: str
    principal: str
    agent_id: str
    valid_t: int
    valid_t_end: int | None
    expires_at_ms: int | None
    derivative_rule: str
    accepted_at_ms: int
    accepted_cursor: int
    state_cursor: int
    successor_id: str | None
    sealed_body: bytes | None
    key_slot: int | None = None  # the vault slot of the record's data key (None: look it up in data_keys)
    # The host-bound session its candidate was captured in, and the core's clock at that capture
    # (migration 12; None for records restored from older backups): search neighbours (v4).
    session: str | None = None
    captured_at_ms: int | None = None


@dataclass(frozen=True)
class IdempotencyRow:
    tool: str
    target: str
    request_digest: str
    outcome: dict[str, Any]


@dataclass(frozen=True)
class KeyDestruction:
    """A data key's destruction: when, why, and the KEK generation that wrapped it then (its
    destruction is complete once that generation and every one before it retired)."""

    owner: str
    at_ms: int
    reason: str
    generation: int | None


@dataclass(frozen=True)
class LexicalHit:
    record_id: str
    lexical: float
    valid_t: int


@dataclass(frozen=True)
class LexicalStats:
    """BM25 corpus statistics of one scope for one query (pinned by search paging). ``weights``:
    the query weight of each term that does not weigh 1 (the thesaurus's related terms,
    ``ranking.Expansion``); a term's BM25 contribution is multiplied by it."""

    docs: int
    avg_len: dict[str, float]
    df: dict[int, int]
    weights: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LexicalQuery:
    """One BM25F ranking of a scope's records (``SearchIndex.rank``, through ``Tx.rank_lexical``):
    the pinned statistics, the profile's field weights and BM25 parameters, the instant and the
    journal cursor eligibility is read at, and the page. ``best_bm25`` None: normalize to this
    snapshot's best hit and report it (a first page); later pages pass the pinned value and
    ``after``, the previous page's last (score, valid_t, record_id). ``window``: a valid-time
    window the query named, closeness to which replaces recency. ``neighbours`` (span, weight,
    within_ms, session_ms): what each record's best eligible neighbour lends its BM25."""

    stats: LexicalStats
    weights: dict[str, float]
    k1: float
    b: float
    now_ms: int
    half_life_ms: int
    lexical_weight: float
    max_accepted_cursor: int
    best_bm25: float | None
    after: tuple[float, int, str] | None
    limit: int
    window: tuple[int, int] | None = None
    neighbours: tuple[int, float, int, int] | None = None


@dataclass(frozen=True)
class LexicalPage:
    """One page of lexical ranking: eligible candidate count, (record_id, score, valid_t) rows,
    and the best BM25 of the snapshot the scores are normalized to (with what neighbours lend);
    ``own_best_bm25``: the best eligible record's BM25 of its own terms (the query relevance's)."""

    total: int
    rows: list[tuple[str, float, int]]
    best_bm25: float
    own_best_bm25: float = 0.0


@dataclass(frozen=True)
class SharedPin:
    """A search pin as every core reads it (``page_pins.PinStore``): its id, scope, its JSON
    sealed under a key only the cursor carries (``page_pins.seal_pin``), and expiry."""

    pin_id: str
    tenant: str
    workspace: str
    pin: bytes
    expires_at_ms: int


@dataclass(frozen=True)
class AuditRow:
    at_ms: int
    audit_id: str
    tenant: str
    workspace: str
    principal: str
    agent_id: str
    operation: str
    outcome: str
    target_digest: str
    decisions: list[dict[str, Any]] = field(default_factory=list)
    # The claimed nonce of the call's context (context_nonces.nonce_ref), "" when it claimed none:
    # what lets a restarted core refuse a context used before the restart.
    context_nonce: str = ""


@dataclass(frozen=True)
class HostKeyRow:
    """A trusted host key as stored, with its binding (migration 13; issue 26.3)."""

    key_id: str
    public_key_pem: str
    added_at_ms: int
    tenants: tuple[str, ...]
    all_tenants: bool
    maintenance_scopes: tuple[str, ...]


@dataclass(frozen=True)
class ContextClaim:
    """A context nonce claimed where every core of the store sees it (``Store.claim_context``),
    and the host-key trust version the same statement read."""

    claimed: bool  # False: claimed before, on this core or another
    # The store's trust version (``Store.host_keys_version``) as of the claim; None when this
    # process is the store's sole writer (its copy of the trusted keys is then exact).
    host_keys_version: int | None
    # The usage buckets the claim was asked to read with it (``usage_counters.UsageRead``), as
    # ``SharedUsage.usage_buckets`` answers; None when it was not asked, or by the sole writer.
    usage: dict[tuple[str, str], list[tuple[int, str, int]]] | None = None


class Tx(Protocol):
    # Slots of data keys destroyed in this transaction; the store zeroes them in the key vault
    # once it commits (SPEC §10 crypto-shredding), and ``key_destruction_outcome`` then says
    # whether that happened ("complete") or is left to the next start's reconciliation ("pending").
    destroyed_slots: list[int]
    key_destruction_outcome: str

    @property
    def keys_zeroed(self) -> bool:
        """After the commit: every data key this transaction destroyed is gone from the live
        vault (its slot zeroed), whatever older KEK generations still wrap. A forget answers its
        projection invalidation "complete" on it: what the body and projection were sealed under
        is gone."""

    def read_ahead(self, *reads: Callable[[], object]) -> None:
        """A hint: ``reads`` (calls of this transaction's read methods, e.g. ``lambda:
        tx.candidate(scope, cid)``) are about to be made. An engine that reads over a network may
        send them now, together with whatever it holds back (its scope lock: one round trip for
        all), and answer each of those calls, once, with what it got. The answer is the one the
        call would have had at this point of the transaction, so a caller reads ahead only what
        its own writes before the call cannot change. Reads only: nothing that writes. An engine
        that reads locally does nothing."""
        ...

    # scopes and cursors
    def scope(self, scope: Scope) -> ScopeRow | None:
        """The scope row (activation, tools, authorization epoch, journal head) as this transaction sees it, or None."""
        ...
    def set_activation(self, scope: Scope, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        """Turn memory on or off for a scope and set its tools (creating the scope row); the new row."""
        ...
    def bump_epoch(self, scope: Scope) -> int:
        """Raise the scope's authorization epoch (revocation); the new epoch. Contexts and grants of older epochs are refused from the commit on."""
        ...
    def append_event(
        self, scope: Scope, *, event_id: str, operation: str, target: str,
        from_state: str, to_state: str, at_ms: int, body: dict[str, Any],
    ) -> Event:
        """Append a journal event at the scope's next cursor, chained to the previous event's digest (the store computes both under its hold on the scope: cursors stay dense under concurrent writers anywhere); the event as stored."""
        ...
    def events(self, scope: Scope, from_cursor: int, to_cursor: int | None) -> list[Event]:
        """The scope's events with ``from_cursor <= cursor <= to_cursor`` (None: to the head), by cursor."""
        ...
    def scopes(self) -> list[ScopeRow]:
        """Every scope row, by tenant and workspace."""
        ...
    def event_by_id(self, scope: Scope, event_id: str) -> Event | None:
        """The scope's event with this id, or None."""
        ...
    # idempotency and confirmations
    def idempotency_get(self, scope: Scope, principal: str, key: str) -> IdempotencyRow | None:
        """The stored outcome of this key for this principal in the scope, or None. In a write transaction exact at its commit (the scope is held); elsewhere the latest committed."""
        ...
    def idempotency_put(self, scope: Scope, principal: str, key: str, row: IdempotencyRow, at_ms: int) -> None:
        """Record a key's outcome in the effect's transaction. A second put of one key never commits (the engine's unique key); callers ``idempotency_get`` first in the same write transaction."""
        ...
    def use_confirmation(self, grant_id: str, scope: Scope, at_ms: int) -> bool:
        """Spend a confirmation grant: False (nothing written) when it was spent before, by any transaction that committed or by this one."""
        ...
    # candidates
    def insert_candidate(self, row: CandidateRow) -> None:
        """Store a new pending candidate (control row and sealed envelope)."""
        ...
    def candidate(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        """The candidate if it is in this scope (another scope's reads as unknown: None)."""
        ...
    def candidates_in_state(self, scope: Scope, state: str) -> list[CandidateRow]:
        """The scope's candidates in ``state``, by capture cursor."""
        ...
    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None = None, drop_envelope: bool = False) -> None:
        """Move a candidate to ``state``; ``decision`` records the admission decision; ``drop_envelope`` removes its sealed envelope in the same write."""
        ...
    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None:
        """A host verifier's attestation of a pending candidate."""
        ...
    def scrub_candidate_facts(self, candidate_id: str) -> None:
        """Empty a candidate's facts (sizes, family refs, findings, retention: all derived from its
        content) once the content is gone: withdrawn, rejected, or its record forgotten (issue 26.7)."""
        ...
    # data keys (slots live in the KeyVault; the store maps owners to slots)
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None:
        """Name ``owner``'s data key in the ledger (its vault reference); the store makes the key durable before this transaction commits."""
        ...
    def data_key_slot(self, owner: str) -> int | None:
        """The vault reference of ``owner``'s live data key, or None."""
        ...
    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None,
                      generation: int | None = None) -> int | None:
        """Destroy ``owner``'s data key (its slot is zeroed after commit); returns the slot or None.
        ``slot``: the caller knows it (a record row's key slot, or one read before a state check
        made under the writer lock that a dropped key would have failed), so it is not read."""
        ...
    def live_key_slots(self) -> dict[int, str]:
        """Every live data key: vault reference -> owner."""
        ...
    def key_destruction(self, owner: str) -> KeyDestruction | None:
        """When and why ``owner``'s key was destroyed, and the KEK generation that wrapped it; None if it was not."""
        ...
    # records
    def insert_record(self, row: RecordRow) -> None:
        """Store an admitted record (control row and sealed body)."""
        ...
    def record(self, scope: Scope, record_id: str) -> RecordRow | None:
        """The record if it is in this scope (another scope's reads as unknown: None). Without a snapshot, the latest committed row."""
        ...
    def records(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]:
        """These records' rows in the scope (ids of other scopes are left out)."""
        ...
    def scope_records(self, scope: Scope, states: tuple[str, ...] | None = None) -> list[RecordRow]:
        """The scope's records (optionally only those in ``states``), by admission cursor."""
        ...
    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None:
        """Move a record to ``state`` at ``state_cursor``; ``successor_id`` None keeps it, "" clears it; ``drop_body`` removes the sealed body in the same write. Searches see it once this commits."""
        ...
    def set_record_trust_class(self, record_id: str, trust_class: str) -> None:
        """A host verifier's attestation (or its revocation) of a record."""
        ...
    def payload_standing(self, scope: Scope, payload_digest: str) -> tuple[str | None, bool]:
        """(the earliest-admitted current record with this payload or None, whether this payload was forgotten in the scope)."""
        ...
    # record links: reconciliation families and derivative sources (identifiers and labels only)
    def add_record_links(self, scope: Scope, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None:
        """The record's reconciliation families (with its primary component's kind) and its derivative sources: identifiers and labels only."""
        ...
    def drop_record_links(self, record_id: str) -> None:
        """A tombstoned record names no family and derives from nothing any more."""
        ...
    def family_members(self, scope: Scope, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]:
        """Records in ``states`` sharing a family with ``family_refs``: (row, primary kind, shared family refs sorted), by record id."""
        ...
    def derivatives(self, scope: Scope, source_id: str) -> list[RecordRow]:
        """Records of the scope whose citations name ``source_id`` as their source, by record id."""
        ...
    # tombstone ledger
    def add_tombstone(self, scope: Scope, payload_digest: str, record_id: str, cursor: int, at_ms: int) -> None:
        """Ledger a forgotten payload (forgotten-content protection, SPEC §5)."""
        ...
    def tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        """Whether this payload was forgotten in the scope."""
        ...
    # projections
    def index_record(self, scope: Scope, record_id: str, fields: dict[str, Counter[int]],
                     vector: tuple[str, list[float]] | None = None) -> None:
        """The search projection of an accepted record (after ``insert_record`` in the same transaction): postings and vector sealed under the record's data key before the engine sees them; searches see them once this commits."""
        ...
    def unindex_record(self, scope: Scope, record_id: str) -> int:
        """Delete the record's sealed projection (forget); how many postings it held: the search index's count, or, where this process's index does not hold the record (its scope not loaded here, or behind another core's writes), the sealed projection's. Never loads a scope."""
        ...
    def lexical_stats(self, scope: Scope, terms: list[int]) -> LexicalStats:
        """BM25 statistics of ``terms`` in the scope (search pins them with its first page)."""
        ...
    def rank_lexical(self, scope: Scope, query: LexicalQuery) -> LexicalPage:
        """BM25F ranking of the scope's records eligible at ``query.now_ms`` (``SearchIndex.rank``)."""
        ...
    def rank_vectors(
        self, scope: Scope, model: str, vector: list[float], *, now_ms: int,
        max_accepted_cursor: int, min_similarity: float, limit: int,
        neighbours: tuple[int, float, int, int] | None = None,
    ) -> list[tuple[str, float, int]]:
        """Nearest eligible records by cosine similarity (``SearchIndex.nearest``)."""
        ...
    # audit log
    def append_audit(self, row: AuditRow) -> str:
        """The transaction's audit row: it takes its place in its scope's audit chain when the transaction commits (and goes to the audit devices just before); returns ""."""
        ...
    def audit_rows(self, scope: Scope | None, from_seq: int, to_seq: int | None) -> list[dict[str, Any]]:
        """Audit documents (optionally only those about one scope), ordered by chain then seq;
        ``from_seq``/``to_seq`` bound each chain's seq."""
        ...
    def audit_heads(self) -> dict[str, tuple[int, str]]:
        """Every audit chain's head (last seq, its row digest) as this transaction sees it."""
        ...
    # trusted host keys and store metadata
    def trusted_host_keys(self) -> list[tuple[str, str]]:
        """The host keys the store trusts (key id, public PEM), by key id."""
        ...
    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        """Trust a host key (again: nothing changes); a key first stored so serves nothing until bound."""
        ...
    def remove_trusted_host_key(self, key_id: str) -> bool:
        """Stop trusting a host key; False when it was not trusted."""
        ...
    def host_key_rows(self) -> list[HostKeyRow]:
        """The trusted host keys with what each serves (tenants, all tenants, maintenance scopes), by key id."""
        ...
    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        """Trust the key with this binding, replacing the binding of one already stored."""
        ...
    def meta(self, key: str) -> str | None:
        """A metadata value, or None."""
        ...
    def set_meta(self, key: str, value: str) -> None:
        """Set a metadata value."""
        ...
    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        """Every metadata entry whose key starts with ``prefix``."""
        ...
    # maintenance (SPEC §12): projections, backup and restore
    def drop_projections(self, scope: Scope) -> dict[str, int]:
        """Delete every sealed projection of a scope (invalidation); what they held."""
        ...
    def projection(self, record_id: str) -> Projection | None:
        """The record's search projection opened with its data key, or None."""
        ...
    def reseal_projections(self, scope: Scope,
                           rewrite: Callable[[RecordRow, Projection], Projection | None]) -> int:
        """Replace each projection of a scope with ``rewrite(record, projection)`` (None: keep it); how many changed. The caller reloads the search index after the commit."""
        ...
    def projection_counts(self, scope: Scope) -> dict[str, int]:
        """Projections, postings and vectors the scope's sealed projections hold (opens them: maintenance only)."""
        ...
    def is_empty(self) -> bool:
        """Nothing but trusted host keys and metadata was ever written (a restore target)."""
        ...
    def schema_version(self) -> int:
        """The schema version this engine writes (a backup names it; restore requires the same)."""
        ...
    def tombstone_rows(self) -> list[dict[str, Any]]:
        """Every tombstone ledger row (backup)."""
        ...
    def key_destructions(self) -> list[KeyDestruction]:
        """Every key destruction (backup, key-status)."""
        ...
    def restore_scope(self, row: ScopeRow) -> None:
        """Insert a verified scope row verbatim (restore)."""
        ...
    def restore_event(self, e: Event) -> None:
        """Insert a verified journal event verbatim (restore); the restored scope row carries its head."""
        ...
    def restore_audit_row(self, doc: dict[str, Any]) -> None:
        """Insert a verified audit document verbatim (restore)."""
        ...
    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None:
        """Record a key destruction verbatim (restore)."""
        ...


class Store(Protocol):
    def write(self, *, batched: bool = False, scope: Scope | None = None) -> AbstractContextManager[Tx]:
        """A serialized read-write transaction; durable when the ``with`` block exits normally.
        ``batched``: the engine may commit it together with other batched transactions (group
        commit); what it wrote becomes visible to others and durable together with them, and a
        failure of the shared commit is raised from the ``with`` of every member. ``scope``: the
        one scope a batched transaction writes, which an engine may batch by
        (PostgreSQL: the transactions of one scope queue on its lock anyway)."""
        ...

    def read(self, *, snapshot: bool = True, as_writer: bool = False) -> AbstractContextManager[Tx]:
        """A consistent read-only snapshot, or (``snapshot=False``) statements that each read
        the latest committed state. ``as_writer`` (with ``snapshot=False``): the latest state as
        the writer sees it, every acknowledged write included, for a write's checks made before
        its transaction; an engine whose acknowledgement is its commit reads as without it
        (DuckDB: writes acknowledged from its intent log, not yet committed, are read through
        the writer's open batch instead of being committed first)."""
        ...

    def append_audit(self, row: AuditRow, *, page_pins: Sequence[SharedPin] = ()) -> str:
        """Audit a call that changed nothing, in its own durable transaction. ``page_pins``:
        search pins to put where every core reads them (``PinStore.put(hold=...)``), written
        with the row (on PostgreSQL in its transaction: no round trip of their own) and, like
        it, before the call answers; only where pins are shared (``page_pins``)."""
        ...

    # Set by a service that keeps scope state in memory (services/projection_status.py): called,
    # outside any transaction, when this core's copy of a scope may have missed a scope-wide change
    # another core made (the scope's index loaded afresh, or caught up past an invalidation or a
    # rebuild of its projections), so that the service reads that scope's state again. Never
    # called where one core is the only writer.
    on_scope_refresh: Callable[[Scope], None] | None

    def page_pins(self, now_ms: Callable[[], int], *, capacity: int = ...) -> Any:
        """Where search pins are kept (``store/page_pins.py`` ``PinStore``): shared by every core
        of a store several share. ``capacity``: pins kept in memory at most (``MAX_PINS``)."""
        ...

    def usage_counters(self, now_ms: Callable[[], int]) -> Any:
        """The counters quotas are decided on (``store/usage_counters.py``): shared likewise."""
        ...

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        """The context nonces claimed by calls audited since ``since_ms`` (nonce ref, at_ms)."""
        ...

    def claim_context_nonce(self, ref: str, expires_at_ms: int) -> bool:
        """Claim a context's nonce where every core of the store sees it; False: claimed before."""
        ...

    def claim_context(self, ref: str, expires_at_ms: int, *, usage: UsageRead | None = None) -> ContextClaim:
        """``claim_context_nonce`` and ``host_keys_version`` in one statement (one round trip on an
        engine several cores share; nothing asked of the sole writer's). What a call that spends
        its context uses: the trust version it returns is at least as new as every host-key
        change acknowledged before the claim began, on any core. ``usage``: the call's read of
        the shared usage counts (``QuotaCounters.begin_read``), made and its adds sent in the
        same round trip (``ContextClaim.usage``), so the call's quota check costs no round trip
        of its own; the adds commit in a transaction of their own, ahead of the claim's. When
        this raises, the caller re-queues the adds (a failure after they committed may count
        them twice: the counts are soft)."""
        ...

    def host_keys_version(self) -> int | None:
        """The trust version: a counter the store moves in the same transaction as every change
        to the trusted host keys (one trusted, re-bound or untrusted, by any core, a restore
        too). None when this process is the store's sole writer: its own changes update its copy
        of the keys, and nobody else changes them. Where several cores share the store, one
        statement reading the latest committed value: a core whose copy of the keys was loaded
        at an older version reloads it before it trusts a context (docs/security.md, "Host keys
        on several cores")."""
        ...

    def leader_lease(self, job: str) -> AbstractContextManager[bool]:
        """Whether this core holds ``job``'s leader lease, for the ``with`` block: the block runs
        one tick of a job that must run on one core at a time across every core of the store
        (``services/keyring.py``'s rotation and retirement), and does its work only when the
        value is True.

        ``job``: a stable name of the job (each job has a lease of its own). Never blocks: a
        core that does not hold the lease learns so at once (False) and tries again at its next
        tick. The sole writer of its store holds every lease (True): no other process opens its
        database. Where several cores share the store, the lease is the engine's (PostgreSQL: a
        ``pg_try_advisory_lock`` on a session of its own, held from the tick that took it until
        that session ends): one core holds it at a time, keeps it from tick to tick while its
        session lives, and loses it when its process dies or its session is cut (then another
        core takes it at its next tick). A lease only keeps a job from running twice at once in
        normal operation; a tick that outlives a cut session can overlap the next leader's, so
        every job stays correct (if wasteful) when two ticks overlap. The lease is the
        process's, not a thread's: a job runs its ticks on one thread of its own."""
        ...

    def committed_scope(self, scope: Scope) -> ScopeRow | None:
        """The scope row as of the last commit whose changes the search index holds, for a read
        that answers from the index (a search): the index is brought to the row's head first
        where other processes write the store, so the read sees every mutation any core
        acknowledged before it began. Costs a round trip there, and more when there is news."""
        ...

    def latest_scope(self, scope: Scope) -> ScopeRow | None:
        """The scope row as last committed by any core, for a decision that reads the row alone
        (a write's authorization: activation, tools and the revocation epoch) and not the index.
        Never older than ``committed_scope`` would answer; the search index may be behind it
        (the next read that answers from the index catches up, several writes at once). Where
        one process writes, the same as ``committed_scope``."""
        ...

    def is_open(self) -> bool: ...

    def describe(self) -> dict[str, Any]:
        """What start-up reports of the store: engine, location, migrations applied at open, rows
        by kind, audit rows replayed from the spool."""
        ...

    def document_count(self) -> int | None:
        """Records the search index holds (None while it is being built): metrics."""
        ...

    def residency(self) -> Any:
        """Where scopes' indexes are loaded on first use (a store other cores share): the loaded
        scopes and records, loads and evictions so far (``index_residency.ResidencyStats``);
        None when every scope is loaded at open (metrics)."""
        ...

    def attach_audit_devices(self, devices: Any) -> None:
        """Stream every audit row written from now on to ``devices`` before it is durable; a row
        no device accepts fails its call (SPEC §10 fail closed)."""
        ...

    def audit_device_failures(self) -> dict[str, int]:
        """Failed writes per audit device since start (metrics)."""
        ...

    def index_ready(self) -> bool:
        """The in-memory search index is built and current (readiness)."""
        ...

    def audit_spool_state(self) -> tuple[int, int | None]:
        """(audit rows spooled but not yet in the table, ``at_ms`` of the oldest of them)."""
        ...

    def reload_indexes(self, *, key_digests: bool = True) -> None:
        """Rebuild the in-memory copies (search index, committed scopes and, unless
        ``key_digests=False``, the engine's negative-lookup digests) from storage."""
        ...

    def schema_version(self) -> int:
        """The schema version this engine writes, as ``Tx.schema_version``."""
        ...

    def migrate(self) -> list[int]:
        """Re-verify the migration ledger (MIGRATION_LEDGER_INVALID) and apply pending migrations."""
        ...

    def migration_ledger(self) -> list[dict[str, Any]]:
        """The applied migrations: version, name, checksum, applied_at_ms."""
        ...

    def migration_code(self) -> list[dict[str, Any]]:
        """The migrations this engine's code knows: version, name, checksum."""
        ...

    def checkpoint(self) -> None:
        """Make freed pages durable-and-reused (after forget, SPEC §10)."""
        ...

    def analyze(self) -> None:
        """Bring the engine's query-planner statistics up to date after a bulk change (a
        restore, so also ``migrate-store``). Changes nothing a reader sees; only the speed of
        later queries depends on it."""
        ...

    def close(self) -> None: ...


def iter_chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
