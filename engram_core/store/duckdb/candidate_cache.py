"""The candidates the sole writer committed lately, as committed: an admission reads the
candidate its capture wrote a moment before, and this copy saves that query (a cache that
only ever saves a query, as the engine contract allows a sole writer).

Written under the writer lock, after each COMMIT and before its writers are answered. Read by
write transactions, for a candidate their batch neither wrote nor changed (or may have changed
through SQL: else the database, as the batch sees it), and by readers of the latest committed
state (``read(snapshot=False)``; never a snapshot's reader, to which a newer row would be wrong).
Rows hold what the table holds (the envelope sealed), bounded by rows and by envelope bytes; a
reader racing a change misses the row at worst and reads the table."""

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
        final = dict(inserted)  # each row put once, as committed: a reader never sees a step between
        for candidate_id, state, decision, drop in changes:
            held = final.get(candidate_id) or self._rows.get(candidate_id)
            if held is not None:
                final[candidate_id] = replace(held, state=state,
                                              decision=json.loads(decision) if decision else held.decision,
                                              sealed_envelope=None if drop else held.sealed_envelope)
        for row in final.values():
            self._put(row)

    def _put(self, row: CandidateRow) -> None:
        old = self._rows.pop(row.candidate_id, None)
        if old is not None:
            self._bytes -= len(old.sealed_envelope or b"")
        self._rows[row.candidate_id] = row
        self._bytes += len(row.sealed_envelope or b"")
        while self._rows and (len(self._rows) > self._max_rows or self._bytes > self._max_bytes):
            oldest = self._rows.pop(next(iter(self._rows)))
            self._bytes -= len(oldest.sealed_envelope or b"")
