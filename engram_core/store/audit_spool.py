"""The audit spool: durable audit rows of calls that change nothing (reads, refusals), appended
to a file and moved into the ``audit`` table in batches.

A read's audit row must be durable before the read answers (SPEC §1: the call's ``auditId``
appears in the audit log). One DuckDB INSERT in its own transaction cost ~2.4 ms, most of it
DuckDB's per-statement and per-transaction work, not the disk (an append and ``fdatasync`` of
one line here: ~0.3 ms). So a standalone row is appended here as one canonical-JSON line and
synced; the store moves the spooled rows into the ``audit`` table in one transaction once a
batch has built up, before any snapshot reader starts (so every snapshot sees each row
acknowledged before it), at close, and at open after a crash.

The rows are the same documents as the table's, in the same hash chain: sequence numbers
and ``prev_digest`` are assigned under the store's write lock, so spooled and transactional
rows interleave exactly as they were written. A row that reached the table but not the
truncation of the spool (a crash in between) is skipped when the spool is moved again.

Only the last line can be torn (an append that failed or was cut by a crash was never
acknowledged): it is dropped on recovery. Anything else unreadable is corruption and refuses
the open, as a broken journal does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engram_core.contract.canonical import canonical_json
from engram_core.contract.errors import Code, EngramError

SPOOL_NAME = "audit.spool"


class AuditSpool:
    """Append-only file of audit row documents not yet in the ``audit`` table. Not thread-safe:
    the store calls it under its audit lock, one batch of rows at a time."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / SPOOL_NAME
        self.pending: list[dict[str, Any]] = self._recover()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size
        self._broken = False

    def _recover(self) -> list[dict[str, Any]]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        *lines, _tail = raw.split(b"\n")  # text after the last newline: a torn append
        rows: list[dict[str, Any]] = []
        good = 0  # bytes of the rows kept
        for i, line in enumerate(lines):
            try:
                rows.append(json.loads(line))
            except ValueError:
                if i < len(lines) - 1:
                    raise EngramError(Code.JOURNAL_CORRUPT, f"audit spool line {i + 1} unreadable") from None
                break  # the last line, never synced whole: its append was not acknowledged
            good += len(line) + 1
        if good < len(raw):
            # Cut the torn tail so that the next append starts on a line of its own.
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        return rows

    def append(self, docs: list[dict[str, Any]]) -> None:
        """Append rows durably with one write and one ``fdatasync`` (the store's group commit of
        concurrent reads' rows), or raise STORE_UNAVAILABLE having appended none of them."""
        if self._broken:
            raise EngramError(Code.STORE_UNAVAILABLE, "audit spool unusable since a failed append")
        lines = b"".join(canonical_json(doc) + b"\n" for doc in docs)
        try:
            written = os.write(self._fd, lines)
            if written != len(lines):
                raise OSError("short write")
            os.fdatasync(self._fd)
        except OSError as exc:
            self._undo()
            raise EngramError(Code.STORE_UNAVAILABLE, f"audit write failed: {type(exc).__name__}") from None
        self._size += len(lines)
        self.pending.extend(docs)

    def _undo(self) -> None:
        """Cut a failed append off; if even that fails, refuse every later append (fail closed)."""
        try:
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except OSError:
            self._broken = True

    def clear(self) -> None:
        """The pending rows are committed to the ``audit`` table: start the spool afresh."""
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self._size = 0
        self.pending = []

    def close(self) -> None:
        os.close(self._fd)
