"""The engines the core-level suites run on (issue 28): every core a test starts, in-process
(``start_core``) or as an ``engram serve`` process, keeps its store on the leg's engine.

``duckdb``: the store is the DuckDB file in the core's data directory, as ``engram serve --data``.
``postgresql``: a fresh database of the session's cluster (tests/support/pg_cluster.py) per data
directory, the data directory being the core's key directory, as ``engram serve --store URL
--key-dir DIR``. It is a copy of the session's migrated template (schema only: what a core's first
open would migrate into an empty database), or, for a test about migrating at open, an empty one
(``empty_database``). The same data directory always maps to the same database, so a test that stops a
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

from tests.support.pg_cluster import Database, PgCluster, wal_stream

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
        self._empty: set[Path] = set()  # data directories whose database was made empty

    @property
    def is_postgresql(self) -> bool:
        return self.engine == POSTGRESQL

    def _cluster(self) -> PgCluster:
        assert self._pg is not None, "a DuckDB store has no cluster"
        return self._pg

    def database(self, data_dir: Path) -> Database:
        """The PostgreSQL database of ``data_dir`` (created on first use: a copy of the session's
        migrated template, ``PgCluster.migrated_database``)."""
        return self._database(data_dir, migrated=True)

    def empty_database(self, data_dir: Path) -> Database:
        """As ``database``, but made empty (from ``template0``): the core that opens it first
        migrates it, for a test about what that open does. Ask before anything else asks for the
        database of ``data_dir``."""
        key = Path(data_dir).resolve()
        assert key not in self._databases or key in self._empty, f"the database of {data_dir} is made already"
        return self._database(data_dir, migrated=False)

    def _database(self, data_dir: Path, *, migrated: bool) -> Database:
        assert self.is_postgresql, "a DuckDB store has no database"
        key = Path(data_dir).resolve()
        if key not in self._databases:
            made = time.time() - 1.0  # file times may be coarser than the clock
            cluster = self._cluster()
            self._databases[key] = cluster.migrated_database("core") if migrated else cluster.create_database("core")
            if not migrated:
                self._empty.add(key)
            self._made[self._databases[key].name] = made
        return self._databases[key]

    def store_url(self, data_dir: Path) -> str | None:
        """``start_core``'s ``store_url`` for a core of ``data_dir`` (None: the DuckDB file in it)."""
        return self.database(data_dir).conninfo if self.is_postgresql else None

    def start_core(self, data_dir: Path, **kw: Any) -> Any:  # -> RunningCore
        """``engram_core.app.composition.start_core`` on this engine. The semantic channel is off
        unless the test asks for it (``semantic=True``): loading the model and embedding every
        admission is what a test about the semantic channel pays for, and no other."""
        from engram_core.app.composition import start_core

        kw.setdefault("semantic", False)
        return start_core(Path(data_dir), store_url=self.store_url(data_dir), **kw)

    def open_core(self, data_dir: Path, **kw: Any) -> Any:  # -> (Core, bound, TrustedHostKeys)
        """``engram_core.app.composition.open_core`` on this engine (a core without a server;
        the semantic channel off unless asked for, as ``start_core``)."""
        from engram_core.app.composition import open_core

        kw.setdefault("semantic", False)
        return open_core(Path(data_dir), store_url=self.store_url(data_dir), **kw)

    def key_store(self, data_dir: Path) -> str:
        """A restore's ``key_store`` naming where the data keys of the core of ``data_dir`` are
        (its database; "" on DuckDB: ``key_dir``'s file vault holds them)."""
        return self.database(data_dir).conninfo if self.is_postgresql else ""

    def restore_key_args(self, key_dir: Path, store_of: Path | None = None) -> list[str]:
        """``engram admin restore``'s options naming the key store of a backup's source core:
        ``--key-dir DIR`` (its file vault) on DuckDB, ``--key-dir DIR --key-store URL`` (its KEK
        ring and the database its data keys are wrapped in) on PostgreSQL. ``store_of``: the data
        directory whose store holds the keys, when ``key_dir`` is a copy of its key files."""
        args = ["--key-dir", str(key_dir)]
        if self.is_postgresql:
            args += ["--key-store", self.key_store(store_of or key_dir)]
        return args

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
        """The environment of a process the test starts (``engram serve``, ``engram admin``): the
        semantic channel off (``ENGRAM_SEMANTIC=off``) unless the test's own environment says
        otherwise, as ``start_core``'s cores."""
        return {"ENGRAM_SEMANTIC": "off", **os.environ, **self.env}

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

    @contextmanager
    def sql(self, data_dir: Path) -> Iterator[SqlSession]:
        """A plain SQL connection to the (stopped) store of ``data_dir``, as someone who can write
        the database file (DuckDB) or the database (PostgreSQL) has: what a test that tampers
        with the store uses. Its changes are committed when the block ends."""
        if self.is_postgresql:
            with self.database(data_dir).connect() as con:
                yield SqlSession(con, "%s")
        else:
            import duckdb

            con = duckdb.connect(str(Path(data_dir) / "engram.duckdb"))
            try:
                yield SqlSession(con, "?")
            finally:
                con.close()

    def tamper(self, data_dir: Path, statement: str) -> None:
        """Run one SQL statement on the (stopped) store of ``data_dir``. On DuckDB in a process of
        its own, so that DuckDB's per-process instance cache cannot hide the change from the core
        started next; on PostgreSQL over a connection of its own."""
        if self.is_postgresql:
            with self.sql(data_dir) as session:
                session.run(statement)
            return
        import subprocess
        import sys

        path = str(Path(data_dir) / "engram.duckdb")
        code = f"import duckdb; c = duckdb.connect({path!r}); c.execute({statement!r}); c.close()"
        subprocess.run([sys.executable, "-c", code], check=True)

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
            segments = [p for p in sorted((cluster.data / "pg_wal").glob("0*"))
                        if p.is_file() and p.stat().st_mtime >= since]
            blobs = _read_present(files + segments)
            # A record split across WAL pages is whole only with the page headers cut out.
            blobs["pg_wal (records joined across pages)"] = wal_stream(segments)
            return blobs
        return _read_present(files)

    def close(self) -> None:
        """Drop the databases made (their cores are stopped by then: fixtures end in reverse)."""
        databases, self._databases = list(self._databases.values()), {}
        self._empty.clear()
        for db in databases:
            self._cluster().drop_database(db)


class SqlSession:
    """A plain SQL connection of either engine, statements written with ``?`` placeholders."""

    def __init__(self, con: Any, placeholder: str) -> None:
        self._con, self._placeholder = con, placeholder

    def _execute(self, sql: str, params: Sequence[Any]) -> Any:
        return self._con.execute(sql.replace("?", self._placeholder), list(params) or None)

    def run(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._execute(sql, params)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._execute(sql, params).fetchall()]

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        found = self.all(sql, params)
        return found[0] if found else None


def _run(tx: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    etx = getattr(tx, "_etx", tx)  # a store transaction runs on its engine's (the kernel adds no SQL)
    duck = getattr(etx, "_all", None)
    if duck is not None:
        return list(duck(sql, list(params)))
    return list(etx._query(sql.replace("?", "%s"), list(params)))  # psycopg's placeholders


def rows(tx: Any, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of a plain SQL statement (``?`` placeholders) on either engine's transaction, for
    tests that read tables straight."""
    return _run(tx, sql, params)


def one(tx: Any, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
    """The first row of ``rows`` (None when there is none)."""
    found = _run(tx, sql, params)
    return found[0] if found else None


def _read_present(paths: list[Path]) -> dict[str, bytes]:
    """The bytes of each file by path, leaving out those gone since they were listed: the server
    deletes and rewrites some of its own (its relation cache's ``pg_internal.init``, temp files)
    while it runs, and a file no longer there holds nothing."""
    out: dict[str, bytes] = {}
    for p in paths:
        try:
            out[str(p)] = p.read_bytes()
        except FileNotFoundError:
            continue
    return out
