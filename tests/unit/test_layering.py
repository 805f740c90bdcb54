"""The dependency rule, enforced: core services and adapters know the Store port, never an engine.

Services, backup and the MCP adapter import ``engram_core.store.port`` (and the shared
``chain``/``projection`` modules); an engine (DuckDB: ``engram_core.store.duckdb`` or ``duckdb``
itself; PostgreSQL: ``engram_core.store.postgres``, ``psycopg`` or ``psycopg_pool``) is named only
by the composition root, ``engram_core/rpc/server.py``, and by the engines' own packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PREFIXES = ("duckdb", "engram_core.store.duckdb", "psycopg", "psycopg_pool", "engram_core.store.postgres")
ENGINE_DIRS = ("duckdb", "postgres")  # under engram_core/store: the engines themselves
COMPOSITION_ROOT = "engram_core/rpc/server.py"


def engine_imports(source: str) -> list[str]:
    """Every module an engine import in ``source`` names, at any depth (function-level imports too)."""
    found: list[str] = []

    def is_engine(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") or name.startswith(p + "_") for p in ENGINE_PREFIXES)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if is_engine(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if is_engine(node.module):
                found.append(node.module)
            else:  # ``from engram_core.store import duckdb``
                found += [f"{node.module}.{a.name}" for a in node.names if is_engine(f"{node.module}.{a.name}")]
    return found


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _port_only_files() -> list[Path]:
    files = sorted((ROOT / "engram_core" / "services").glob("*.py"))
    files.append(ROOT / "engram_core" / "backup.py")
    files += sorted((ROOT / "adapters").rglob("*.py"))
    return files


def test_the_checker_sees_every_form_of_engine_import() -> None:
    source = (
        "import duckdb\n"
        "from engram_core.store.duckdb.store import DuckDBTx\n"
        "from engram_core.store import duckdb as engine\n"
        "import engram_core.store.duckdb_store\n"
        "def late():\n    from duckdb import connect\n"
        "from engram_core.store.port import Tx\nfrom engram_core.store.chain import GENESIS\n"
    )
    assert sorted(engine_imports(source)) == sorted([
        "duckdb", "engram_core.store.duckdb.store", "engram_core.store.duckdb", "engram_core.store.duckdb_store",
        "duckdb",
    ])


@pytest.mark.parametrize("path", _port_only_files(), ids=_rel)
def test_services_backup_and_adapters_import_the_port_only(path: Path) -> None:
    assert engine_imports(path.read_text(encoding="utf-8")) == [], (
        f"{_rel(path)} imports a storage engine; use engram_core.store.port (Tx, Store)")


def test_the_walk_covers_the_services() -> None:
    names = {_rel(p) for p in _port_only_files()}
    assert {"engram_core/services/memory.py", "engram_core/services/core.py", "engram_core/services/maintenance.py",
            "engram_core/backup.py", "adapters/mcp/main.py"} <= names


def test_only_the_composition_root_names_the_engine() -> None:
    engine_dirs = [ROOT / "engram_core" / "store" / d for d in ENGINE_DIRS]
    naming = {
        _rel(p) for p in (ROOT / "engram_core").rglob("*.py")
        if not any(d in p.parents for d in engine_dirs) and engine_imports(p.read_text(encoding="utf-8"))
    }
    assert naming == {COMPOSITION_ROOT}
