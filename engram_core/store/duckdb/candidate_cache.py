"""The candidates the sole writer committed lately, as committed: an admission reads the
candidate its capture wrote a moment before, and this copy saves that query (a cache that
only ever saves a query, as the engine contract allows a sole writer).

Used only under the writer lock, by write transactions: a candidate a batch's members changed
(or may have changed through SQL) is read from the database, never from here, until the batch
commits and its changes are applied. Rows hold what the table holds (the envelope sealed), and
the copy is bounded by rows and by envelope bytes."""

from __future__ import annotations

import json
from dataclasses import replace

from engram_core.store.port import CandidateRow

MAX_ROWS = 1024
MAX_ENVELOPE_BYTES = 16 << 20


class CommittedCandidates:
    def __init__(self, *, max_rows: int = MAX_ROWS, max_bytes: int = MAX_ENVELOPE_BYTES) -> None:
        self._rows: dict[str, CandidateRow] = {}  # oldest first
        self._bytes = 0
        self._max_rows = max_rows
        self._max_bytes = max_bytes

    def get(self, candidate_id: str) -> CandidateRow | None:
        return self._rows.get(candidate_id)

    def clear(self) -> None:
        self._rows.clear()
        self._bytes = 0

    def committed(self, inserted: dict[str, CandidateRow],
                  changes: list[tuple[str, str, str | None, bool]]) -> None:
        """Apply what a transaction committed: its new candidates, then its state changes in
        order ((id, state, decision JSON or None, drop the envelope), as the UPDATE applied them)."""
        for row in inserted.values():
            self._put(row)
        for candidate_id, state, decision, drop in changes:
            held = self._rows.get(candidate_id)
            if held is not None:
                self._put(replace(held, state=state, decision=json.loads(decision) if decision else held.decision,
                                  sealed_envelope=None if drop else held.sealed_envelope))

    def _put(self, row: CandidateRow) -> None:
        old = self._rows.pop(row.candidate_id, None)
        if old is not None:
            self._bytes -= len(old.sealed_envelope or b"")
        self._rows[row.candidate_id] = row
        self._bytes += len(row.sealed_envelope or b"")
        while self._rows and (len(self._rows) > self._max_rows or self._bytes > self._max_bytes):
            oldest = self._rows.pop(next(iter(self._rows)))
            self._bytes -= len(oldest.sealed_envelope or b"")
