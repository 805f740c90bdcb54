"""The ``records`` table's columns as ``RecordRow`` reads them, shared by the store and the search index."""

from __future__ import annotations

from engram_core.store.port import RecordRow

RECORD_COLS = (
    "record_id, tenant, workspace, candidate_id, record_digest, payload_digest, state, trust_class, principal, "
    "agent_id, valid_t, valid_t_end, expires_at_ms, derivative_rule, accepted_at_ms, accepted_cursor, "
    "state_cursor, successor_id, sealed_body, key_slot, session, captured_at_ms"
)
RECORD_WIDTH = 22  # columns in RECORD_COLS: a query's extra columns start here
# The columns from migration 3 to 11: what a migration step before 12 may read (``record_of`` fills
# the later ones with None).
RECORD_COLS_BEFORE_12 = RECORD_COLS.removesuffix(", session, captured_at_ms")


def record_of(row: tuple) -> RecordRow:
    """A ``RecordRow`` from a ``SELECT {RECORD_COLS}`` row (extra trailing columns are ignored)."""
    r = list(row[:RECORD_WIDTH])
    r[18] = bytes(r[18]) if r[18] is not None else None
    return RecordRow(*r)
