"""The kernel's ``Tx`` (``KernelTx``): one engine transaction with the kernel's journal digests,
audit rows joining their chains at commit, sealed projections (``kernel_projections.py``), key
durability and the search index's ranking; the rest of ``Tx`` is the engine's, delegated by name
(``tx_delegation.py``). The kernel itself is ``kernel.py``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from engram_core.contract.scope import Scope
from engram_core.store.chain import event_digest_of
from engram_core.store.changes import RecordRowChanged, RecordStateChanged
from engram_core.store.engine import EngineCapabilities, EngineTx, TxEffects
from engram_core.store.kernel_projections import ProjectionMaintenance
from engram_core.store.port import AuditRow, Event, LexicalPage, LexicalQuery, LexicalStats, RecordRow
from engram_core.store.search_index import SearchIndex
from engram_core.store.tx_delegation import EngineTxDelegation


class Kernel(Protocol):
    """What a ``KernelTx`` uses of its ``kernel.StoreKernel``."""

    @property
    def capabilities(self) -> EngineCapabilities: ...
    def search_index(self, scope: Scope | None = None) -> AbstractContextManager[SearchIndex]: ...
    def spooled_audit_heads(self) -> dict[str, tuple[int, str]]: ...
    def key_generation_of(self, slot: int) -> int | None: ...
    def data_key(self, rec: RecordRow) -> bytes: ...
    def indexed_postings(self, scope: Scope, record_id: str) -> int | None: ...


class KernelTx(ProjectionMaintenance, EngineTxDelegation):
    """The ``Tx`` port: one engine transaction, with the kernel's chains, sealing and index.

    The ``Tx`` members not defined here are the engine's persistence, unchanged, each delegated
    by name (``tx_delegation.py``); nothing else of the engine transaction is reachable."""

    _kernel: Kernel

    def __init__(self, kernel: Kernel, etx: EngineTx, effects: TxEffects | None, *, latest: bool = False) -> None:
        self._kernel = kernel
        self._etx = etx
        self._effects = effects if effects is not None else TxEffects()
        # A reader without a snapshot (each statement reads the latest commit) may also read the
        # committed copies published with each commit; a snapshot or a writer may not.
        self._latest = latest
        self._inserted: dict[str, RecordRow] = {}  # records this transaction inserted (index_record needs them)

    @property
    def destroyed_slots(self) -> list[int]:
        return self._effects.destroyed_slots

    @destroyed_slots.setter
    def destroyed_slots(self, slots: list[int]) -> None:
        self._effects.destroyed_slots = slots

    @property
    def keys_zeroed(self) -> bool:
        """After the commit: every key this transaction destroyed is gone from the live vault."""
        return self._effects.keys_zeroed

    @property
    def key_destruction_outcome(self) -> str:
        """After the commit: "complete" once every key this transaction destroyed is zeroed."""
        return self._effects.key_destruction_outcome

    @key_destruction_outcome.setter
    def key_destruction_outcome(self, outcome: str) -> None:
        self._effects.key_destruction_outcome = outcome

    # -- the journal ------------------------------------------------------------------------------------------
    def append_event(
        self, scope: Scope, *, event_id: str, operation: str, target: str,
        from_state: str, to_state: str, at_ms: int, body: dict[str, Any],
    ) -> Event:
        tenant, workspace = scope.tenant, scope.workspace
        head = self._etx.scope_for_update(scope)
        cursor = head.last_cursor + 1
        doc = {
            "tenant": tenant, "workspace": workspace, "cursor": str(cursor), "event_id": event_id,
            "operation": operation, "target": target, "from_state": from_state, "to_state": to_state,
            "at_ms": at_ms, "body": body, "prev_digest": head.last_event_digest,
        }
        event = Event(tenant, workspace, cursor, event_id, operation, target, from_state, to_state, at_ms, body,
                      head.last_event_digest, event_digest_of(doc))
        self._etx.insert_event(event)
        self._effects.appended_cursors.append((tenant, workspace, cursor))
        return event

    # -- audit -------------------------------------------------------------------------------------------------
    def append_audit(self, row: AuditRow) -> str:
        """The transaction's audit row; it takes its place in its scope's chain at commit."""
        self._effects.audit_rows.append(row)
        return ""

    def restore_audit_row(self, doc: dict[str, Any]) -> None:
        """A verified audit row, verbatim (restore)."""
        self._effects.restored_audit.append(doc)

    def audit_heads(self) -> dict[str, tuple[int, str]]:
        """Every audit chain's head: the engine's rows, then the spooled rows after them."""
        heads = self._etx.all_audit_heads()
        heads.update(self._kernel.spooled_audit_heads())
        return heads

    # -- data keys ------------------------------------------------------------------------------------------------
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None:
        self._etx.put_data_key(owner, slot, at_ms)
        self._effects.names_new_keys = True

    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None,
                      generation: int | None = None) -> int | None:
        """Destroy ``owner``'s data key: its ledger row goes now, its slot is zeroed once this
        commits, and the destruction records the KEK generation wrapping it (``generation``: the
        caller knows it; else it is read from the vault, or by the engine itself where it
        ``records_key_generations``)."""
        if slot is None:
            slot = self._etx.data_key_slot(owner)
        if generation is None and slot is not None and not self._kernel.capabilities.records_key_generations:
            generation = self._kernel.key_generation_of(slot)
        dropped = self._etx.drop_data_key(owner, at_ms, reason, slot=slot, generation=generation)
        if dropped is not None:
            self._effects.destroyed_slots.append(dropped)
            self._effects.destroyed_generations.append(generation)
        return dropped

    # -- records ------------------------------------------------------------------------------------------------------
    def insert_record(self, row: RecordRow) -> None:
        self._etx.insert_record(row)
        self._inserted[row.record_id] = row

    def record(self, scope: Scope, record_id: str) -> RecordRow | None:
        if self._latest:  # the committed copy where the index holds one (a forget's first look)
            return self.records(scope, [record_id]).get(record_id)
        return self._etx.record(scope, record_id)

    def records(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]:
        """These records' rows in the scope. A reader without a snapshot gets the latest committed
        rows, from the search index's copy where it holds one (published with each commit)."""
        if not record_ids:
            return {}
        if not self._latest or not self._kernel.capabilities.sole_writer:
            return self._etx.records(scope, record_ids)
        with self._kernel.search_index() as index:
            found = index.rows(scope, record_ids)
        missing = [rid for rid in record_ids if rid not in found]
        if missing:
            found.update(self._etx.records(scope, missing))
        return found

    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None:
        self._etx.set_record_state(record_id, state, state_cursor=state_cursor, successor_id=successor_id,
                                   drop_body=drop_body)
        self._effects.changes.append(RecordStateChanged(record_id, state == "accepted_current", state_cursor,
                                                        drop_body))
        self._inserted.pop(record_id, None)

    def set_record_trust_class(self, record_id: str, trust_class: str) -> None:
        self._etx.set_record_trust_class(record_id, trust_class)
        self._effects.changes.append(RecordRowChanged(record_id))  # the index's copy shows the old class

    # -- ranking (the search index) ----------------------------------------------------------------------------------------
    def lexical_stats(self, scope: Scope, terms: list[int]) -> LexicalStats:
        """Corpus statistics BM25 needs for ``terms`` in one scope. Search pins them with the first
        page, so later pages score every record as the first page did (SPEC §5)."""
        with self._kernel.search_index(scope) as index:
            return index.stats(scope, terms)

    def rank_lexical(self, scope: Scope, query: LexicalQuery) -> LexicalPage:
        """BM25F ranking of the scope's eligible records (see ``SearchIndex.rank``)."""
        with self._kernel.search_index(scope) as index:
            return index.rank(scope, query)

    def rank_vectors(
        self, scope: Scope, model: str, vector: list[float], *, now_ms: int,
        max_accepted_cursor: int, min_similarity: float, limit: int,
        neighbours: tuple[int, float, int, int] | None = None,
    ) -> list[tuple[str, float, int]]:
        """Nearest eligible records by cosine similarity (see ``SearchIndex.nearest``)."""
        with self._kernel.search_index(scope) as index:
            return index.nearest(scope, model, vector, now_ms=now_ms,
                                 max_accepted_cursor=max_accepted_cursor, min_similarity=min_similarity, limit=limit,
                                 neighbours=neighbours)
