"""The ``Tx`` members the store kernel hands to its engine unchanged, each delegated by name.

``kernel.KernelTx`` is the ``Tx`` port (``port.py``) over one engine transaction
(``engine.EngineTx``). What the kernel adds to a member (chains, sealing, the search index, key
durability) is defined in ``kernel.py``; every other member of ``Tx`` is defined here, forwarding
to the engine's member of the same name. Nothing else of the engine transaction is reachable
through a ``KernelTx``: engine-only members (``insert_event``, ``insert_audit``,
``set_scope_head``, ...) would skip what the kernel does around them, so a caller that needs one
opens an engine transaction itself (``StoreKernel.engine.write``). A static type checker proves
``KernelTx`` satisfies ``Tx`` (tests/unit/test_type_check.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engram_core.contract.scope import Scope
from engram_core.store.engine import EngineTx
from engram_core.store.port import (
    CandidateRow,
    Event,
    HostKeyRow,
    IdempotencyRow,
    KeyDestruction,
    RecordRow,
    ScopeRow,
)


class EngineTxDelegation:
    """The engine's persistence, unchanged, for the ``Tx`` members the kernel adds nothing to."""

    _etx: EngineTx

    def read_ahead(self, *reads: Callable[[], object]) -> None:
        self._etx.read_ahead(*reads)

    def scope(self, scope: Scope) -> ScopeRow | None:
        return self._etx.scope(scope)

    def set_activation(self, scope: Scope, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        return self._etx.set_activation(scope, activated=activated, tools=tools)

    def bump_epoch(self, scope: Scope) -> int:
        return self._etx.bump_epoch(scope)

    def events(self, scope: Scope, from_cursor: int, to_cursor: int | None) -> list[Event]:
        return self._etx.events(scope, from_cursor, to_cursor)

    def scopes(self) -> list[ScopeRow]:
        return self._etx.scopes()

    def event_by_id(self, scope: Scope, event_id: str) -> Event | None:
        return self._etx.event_by_id(scope, event_id)

    def idempotency_get(self, scope: Scope, principal: str, key: str) -> IdempotencyRow | None:
        return self._etx.idempotency_get(scope, principal, key)

    def idempotency_put(self, scope: Scope, principal: str, key: str, row: IdempotencyRow, at_ms: int) -> None:
        self._etx.idempotency_put(scope, principal, key, row, at_ms)

    def use_confirmation(self, grant_id: str, scope: Scope, at_ms: int) -> bool:
        return self._etx.use_confirmation(grant_id, scope, at_ms)

    def insert_candidate(self, row: CandidateRow) -> None:
        self._etx.insert_candidate(row)

    def candidate(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        return self._etx.candidate(scope, candidate_id)

    def candidates_in_state(self, scope: Scope, state: str) -> list[CandidateRow]:
        return self._etx.candidates_in_state(scope, state)

    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None=None, drop_envelope: bool=False) -> None:
        self._etx.set_candidate_state(candidate_id, state, decision=decision, drop_envelope=drop_envelope)

    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None:
        self._etx.set_candidate_trust_class(candidate_id, trust_class)

    def scrub_candidate_facts(self, candidate_id: str) -> None:
        self._etx.scrub_candidate_facts(candidate_id)

    def data_key_slot(self, owner: str) -> int | None:
        return self._etx.data_key_slot(owner)

    def live_key_slots(self) -> dict[int, str]:
        return self._etx.live_key_slots()

    def key_destruction(self, owner: str) -> KeyDestruction | None:
        return self._etx.key_destruction(owner)

    def scope_records(self, scope: Scope, states: tuple[str, ...] | None=None) -> list[RecordRow]:
        return self._etx.scope_records(scope, states)

    def payload_standing(self, scope: Scope, payload_digest: str) -> tuple[str | None, bool]:
        return self._etx.payload_standing(scope, payload_digest)

    def add_record_links(self, scope: Scope, record_id: str, *, family_refs: list[str], primary_kind: str, source_ids: list[str]) -> None:
        self._etx.add_record_links(scope, record_id, family_refs=family_refs, primary_kind=primary_kind, source_ids=source_ids)

    def drop_record_links(self, record_id: str) -> None:
        self._etx.drop_record_links(record_id)

    def family_members(self, scope: Scope, family_refs: list[str], states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]:
        return self._etx.family_members(scope, family_refs, states)

    def derivatives(self, scope: Scope, source_id: str) -> list[RecordRow]:
        return self._etx.derivatives(scope, source_id)

    def add_tombstone(self, scope: Scope, payload_digest: str, record_id: str, cursor: int, at_ms: int) -> None:
        self._etx.add_tombstone(scope, payload_digest, record_id, cursor, at_ms)

    def tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        return self._etx.tombstoned(scope, payload_digest)

    def audit_rows(self, scope: Scope | None, from_seq: int, to_seq: int | None) -> list[dict[str, Any]]:
        return self._etx.audit_rows(scope, from_seq, to_seq)

    def trusted_host_keys(self) -> list[tuple[str, str]]:
        return self._etx.trusted_host_keys()

    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        self._etx.add_trusted_host_key(key_id, pem, at_ms)

    def remove_trusted_host_key(self, key_id: str) -> bool:
        return self._etx.remove_trusted_host_key(key_id)

    def host_key_rows(self) -> list[HostKeyRow]:
        return self._etx.host_key_rows()

    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        self._etx.bind_trusted_host_key(row)

    def meta(self, key: str) -> str | None:
        return self._etx.meta(key)

    def set_meta(self, key: str, value: str) -> None:
        self._etx.set_meta(key, value)

    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        return self._etx.meta_with_prefix(prefix)

    def is_empty(self) -> bool:
        return self._etx.is_empty()

    def schema_version(self) -> int:
        return self._etx.schema_version()

    def tombstone_rows(self) -> list[dict[str, Any]]:
        return self._etx.tombstone_rows()

    def key_destructions(self) -> list[KeyDestruction]:
        return self._etx.key_destructions()

    def restore_scope(self, row: ScopeRow) -> None:
        self._etx.restore_scope(row)

    def restore_event(self, e: Event) -> None:
        self._etx.restore_event(e)

    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None:
        self._etx.restore_key_destruction(owner, at_ms, reason, generation)
