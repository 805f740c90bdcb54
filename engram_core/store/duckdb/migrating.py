"""Migrating a DuckDB file (the engine's part of ``engram_core/store/sql/ledger.py``): the
ledger checked against the code, each pending migration applied in its own transaction with its
Python step, and the file rewritten where a step leaves freed pages holding what it removed."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import duckdb

from engram_core.contract.errors import Code, EngramError
from engram_core.crypto.keyvault import record_data_key
from engram_core.store.duckdb.candidate_cache import CommittedCandidates
from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS
from engram_core.store.duckdb.tx import SCHEMA_VERSION
from engram_core.store.port import RecordRow, iter_chunks
from engram_core.store.projection import DataKeys, Projection, seal_projection
from engram_core.store.search_index import FIELD_CODE
from engram_core.store.sql.codecs import RECORD_COLS, record_of
from engram_core.store.sql.ledger import pending_migrations

# The records' columns from migration 3 to 11: what a migration step before 12 may read
# (``record_of`` fills the later ones with None).
RECORD_COLS_BEFORE_12 = RECORD_COLS.removesuffix(", session, captured_at_ms")


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    # One DuckDB worker thread: the store runs point reads and one-to-64-row writes, for which
    # DuckDB's parallel pipelines are pure scheduling cost (a one-row INSERT 0.37 ms instead of
    # 0.54-0.69 ms with two threads on this 2-core machine), and a second worker competes with
    # the Python threads for the cores. The big scans (index build at open, compaction) are
    # fetched and decoded in Python, which is their limit anyway.
    return duckdb.connect(str(path), config={"threads": 1})


class Migrating:
    """The engine's migrations (``DuckDBEngine`` mixes this in; the attributes are its own)."""

    _con: duckdb.DuckDBPyConnection
    _keys: DataKeys | None
    _candidates: CommittedCandidates
    path: Path
    data_dir: Path
    _exclusive: Callable[[], AbstractContextManager[None]]

    def check_migrations(self, *, apply: bool) -> list[int]:
        """Verify the ledger against the code; apply missing migrations when ``apply``."""
        con = self._con
        con.execute(LEDGER_DDL)
        pending = pending_migrations({int(v): c for v, c in con.execute(
            "SELECT version, checksum FROM schema_migrations ORDER BY version").fetchall()}, MIGRATIONS)
        if pending and not apply:
            raise EngramError(Code.MIGRATION_LEDGER_INVALID, "migrations pending")
        applied = []
        for m in pending:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(m.sql)
                if m.step is not None:
                    getattr(self, m.step)(con)
                con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, ?)",
                            [m.version, m.name, m.checksum, time.time_ns() // 1_000_000])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
            applied.append(m.version)
        return applied

    def seal_legacy_projections(self, con: duckdb.DuckDBPyConnection) -> None:
        """Migration 6: each record's plain postings and vector become one sealed projection,
        the plain tables go, and the file is rewritten once this commits (``_compact``)."""
        by_record: dict[str, dict[int, Counter[int]]] = {}
        for term, record_id, name, tf in con.execute("SELECT term, record_id, field, tf FROM postings").fetchall():
            by_record.setdefault(record_id, {}).setdefault(FIELD_CODE[name], Counter())[int(term)] = int(tf)
        vectors = {rid: (model, list(values)) for rid, model, values in
                   con.execute("SELECT record_id, model, embedding FROM vectors").fetchall()}
        # Migration 6 runs on the records table of its time: the columns before migration 12.
        rows = con.execute(f"SELECT {RECORD_COLS_BEFORE_12} FROM records WHERE record_id IN "
                           "(SELECT record_id FROM postings UNION SELECT record_id FROM vectors)").fetchall()
        sealed = []
        for found in rows:
            rec = record_of(found)
            key = self._record_key(rec)
            if key is None:
                continue  # its key is gone: the projection is unreadable anyway, like its body
            model, vector = vectors.get(rec.record_id, ("", None))
            projection = Projection.of(by_record.get(rec.record_id, {}), model, vector)
            sealed.append((rec.record_id, rec.tenant, rec.workspace, seal_projection(key, rec.record_id, projection)))
        for chunk in iter_chunks(sealed, 2048):
            con.execute("INSERT INTO projections SELECT unnest($1::VARCHAR[]), unnest($2::VARCHAR[]), "
                        "unnest($3::VARCHAR[]), unnest($4::BLOB[])", [list(c) for c in zip(*chunk, strict=True)])
        con.execute("DROP TABLE postings; DROP TABLE vectors; DROP TABLE field_stats")
        if rows:
            con.execute("INSERT OR REPLACE INTO store_meta VALUES ('compact_pending', 'migration 6')")

    def destructions_wrapped_by_active_generation(self, con: duckdb.DuckDBPyConnection) -> None:
        """Migration 10: destructions recorded before generations were tracked were wrapped by the
        KEKs up to the one active now; recorded as wrapped by it (pending until it retires)."""
        active = getattr(self._keys, "active_generation", None)
        if active is not None:
            con.execute("UPDATE key_destructions SET generation = ?", [int(active())])

    def _compact(self) -> None:
        """Rewrite the database into a fresh file and swap it in: DuckDB keeps freed pages (with
        whatever rows they held) in its file, a copy carries only live data. Crash-safe: the
        old file stays until the copy is complete and synced, and the pending mark is cleared
        only in the new file."""
        con = self._con
        con.execute("CHECKPOINT")
        fresh = self.path.with_name(self.path.name + ".compact")
        fresh.unlink(missing_ok=True)
        name = con.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        con.execute(f"ATTACH '{fresh}' AS engram_compact")
        con.execute(f'COPY FROM DATABASE "{name}" TO engram_compact')
        con.execute("DETACH engram_compact")
        con.close()
        fd = os.open(fresh, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(fresh, self.path)
        Path(str(self.path) + ".wal").unlink(missing_ok=True)
        dir_fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._con = connect(self.path)
        self._con.execute("DELETE FROM store_meta WHERE k = 'compact_pending'")
        self._con.execute("CHECKPOINT")

    def _record_key(self, rec: RecordRow) -> bytes | None:
        """Migration 6 only: the record's data key from the vault the engine was opened with."""
        if self._keys is None:
            raise EngramError(Code.STORE_UNAVAILABLE, "migration 6 needs the key vault")
        return record_data_key(self._keys, rec)

    def migrate(self) -> list[int]:
        """Re-verify the ledger and apply pending migrations, serialized with writers."""
        with self._exclusive():
            self._candidates.clear()
            answers = getattr(self, "_answers", None)  # a migration writes by condition: read keys again
            if answers is not None:
                answers.stale()
            return self.check_migrations(apply=True)

    def schema_version(self) -> int:
        return SCHEMA_VERSION

    def migration_code(self) -> list[dict[str, Any]]:
        return [{"version": m.version, "name": m.name, "checksum": m.checksum} for m in MIGRATIONS]

    def migration_ledger(self) -> list[dict[str, Any]]:
        # On a cursor of its own: the store's connection belongs to the writer, and DuckDB refuses
        # a statement on a connection busy in another thread (the writer's COMMIT then fails).
        cur = self._con.cursor()
        try:
            rows = cur.execute(
                "SELECT version, name, checksum, applied_at_ms FROM schema_migrations ORDER BY version").fetchall()
        finally:
            cur.close()
        return [{"version": r[0], "name": r[1], "checksum": r[2], "applied_at_ms": r[3]} for r in rows]

