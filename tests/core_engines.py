"""The engines the core-level suites run on (issue 28): every core a test starts, in-process
(``start_core``) or as an ``engram serve`` process, keeps its store on the leg's engine.

``duckdb``: the store is the DuckDB file in the core's data directory, as ``engram serve --data``.
``postgresql``: a fresh database of the session's cluster (tests/pg_cluster.py) per data
directory, the data directory being the core's key directory, as ``engram serve --store URL
--key-dir DIR``. The same data directory always maps to the same database, so a test that stops a
core and starts another over the same directory (a restart, a crash) finds its store again.
Databases are dropped when the fixture that made them ends (tests/conftest.py: ``stores`` per
test, ``module_stores`` per module).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pg_cluster import Database, PgCluster

DUCKDB, POSTGRESQL = "duckdb", "postgresql"
ENGINES = (DUCKDB, POSTGRESQL)


class EngineStores:
    """Stores of one engine, one per data directory, for the cores of a test or a module."""

    def __init__(self, engine: str, cluster: PgCluster | None) -> None:
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r} (engines: {', '.join(ENGINES)})")
        if (engine == POSTGRESQL) != (cluster is not None):
            raise ValueError("the PostgreSQL leg, and it only, needs the session's cluster")
        self.engine = engine
        self._pg = cluster
        self._databases: dict[Path, Database] = {}
        self._made: dict[str, float] = {}  # database name -> when it was made (its WAL is newer)

    @property
    def is_postgresql(self) -> bool:
        return self.engine == POSTGRESQL

    def _cluster(self) -> PgCluster:
        assert self._pg is not None, "a DuckDB store has no cluster"
        return self._pg

    def database(self, data_dir: Path) -> Database:
        """The PostgreSQL database of ``data_dir`` (created on first use)."""
        assert self.is_postgresql, "a DuckDB store has no database"
        key = Path(data_dir).resolve()
        if key not in self._databases:
            made = time.time() - 1.0  # file times may be coarser than the clock
            self._databases[key] = self._cluster().create_database("core")
            self._made[self._databases[key].name] = made
        return self._databases[key]

    def store_url(self, data_dir: Path) -> str | None:
        """``start_core``'s ``store_url`` for a core of ``data_dir`` (None: the DuckDB file in it)."""
        return self.database(data_dir).conninfo if self.is_postgresql else None

    def start_core(self, data_dir: Path, **kw: Any) -> Any:  # -> RunningCore
        """``engram_core.app.composition.start_core`` on this engine."""
        from engram_core.app.composition import start_core

        return start_core(Path(data_dir), store_url=self.store_url(data_dir), **kw)

    def serve_args(self, data_dir: Path) -> list[str]:
        """Where ``engram serve`` keeps its store: ``--data DIR`` or ``--store URL --key-dir DIR``."""
        if self.is_postgresql:
            return ["--store", self.database(data_dir).conninfo, "--key-dir", str(data_dir)]
        return ["--data", str(data_dir)]

    @property
    def env(self) -> dict[str, str]:
        """What a process the test starts needs to reach the store (the password file: PostgreSQL)."""
        return dict(self._cluster().env) if self.is_postgresql else {}

    def process_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    @contextmanager
    def open_store(self, data_dir: Path) -> Iterator[Any]:  # -> Store
        """The store of ``data_dir``, opened as its (stopped) core opens it, to read it straight
        after a crash: chains, what is half-applied, what was acknowledged."""
        from engram_core.app.composition import build_vault
        from engram_core.app.engines import StoreConfig, open_store

        config = StoreConfig.from_options(Path(data_dir), self.store_url(data_dir))
        vault = build_vault(config)
        store = open_store(config, vault=vault, load_index=False, audit_devices=None)
        try:
            yield store
        finally:
            store.close()
            closer = getattr(vault, "close", None)
            if closer is not None:
                closer()

    def blobs(self, data_dir: Path) -> dict[str, bytes]:
        """The bytes of every file a store's contents can be in, by path: the data directory's and,
        on PostgreSQL, the database's heap files (after a CHECKPOINT: what the server holds in
        shared buffers is written out) and the WAL segments written since the database was made
        (the cluster's WAL is shared by the session's databases: older segments hold none of it).
        What a test that nothing secret or forgotten reached storage reads."""
        files = [p for p in sorted(Path(data_dir).rglob("*")) if p.is_file()]
        if self.is_postgresql:
            cluster = self._cluster()
            db = self.database(data_dir)
            with db.connect() as con:
                con.execute("CHECKPOINT")
            files += [p for p in sorted(cluster.database_dir(db).rglob("*")) if p.is_file()]
            since = self._made[db.name]
            files += [p for p in sorted((cluster.data / "pg_wal").glob("0*"))
                      if p.is_file() and p.stat().st_mtime >= since]
        return {str(p): p.read_bytes() for p in files}

    def close(self) -> None:
        """Drop the databases made (their cores are stopped by then: fixtures end in reverse)."""
        databases, self._databases = list(self._databases.values()), {}
        for db in databases:
            self._cluster().drop_database(db)


def _run(tx: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    duck = getattr(tx, "_all", None)
    if duck is not None:
        return list(duck(sql, list(params)))
    return list(tx._query(sql.replace("?", "%s"), list(params)))  # psycopg's placeholders


def rows(tx: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of a plain SQL statement (``?`` placeholders) on either engine's transaction, for
    tests that read tables straight."""
    return _run(tx, sql, params)


def one(tx: Any, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
    """The first row of ``rows`` (None when there is none)."""
    found = _run(tx, sql, params)
    return found[0] if found else None
