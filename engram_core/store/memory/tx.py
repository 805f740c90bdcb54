"""The in-memory engine's transaction (``engine.EngineTx``) over one ``Tables``.

A write transaction has a copy of the committed tables of its own (``tables.Tables.copy``) and is
the only writer (the engine's writer lock); a snapshot read has one committed state; a read
without a snapshot reads the latest committed state at each call. Every insert-if-absent is
exact: a second insert of a key raises (``STORE_UNAVAILABLE``, as a database's unique key would
fail the statement) or, where the port says so, answers False.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.chain import GENESIS, LEGACY_CHAIN
from engram_core.store.memory.tables import ScopeKey, Tables, frozen_doc
from engram_core.store.port import (
    CandidateRow,
    Event,
    HostKeyRow,
    IdempotencyRow,
    KeyDestruction,
    RecordRow,
    ScopeRow,
    SharedPin,
)

SCHEMA_VERSION = 1  # what this engine writes (a backup names it; a restore requires the same)

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R", CandidateRow, RecordRow)


def _duplicate(what: str) -> EngramError:
    return EngramError(Code.STORE_UNAVAILABLE, f"duplicate key: {what}")


def _insert_new(table: dict[K, V], key: K, row: V, what: str) -> None:
    """An insert of a key the table must not hold yet (a database's unique key)."""
    if key in table:
        raise _duplicate(what)
    table[key] = row


def _in_scope(row: R | None, scope: Scope) -> R | None:
    """``row`` if it is of the scope asked: ids are unique across scopes, but a caller sees its own."""
    return row if row is not None and (row.tenant, row.workspace) == (scope.tenant, scope.workspace) else None


class MemoryEngineTx:
    """Persistence inside one transaction of the in-memory engine."""

    def __init__(self, tables: Callable[[], Tables], *, writing: bool = False) -> None:
        self._tables = tables  # the tables this transaction reads (and, writing, changes)
        self.writing = writing
        self.scope_changes: dict[ScopeKey, ScopeRow] = {}  # scope rows this transaction wrote

    @property
    def _t(self) -> Tables:
        return self._tables()

    def _write(self) -> Tables:
        if not self.writing:
            raise EngramError(Code.STORE_UNAVAILABLE, "a write in a read transaction")
        return self._t

    def read_ahead(self, *reads: Callable[[], object]) -> None:
        """Nothing to do: a read here is a local call."""

    # -- scopes and the journal ----------------------------------------------------------------
    def scope(self, scope: Scope) -> ScopeRow | None:
        return self._t.scopes.get((scope.tenant, scope.workspace))

    def _changed(self, row: ScopeRow) -> ScopeRow:
        self._write().scopes[(row.tenant, row.workspace)] = row
        self.scope_changes[(row.tenant, row.workspace)] = row
        return row

    def scope_for_update(self, scope: Scope) -> ScopeRow:
        row = self.scope(scope)
        return row if row is not None else self._changed(ScopeRow(scope.tenant, scope.workspace, False, (), 0, 0, GENESIS))

    def scopes(self) -> list[ScopeRow]:
        return [row for _, row in sorted(self._t.scopes.items())]

    def set_activation(self, scope: Scope, *, activated: bool, tools: tuple[str, ...]) -> ScopeRow:
        row = self.scope_for_update(scope)
        return self._changed(replace(row, activated=activated, tools=tuple(sorted(tools))))

    def bump_epoch(self, scope: Scope) -> int:
        row = self.scope_for_update(scope)
        return self._changed(replace(row, authorization_epoch=row.authorization_epoch + 1)).authorization_epoch

    def insert_event(self, event: Event) -> None:
        scope = self.scope_for_update(Scope(event.tenant, event.workspace))
        if event.cursor != scope.last_cursor + 1 or event.prev_digest != scope.last_event_digest:
            raise EngramError(Code.STORE_UNAVAILABLE, "journal event does not follow the scope head")
        self._write().journal.setdefault((event.tenant, event.workspace), []).append(event)
        self._changed(replace(scope, last_cursor=event.cursor, last_event_digest=event.event_digest))

    def set_scope_head(self, scope: Scope, cursor: int, event_digest: str) -> None:
        row = self.scope_for_update(scope)
        self._changed(replace(row, last_cursor=cursor, last_event_digest=event_digest))

    def events(self, scope: Scope, from_cursor: int, to_cursor: int | None) -> list[Event]:
        top = to_cursor if to_cursor is not None else 2**63
        return [e for e in self._t.journal.get((scope.tenant, scope.workspace), []) if from_cursor <= e.cursor <= top]

    def event_by_id(self, scope: Scope, event_id: str) -> Event | None:
        return next((e for e in self._t.journal.get((scope.tenant, scope.workspace), []) if e.event_id == event_id), None)

    def restore_scope(self, row: ScopeRow) -> None:
        if (row.tenant, row.workspace) in self._t.scopes:
            raise _duplicate("scope")
        self._changed(replace(row, tools=tuple(sorted(row.tools))))

    def restore_event(self, e: Event) -> None:
        journal = self._write().journal.setdefault((e.tenant, e.workspace), [])
        if any(x.cursor == e.cursor for x in journal):
            raise _duplicate("journal cursor")
        journal.append(e)
        journal.sort(key=lambda x: x.cursor)

    # -- idempotency, confirmations, tombstones ----------------------------------------------------
    def idempotency_get(self, scope: Scope, principal: str, key: str) -> IdempotencyRow | None:
        return self._t.idempotency.get((scope.tenant, scope.workspace, principal, key))

    def idempotency_put(self, scope: Scope, principal: str, key: str, row: IdempotencyRow,
                        at_ms: int) -> None:
        _insert_new(self._write().idempotency, (scope.tenant, scope.workspace, principal, key), row, "idempotency key")

    def use_confirmation(self, grant_id: str, scope: Scope, at_ms: int) -> bool:
        if grant_id in self._t.confirmations:
            return False
        self._write().confirmations[grant_id] = (scope.tenant, scope.workspace, at_ms)
        return True

    def add_tombstone(self, scope: Scope, payload_digest: str, record_id: str, cursor: int,
                      at_ms: int) -> None:
        _insert_new(self._write().tombstones, (scope.tenant, scope.workspace, payload_digest, record_id),
                    {"tenant": scope.tenant, "workspace": scope.workspace, "payload_digest": payload_digest,
                     "record_id": record_id, "cursor": cursor, "at_ms": at_ms}, "tombstone")

    def tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        return any(k[:3] == (scope.tenant, scope.workspace, payload_digest) for k in self._t.tombstones)

    def tombstone_rows(self) -> list[dict[str, Any]]:
        rows = sorted(self._t.tombstones.values(),
                      key=lambda r: (r["tenant"], r["workspace"], r["cursor"], r["record_id"]))
        return [dict(r) for r in rows]

    # -- candidates and records ------------------------------------------------------------------
    def insert_candidate(self, row: CandidateRow) -> None:
        _insert_new(self._write().candidates, row.candidate_id, row, "candidate")

    def candidate(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        return _in_scope(self._t.candidates.get(candidate_id), scope)

    def candidates_in_state(self, scope: Scope, state: str) -> list[CandidateRow]:
        return sorted((c for c in self._t.candidates.values()
                       if (c.tenant, c.workspace, c.state) == (scope.tenant, scope.workspace, state)), key=lambda c: c.cursor)

    def _candidate_changed(self, candidate_id: str, **changes: Any) -> None:
        found = self._t.candidates.get(candidate_id)
        if found is not None:
            self._write().candidates[candidate_id] = replace(found, **changes)

    def set_candidate_state(self, candidate_id: str, state: str, *, decision: dict[str, Any] | None = None,
                            drop_envelope: bool = False) -> None:
        found = self._t.candidates.get(candidate_id)
        if found is None:
            return
        self._candidate_changed(candidate_id, state=state, decision=decision if decision else found.decision,
                                sealed_envelope=None if drop_envelope else found.sealed_envelope)

    def set_candidate_trust_class(self, candidate_id: str, trust_class: str) -> None:
        self._candidate_changed(candidate_id, trust_class=trust_class)

    def scrub_candidate_facts(self, candidate_id: str) -> None:
        self._candidate_changed(candidate_id, facts={})

    def insert_record(self, row: RecordRow) -> None:
        _insert_new(self._write().records, row.record_id, row, "record")

    def record(self, scope: Scope, record_id: str) -> RecordRow | None:
        return _in_scope(self._t.records.get(record_id), scope)

    def records(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]:
        return {rid: r for rid in record_ids if (r := self.record(scope, rid)) is not None}

    def scope_records(self, scope: Scope, states: tuple[str, ...] | None = None) -> list[RecordRow]:
        return sorted((r for r in self._t.records.values() if (r.tenant, r.workspace) == (scope.tenant, scope.workspace)
                       and (states is None or r.state in states)), key=lambda r: r.accepted_cursor)

    def _record_changed(self, record_id: str, **changes: Any) -> None:
        found = self._t.records.get(record_id)
        if found is not None:
            self._write().records[record_id] = replace(found, **changes)

    def set_record_state(self, record_id: str, state: str, *, state_cursor: int, successor_id: str | None = None,
                         drop_body: bool = False) -> None:
        found = self._t.records.get(record_id)
        if found is None:
            return
        successor = found.successor_id if successor_id is None else (successor_id or None)
        self._record_changed(record_id, state=state, state_cursor=state_cursor, successor_id=successor,
                             sealed_body=None if drop_body else found.sealed_body)

    def set_record_trust_class(self, record_id: str, trust_class: str) -> None:
        self._record_changed(record_id, trust_class=trust_class)

    def payload_standing(self, scope: Scope, payload_digest: str) -> tuple[str | None, bool]:
        current = min(((r.accepted_cursor, r.record_id) for r in self._t.records.values()
                       if (r.tenant, r.workspace, r.payload_digest, r.state)
                       == (scope.tenant, scope.workspace, payload_digest, "accepted_current")), default=(0, None))[1]
        return current, self.tombstoned(scope, payload_digest)

    # -- record links --------------------------------------------------------------------------------
    def add_record_links(self, scope: Scope, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None:
        t = self._write() if family_refs or source_ids else self._t
        for ref in family_refs:
            t.families.setdefault((scope.tenant, scope.workspace, ref, record_id), primary_kind)
        for source in source_ids:
            t.sources.add((scope.tenant, scope.workspace, source, record_id))

    def drop_record_links(self, record_id: str) -> None:
        t = self._t
        families = [k for k in t.families if k[3] == record_id]
        sources = [k for k in t.sources if record_id in (k[2], k[3])]
        if families or sources:
            w = self._write()
            for k in families:
                del w.families[k]
            w.sources.difference_update(sources)

    def family_members(self, scope: Scope, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]:
        found: dict[str, tuple[str, list[str]]] = {}
        for (t, w, ref, rid), kind in self._t.families.items():
            if (t, w) == (scope.tenant, scope.workspace) and ref in family_refs:
                found.setdefault(rid, (kind, []))[1].append(ref)
        out = []
        for rid in sorted(found):
            rec = self.record(scope, rid)
            if rec is not None and rec.state in states:
                out.append((rec, found[rid][0], sorted(found[rid][1])))
        return out

    def derivatives(self, scope: Scope, source_id: str) -> list[RecordRow]:
        linked = sorted({rid for t, w, source, rid in self._t.sources if (t, w, source) == (scope.tenant, scope.workspace, source_id)})
        return [r for rid in linked if (r := self.record(scope, rid)) is not None]

    # -- the data-key ledger ---------------------------------------------------------------------------
    def put_data_key(self, owner: str, slot: int, at_ms: int) -> None:
        _insert_new(self._write().data_keys, owner, (slot, at_ms), "data key")

    def data_key_slot(self, owner: str) -> int | None:
        found = self._t.data_keys.get(owner)
        return found[0] if found is not None else None

    def drop_data_key(self, owner: str, at_ms: int, reason: str, *, slot: int | None = None,
                      generation: int | None = None) -> int | None:
        found = self._t.data_keys.get(owner)
        if found is None:
            return None
        t = self._write()
        del t.data_keys[owner]
        _insert_new(t.destructions, owner, KeyDestruction(owner, at_ms, reason, generation), "key destruction")
        return found[0]

    def live_key_slots(self) -> dict[int, str]:
        return {slot: owner for owner, (slot, _) in self._t.data_keys.items()}

    def key_destruction(self, owner: str) -> KeyDestruction | None:
        return self._t.destructions.get(owner)

    def key_destructions(self) -> list[KeyDestruction]:
        return [d for _, d in sorted(self._t.destructions.items())]

    def restore_key_destruction(self, owner: str, at_ms: int, reason: str, generation: int | None) -> None:
        if owner not in self._t.destructions:
            self._write().destructions[owner] = KeyDestruction(owner, at_ms, reason, generation)

    # -- sealed projections --------------------------------------------------------------------------------
    def put_projection(self, scope: Scope, record_id: str, sealed: bytes, *, new: bool) -> None:
        if new and record_id in self._t.projections:
            raise _duplicate("projection")
        self._write().projections[record_id] = (scope.tenant, scope.workspace, bytes(sealed))

    def delete_projection(self, record_id: str) -> None:
        if record_id in self._t.projections:
            del self._write().projections[record_id]

    def projection_blob(self, record_id: str) -> tuple[bytes, RecordRow] | None:
        found, rec = self._t.projections.get(record_id), self._t.records.get(record_id)
        return (found[2], rec) if found is not None and rec is not None else None

    def scope_projection_blobs(self, scope: Scope) -> list[tuple[RecordRow, bytes]]:
        t = self._t
        return [(t.records[rid], sealed) for rid, (tw, ww, sealed) in t.projections.items()
                if (tw, ww) == (scope.tenant, scope.workspace) and rid in t.records]

    def update_projection_blobs(self, blobs: list[tuple[str, bytes]]) -> None:
        for rid, sealed in blobs:
            found = self._t.projections.get(rid)
            if found is not None:
                self._write().projections[rid] = (found[0], found[1], bytes(sealed))

    def drop_scope_projections(self, scope: Scope) -> None:
        gone = [rid for rid, (t, w, _) in self._t.projections.items() if (t, w) == (scope.tenant, scope.workspace)]
        for rid in gone:
            del self._write().projections[rid]

    # -- audit rows --------------------------------------------------------------------------------------------
    def audit_heads(self, chains: list[str]) -> dict[str, tuple[int, str]]:
        # The writer lock makes every chain this transaction's until it commits.
        heads = self.all_audit_heads()
        return {c: heads.get(c, (0, GENESIS)) for c in chains}

    def insert_audit(self, docs: list[dict[str, Any]], *, if_absent: bool = False) -> None:
        t = self._write()
        for doc in docs:
            chain = t.audit.setdefault(doc.get("chain", LEGACY_CHAIN), {})
            seq = int(doc["seq"])
            if seq in chain:
                if if_absent:
                    continue
                raise _duplicate("audit row")
            chain[seq] = frozen_doc(doc)

    def audit_rows(self, scope: Scope | None, from_seq: int,
                   to_seq: int | None) -> list[dict[str, Any]]:
        top = to_seq if to_seq is not None else 2**63
        return [frozen_doc(d) for _, rows in sorted(self._t.audit.items()) for seq, d in sorted(rows.items())
                if from_seq <= seq <= top and (scope is None or (d.get("tenant"), d.get("workspace"))
                                               == (scope.tenant, scope.workspace))]

    def all_audit_heads(self) -> dict[str, tuple[int, str]]:
        out = {}
        for chain, rows in self._t.audit.items():
            if rows:
                seq = max(rows)
                out[chain] = (seq, str(rows[seq]["row_digest"]))
        return out

    def recent_context_nonces(self, since_ms: int) -> list[tuple[str, int]]:
        return [(d["context_nonce"], int(d["at_ms"])) for rows in self._t.audit.values() for d in rows.values()
                if d.get("context_nonce") and int(d["at_ms"]) >= since_ms]

    def put_page_pin(self, pin: SharedPin) -> None:
        raise ValueError("page pins are shared only where other cores write the store")

    # -- trusted host keys, metadata, the store as a whole -------------------------------------------------
    def trusted_host_keys(self) -> list[tuple[str, str]]:
        return [(k, row.public_key_pem) for k, row in sorted(self._t.host_keys.items())]

    def add_trusted_host_key(self, key_id: str, pem: str, at_ms: int) -> None:
        if key_id not in self._t.host_keys:
            self._write().host_keys[key_id] = HostKeyRow(key_id, pem, at_ms, (), False, ())

    def host_key_rows(self) -> list[HostKeyRow]:
        return [row for _, row in sorted(self._t.host_keys.items())]

    def bind_trusted_host_key(self, row: HostKeyRow) -> None:
        stored = self._t.host_keys.get(row.key_id)
        bound = row if stored is None else replace(row, public_key_pem=stored.public_key_pem,
                                                   added_at_ms=stored.added_at_ms)
        self._write().host_keys[row.key_id] = bound

    def remove_trusted_host_key(self, key_id: str) -> bool:
        if key_id not in self._t.host_keys:
            return False
        del self._write().host_keys[key_id]
        return True

    def meta(self, key: str) -> str | None:
        return self._t.meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self._write().meta[key] = value

    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        return {k: v for k, v in self._t.meta.items() if k.startswith(prefix)}

    def is_empty(self) -> bool:
        t = self._t
        return not (t.scopes or any(t.journal.values()) or t.records or t.candidates
                    or any(t.audit.values()) or t.tombstones or t.data_keys)

    def schema_version(self) -> int:
        return SCHEMA_VERSION
