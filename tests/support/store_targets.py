"""The engines the store conformance suite runs on, each as a *target*: a database it can open
stores over (several at once when the engine allows several writers), and processes it can
start against the same database.

A target opens the store the way the composition root does (the store kernel over the engine,
with the key vault), so the suite proves what services rely on: the ``Store``/``Tx`` port. Each
is an ``engram_core.store.conformance.Target``; the in-memory engine's ships with the suite
(``conformance/memory_target.py``), as the example for an engine written elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engram_core.crypto.keyvault import FileKeyVault
from engram_core.store.conformance.memory_target import MemoryTarget
from engram_core.store.conformance.stores import OpenedStores
from engram_core.store.kernel import StoreKernel

__all__ = ["DuckDBTarget", "MemoryTarget", "PostgresTarget"]


class DuckDBTarget(OpenedStores):
    """One DuckDB file: one store at a time (the fence refuses a second, in any process)."""

    name = "duckdb"
    several_writers = False
    processes = True  # another process can open its database (and is fenced off while this one has it)

    def __init__(self, root: Path, engine_class: Callable[..., Any] | None = None) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._engine_class = engine_class
        super().__init__()

    def open(self) -> StoreKernel:
        from engram_core.store.duckdb.engine import DuckDBEngine

        vault = FileKeyVault(self.data_dir)
        engine = (self._engine_class or DuckDBEngine)(self.data_dir, keys=vault)
        store = StoreKernel(engine, vault, spool_dir=self.data_dir)
        return self.keep(store, vault)


    def run_process(self, body: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``body`` (Python, with ``store`` opened on this target's database) in a process of its own."""
        script = "\n".join([
            "from pathlib import Path",
            "from engram_core.crypto.keyvault import FileKeyVault",
            "from engram_core.store.duckdb.engine import DuckDBEngine",
            "from engram_core.store.kernel import StoreKernel",
            f"data = Path({str(self.data_dir)!r})",
            "vault = FileKeyVault(data)",
            "store = StoreKernel(DuckDBEngine(data, keys=vault), vault, spool_dir=data)",
            "try:",
            textwrap.indent(textwrap.dedent(body).strip("\n"), "    "),
            "finally:",
            "    store.close()",
        ])
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)


class PostgresTarget(OpenedStores):
    """One PostgreSQL database (a fresh one of the session's test cluster): any number of stores
    at once, each a core of its own (its own pool, key vault and writer chain), and processes of
    their own, over the same database and the same KEK ring (a key directory they all mount)."""

    name = "postgresql"
    several_writers = True
    processes = True

    def __init__(self, root: Path, database: Any, engine_class: Callable[..., Any] | None = None,
                 pool_size: int = 4) -> None:
        self.root = root
        self.database = database  # tests/pg_cluster.Database
        self.key_dir = root / "keys"
        self.key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._engine_class = engine_class
        self._pool_size = pool_size
        super().__init__()

    def open(self) -> StoreKernel:
        from engram_core.store.postgres.engine import PostgresEngine
        from engram_core.store.postgres.keyvault import PgKeyVault

        engine = (self._engine_class or PostgresEngine)(self.database.conninfo, pool_size=self._pool_size)
        vault = PgKeyVault(self.database.conninfo, self.key_dir, pool_size=2)
        store = StoreKernel(engine, vault, spool_dir=None)
        return self.keep(store, vault)


    def run_process(self, body: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``body`` (Python, with ``store`` opened on this target's database) in a process of its
        own: another core. The password reaches it the way it reaches a deployed core, through
        PGPASSFILE in its environment."""
        script = "\n".join([
            "from pathlib import Path",
            "from engram_core.store.kernel import StoreKernel",
            "from engram_core.store.postgres.engine import PostgresEngine",
            "from engram_core.store.postgres.keyvault import PgKeyVault",
            f"url = {self.database.conninfo!r}",
            "engine = PostgresEngine(url, pool_size=4)",  # first: it migrates what the vault's tables are in
            f"vault = PgKeyVault(url, Path({str(self.key_dir)!r}), pool_size=2)",
            "store = StoreKernel(engine, vault, spool_dir=None)",
            "try:",
            textwrap.indent(textwrap.dedent(body).strip("\n"), "    "),
            "finally:",
            "    store.close()",
            "    vault.close()",
        ])
        env = {**os.environ, **self.database.env}
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                              env=env)

