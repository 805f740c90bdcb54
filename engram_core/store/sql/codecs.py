"""Rows as the SQL engines store them, and back: records, candidates, scopes, journal events,
host keys and audit documents (one codec for both engines; the legacy audit-chain rule is
``chain.py``'s)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engram_core.store.chain import digested_audit_doc, stored_audit_field
from engram_core.store.port import CandidateRow, Event, HostKeyRow, KeyDestruction, RecordRow, ScopeRow

RECORD_COLS = (
    "record_id, tenant, workspace, candidate_id, record_digest, payload_digest, state, trust_class, principal, "
    "agent_id, valid_t, valid_t_end, expires_at_ms, derivative_rule, accepted_at_ms, accepted_cursor, "
    "state_cursor, successor_id, sealed_body, key_slot, session, captured_at_ms"
)
RECORD_WIDTH = 22  # columns in RECORD_COLS: a query's extra columns start here
CANDIDATE_COLS = (
    "candidate_id, tenant, workspace, principal, agent_id, session, state, payload_digest, record_digest, "
    "trust_class, facts, sealed_envelope, captured_at_ms, cursor, decision, key_slot"
)
CANDIDATE_WIDTH = 16
SCOPE_COLS = "tenant, workspace, activated, tools, authorization_epoch, last_cursor, last_event_digest"
EVENT_COLS = ("tenant, workspace, cursor, event_id, operation, target, from_state, to_state, at_ms, body, "
              "prev_digest, event_digest")
KEY_DESTRUCTION_COLS = "owner, destroyed_at_ms, reason, generation"
HOST_KEY_COLS = "key_id, public_key_pem, added_at_ms, tenants, all_tenants, maintenance_scopes"
AUDIT_KEYS = ("chain", "seq", "at_ms", "audit_id", "tenant", "workspace", "principal", "agent_id", "operation",
              "outcome", "target_digest", "decisions", "prev_digest", "row_digest", "context_nonce")
TOMBSTONE_KEYS = ("tenant", "workspace", "payload_digest", "record_id", "cursor", "at_ms")


def qualified(cols: str, alias: str) -> str:
    """``cols`` (a comma-separated column list) each prefixed with ``alias``."""
    return ", ".join(f"{alias}.{c.strip()}" for c in cols.split(","))


def _blob(value: Any) -> bytes | None:
    return bytes(value) if value is not None else None


def record_of(row: Sequence[Any]) -> RecordRow:
    """A ``RecordRow`` from a ``SELECT {RECORD_COLS}`` row (extra trailing columns are ignored)."""
    r = list(row[:RECORD_WIDTH])
    r[18] = _blob(r[18])
    return RecordRow(*r)


def record_values(row: RecordRow) -> list[Any]:
    """``row`` as the values of an ``INSERT INTO records ({RECORD_COLS})``."""
    return [row.record_id, row.tenant, row.workspace, row.candidate_id, row.record_digest, row.payload_digest,
            row.state, row.trust_class, row.principal, row.agent_id, row.valid_t, row.valid_t_end,
            row.expires_at_ms, row.derivative_rule, row.accepted_at_ms, row.accepted_cursor, row.state_cursor,
            row.successor_id, row.sealed_body, row.key_slot, row.session, row.captured_at_ms]


def candidate_of(row: Sequence[Any]) -> CandidateRow:
    """A ``CandidateRow`` from a ``SELECT {CANDIDATE_COLS}`` row."""
    r = list(row)
    r[10] = json.loads(r[10])
    r[11] = _blob(r[11])
    r[14] = json.loads(r[14]) if r[14] else None
    return CandidateRow(*r)


def candidate_values(row: CandidateRow) -> list[Any]:
    """``row`` as the values of an ``INSERT INTO candidates ({CANDIDATE_COLS})``."""
    return [row.candidate_id, row.tenant, row.workspace, row.principal, row.agent_id, row.session, row.state,
            row.payload_digest, row.record_digest, row.trust_class, json.dumps(row.facts, sort_keys=True),
            row.sealed_envelope, row.captured_at_ms, row.cursor,
            json.dumps(row.decision, sort_keys=True) if row.decision else None, row.key_slot]


def scope_of(row: Sequence[Any]) -> ScopeRow:
    """A ``ScopeRow`` from a ``SELECT {SCOPE_COLS}`` row."""
    return ScopeRow(row[0], row[1], row[2], tuple(json.loads(row[3])), int(row[4]), int(row[5]), row[6])


def event_of(r: Sequence[Any]) -> Event:
    """An ``Event`` from a ``SELECT {EVENT_COLS}`` row."""
    return Event(r[0], r[1], int(r[2]), r[3], r[4], r[5], r[6], r[7], int(r[8]), json.loads(r[9]), r[10], r[11])


def event_values(e: Event) -> list[Any]:
    """``e`` as the values of an ``INSERT INTO journal``."""
    return [e.tenant, e.workspace, e.cursor, e.event_id, e.operation, e.target, e.from_state, e.to_state, e.at_ms,
            json.dumps(e.body, sort_keys=True), e.prev_digest, e.event_digest]


def key_destruction_of(row: Sequence[Any]) -> KeyDestruction:
    return KeyDestruction(row[0], int(row[1]), row[2], row[3])


def host_key_of(r: Sequence[Any]) -> HostKeyRow:
    """A ``HostKeyRow`` from a ``SELECT {HOST_KEY_COLS}`` row."""
    return HostKeyRow(key_id=r[0], public_key_pem=r[1], added_at_ms=int(r[2]),
                      tenants=tuple(json.loads(r[3] or "[]")), all_tenants=bool(r[4]),
                      maintenance_scopes=tuple(json.loads(r[5] or "[]")))


def host_key_values(row: HostKeyRow) -> list[Any]:
    return [row.key_id, row.public_key_pem, row.added_at_ms, json.dumps(list(row.tenants)), row.all_tenants,
            json.dumps(list(row.maintenance_scopes))]


def audit_values(doc: dict[str, Any]) -> list[Any]:
    """An audit document as the values of the ``audit`` table's ``AUDIT_KEYS`` columns."""
    return [json.dumps(doc[k], sort_keys=True) if k == "decisions" else stored_audit_field(doc, k)
            for k in AUDIT_KEYS]


def audit_doc(row: Sequence[Any]) -> dict[str, Any]:
    """The audit document of a ``SELECT {AUDIT_KEYS}`` row (the fields its digest covers)."""
    d = dict(zip(AUDIT_KEYS, row, strict=True))
    d["seq"] = int(d["seq"])
    d["decisions"] = json.loads(d["decisions"])
    return digested_audit_doc(d)


def tombstone_doc(row: Sequence[Any]) -> dict[str, Any]:
    return {**dict(zip(TOMBSTONE_KEYS, row, strict=True)), "cursor": int(row[4])}
