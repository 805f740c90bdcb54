"""The DuckDB engine of the store: one file, one writer process, SQL of its own.

Only the composition root, tests and tools name this package; core services are written
against ``engram_core.store.port`` alone (tests/unit/test_layering.py enforces it).
"""

from __future__ import annotations

from pathlib import Path

from engram_core.store.projection import DataKeys


def open_duckdb_store(data_dir: Path, *, keys: DataKeys | None, migrate: bool = True, load_index: bool = True):
    """The store kernel over a DuckDB file in ``data_dir`` (audit spool beside it)."""
    from engram_core.store.duckdb.engine import DuckDBEngine
    from engram_core.store.kernel import StoreKernel

    return StoreKernel(DuckDBEngine(data_dir, migrate=migrate, keys=keys), keys, spool_dir=data_dir,
                       load_index=migrate and load_index, recover=migrate)
