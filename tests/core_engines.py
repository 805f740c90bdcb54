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
from collections.abc import Iterator
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
            self._databases[key] = self._cluster().create_database("core")
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

    def files(self, data_dir: Path) -> list[Path]:
        """Every file a store's bytes can be in: the data directory's and, on PostgreSQL, the
        database's heap files and the cluster's WAL (what a test that no secret reached storage
        must read)."""
        roots = [Path(data_dir)]
        if self.is_postgresql:
            cluster = self._cluster()
            db = self.database(data_dir)
            with db.connect() as con:
                con.execute("CHECKPOINT")  # what the server holds in shared buffers reaches the heap files
            roots += [cluster.database_dir(db), cluster.data / "pg_wal"]
        return [p for root in roots for p in sorted(root.rglob("*")) if p.is_file()]

    def close(self) -> None:
        """Drop the databases made (their cores are stopped by then: fixtures end in reverse)."""
        databases, self._databases = list(self._databases.values()), {}
        for db in databases:
            self._cluster().drop_database(db)


def rows(tx: Any, sql: str) -> list[tuple[Any, ...]]:
    """Rows of a plain SQL statement on either engine's transaction (tests that read tables)."""
    run = getattr(tx, "_all", None) or tx._query
    return list(run(sql))
