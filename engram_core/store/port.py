"""The Store port: what core services need from storage, nothing DuckDB-specific.

Services open a transaction (``store.write()`` / ``store.read()``) and call
domain methods on it. Everything in one ``write()`` block commits atomically
or not at all (SPEC §7: effect, journal event, idempotency outcome, audit row
and projections in one transaction). Services import this module (and the
shared ``chain``, ``projection`` modules), never an engine:
tests/unit/test_layering.py fails if one does. The DuckDB engine
(``engram_core.store.duckdb``) is named only by the composition root
(``engram_core.rpc.server.open_core``); a PostgreSQL implementation is written
against these Protocols alone, with the same methods and the same meaning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from engram_core.store.projection import Projection


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


@dataclass(frozen=True)
class IdempotencyRow:
    tool: str
    target: str
    request_digest: str
    outcome: dict[str, Any]


@dataclass(frozen=True)
class LexicalHit:
    record_id: str
    lexical: float
    valid_t: int


@dataclass(frozen=True)
class LexicalStats:
    """BM25 corpus statistics of one scope for one query (pinned by search paging)."""

    docs: int
    avg_len: dict[str, float]
    df: dict[int, int]


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


@dataclass(frozen=True)
class HostKeyRow:
    """A trusted host key as stored, with its binding (migration 9; issue 26.3)."""

    key_id: str
    public_key_pem: str
    added_at_ms: int
    tenants: tuple[str, ...]
    all_tenants: bool
    maintenance_scopes: tuple[str, ...]


class Tx(Protocol):
    # Slots of data keys destroyed in this transaction: the caller zeroes them in the KeyVault
    # once it commits (SPEC §10 crypto-shredding).
    destroyed_slots: list[int]

    # scopes and cursors
    def scope(self, tenant: str, workspace: str) -> ScopeRow | None: ...
    def set_activation(self, tenant: str, workspace: str, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow: ...
    def bump_epoch(self, tenant: str, workspace: str) -> int: ...
    def append_event(
        self, tenant: str, workspace: str, *, event_id: str, operation: str, target: str,
        from_state: str, to_state: str, at_ms: int, body: dict[str, Any],
    ) -> Event: ...
    def events(self, tenant: str, workspace: str, from_cursor: int, to_cursor: int | None) -> list[Event]: ...
    def scopes(self) -> list[ScopeRow]: ...
    def event_by_id(self, tenant: str, workspace: str, event_id: str) -> Event | None: ...
    # idempotency and confirmations
    def idempotency_get(self, tenant: str, workspace: str, principal: str, key: str) -> IdempotencyRow | None: ...
    def idempotency_put(self, tenant: str, workspace: str, principal: str, key: str, row: IdempotencyRow, at_ms: int) -> None: ...
    def use_confirmation(self, grant_id: str, tenant: str, workspace: str, at_ms: int) -> bool: ...
    # candidates
    def insert_candidate(self, row: CandidateRow) -> None: ...
    def candidate(self, tenant: str, workspace: str, candidate_id: str) -> CandidateRow | None: ...
    def candidates_in_state(self, tenant: str, workspace: str, state: str) -> list[CandidateRow]: ...
    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None = None, drop_envelope: bool = False) -> None: ...
    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None: ...
    def scrub_candidate_facts(self, candidate_id: str) -> None:
        """Empty a candidate's facts (sizes, family refs, findings, retention: all derived from its
        content) once the content is gone: withdrawn, rejected, or its record forgotten (issue 26.7)."""
        ...
    # data keys (slots live in the KeyVault; the store maps owners to slots)
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None: ...
    def data_key_slot(self, owner: str) -> int | None: ...
    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None) -> int | None:
        """Destroy ``owner``'s data key (its slot is zeroed after commit); returns the slot or None.
        ``slot``: the caller knows it (a record row's key slot, or one read before a state check
        made under the writer lock that a dropped key would have failed), so it is not read."""
        ...
    def live_key_slots(self) -> dict[int, str]: ...
    def key_destruction(self, owner: str) -> int | None: ...
    # records
    def insert_record(self, row: RecordRow) -> None: ...
    def record(self, tenant: str, workspace: str, record_id: str) -> RecordRow | None: ...
    def records(self, tenant: str, workspace: str, record_ids: list[str]) -> dict[str, RecordRow]: ...
    def scope_records(self, tenant: str, workspace: str, states: tuple[str, ...] | None = None) -> list[RecordRow]: ...
    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None: ...
    def set_record_trust_class(self, record_id: str, trust_class: str) -> None: ...
    def payload_standing(self, tenant: str, workspace: str, payload_digest: str) -> tuple[str | None, bool]: ...
    # record links: reconciliation families and derivative sources (identifiers and labels only)
    def add_record_links(self, tenant: str, workspace: str, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None: ...
    def drop_record_links(self, record_id: str) -> None: ...
    def family_members(self, tenant: str, workspace: str, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]: ...
    def derivatives(self, tenant: str, workspace: str, source_id: str) -> list[RecordRow]: ...
    # tombstone ledger
    def add_tombstone(self, tenant: str, workspace: str, payload_digest: str, record_id: str, cursor: int, at_ms: int) -> None: ...
    def tombstoned(self, tenant: str, workspace: str, payload_digest: str) -> bool: ...
    # projections
    def index_record(self, tenant: str, workspace: str, record_id: str, fields: dict[str, Counter[int]],
                     vector: tuple[str, list[float]] | None = None) -> None: ...
    def unindex_record(self, tenant: str, workspace: str, record_id: str) -> int: ...
    def lexical_stats(self, tenant: str, workspace: str, terms: list[int]) -> LexicalStats: ...
    def rank_lexical(
        self, tenant: str, workspace: str, stats: LexicalStats, weights: dict[str, float], *, k1: float, b: float,
        now_ms: int, half_life_ms: int, lexical_weight: float, max_accepted_cursor: int,
        best_bm25: float | None, after: tuple[float, int, str] | None, limit: int,
        window: tuple[int, int] | None = None, neighbours: tuple[int, float, int] | None = None,
    ) -> LexicalPage: ...
    def rank_vectors(
        self, tenant: str, workspace: str, model: str, vector: list[float], *, now_ms: int,
        max_accepted_cursor: int, min_similarity: float, limit: int,
        neighbours: tuple[int, float, int] | None = None,
    ) -> list[tuple[str, float, int]]: ...
    # audit log
    def append_audit(self, row: AuditRow) -> str: ...
    def audit_rows(self, tenant: str | None, workspace: str | None, from_seq: int, to_seq: int | None) -> list[dict[str, Any]]: ...
    def audit_chain_head(self) -> tuple[int, str]: ...
    # trusted host keys and store metadata
    def trusted_host_keys(self) -> list[tuple[str, str]]: ...
    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None: ...
    def remove_trusted_host_key(self, key_id: str) -> bool: ...
    def host_key_rows(self) -> list[HostKeyRow]: ...
    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        """Trust the key with this binding, replacing the binding of one already stored."""
        ...
    def meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def meta_with_prefix(self, prefix: str) -> dict[str, str]: ...
    # maintenance (SPEC §12): projections, backup and restore
    def drop_projections(self, tenant: str, workspace: str) -> dict[str, int]: ...
    def projection(self, record_id: str) -> Projection | None: ...
    def reseal_projections(self, tenant: str, workspace: str,
                           rewrite: Callable[[RecordRow, Projection], Projection | None]) -> int: ...
    def projection_counts(self, tenant: str, workspace: str) -> dict[str, int]: ...
    def is_empty(self) -> bool: ...
    def schema_version(self) -> int:
        """The schema version this engine writes (a backup names it; restore requires the same)."""
        ...
    def tombstone_rows(self) -> list[dict[str, Any]]: ...
    def key_destructions(self) -> list[tuple[str, int, str]]: ...
    def restore_scope(self, row: ScopeRow) -> None: ...
    def restore_event(self, e: Event) -> None: ...
    def restore_audit_row(self, doc: dict[str, Any]) -> None: ...
    def restore_key_destruction(self, owner: str, at_ms: int, reason: str) -> None: ...


class Store(Protocol):
    def write(self, *, batched: bool = False) -> AbstractContextManager[Tx]:
        """A serialized read-write transaction; durable when the ``with`` block exits normally.
        ``batched``: the engine may commit it together with other batched transactions (group
        commit); what it wrote becomes visible to others and durable together with them, and a
        failure of the shared commit is raised from the ``with`` of every member."""
        ...

    def read(self, *, snapshot: bool = True) -> AbstractContextManager[Tx]:
        """A consistent read-only snapshot, or (``snapshot=False``) statements that each read
        the latest committed state."""
        ...

    def append_audit(self, row: AuditRow) -> str:
        """Audit a call that changed nothing, in its own durable transaction."""
        ...

    def committed_scope(self, tenant: str, workspace: str) -> ScopeRow | None:
        """The scope row as of the last commit (kept in memory, published with commits)."""
        ...

    def is_open(self) -> bool: ...

    def index_ready(self) -> bool:
        """The in-memory search index is built and current (readiness)."""
        ...

    def audit_spool_state(self) -> tuple[int, int | None]:
        """(audit rows spooled but not yet in the table, ``at_ms`` of the oldest of them)."""
        ...

    def audit_device_failures(self) -> dict[str, int]:
        """Failed writes per configured audit device since start (empty without devices)."""
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

    def close(self) -> None: ...


def iter_chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
