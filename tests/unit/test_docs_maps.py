"""The maps in the docs resolve: every path docs/architecture.md's concept table names exists, and
docs/testing.md names every test directory (so a new directory cannot go undocumented)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _concept_table(text: str) -> list[str]:
    """The rows of the first table in the page: the concept → module map at its top."""
    rows: list[str] = []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows[2:]  # past the header and its rule


def test_every_path_in_the_architecture_concept_table_exists() -> None:
    rows = _concept_table((ROOT / "docs/architecture.md").read_text(encoding="utf-8"))
    assert len(rows) >= 20, "the concept table at the top of docs/architecture.md is missing or cut short"
    missing = []
    for row in rows:
        module_cell = row.split("|")[2]
        paths = re.findall(r"`([^`]+)`", module_cell)
        assert paths, f"a concept without a module: {row}"
        missing += [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_concept_table_names_what_a_newcomer_looks_for() -> None:
    concepts = {row.split("|")[1].strip() for row in _concept_table((ROOT / "docs/architecture.md").read_text("utf-8"))}
    wanted = {"tool-call pipeline", "store kernel", "DuckDB engine", "PostgreSQL engine", "key vault", "search index",
              "ranking", "policy engine", "decision log", "OAuth binding", "audit chain", "composition root"}
    assert wanted <= concepts, f"missing from the concept table: {sorted(wanted - concepts)}"


def test_docs_testing_names_every_test_directory() -> None:
    text = (ROOT / "docs/testing.md").read_text(encoding="utf-8")
    directories = sorted(p.name for p in (ROOT / "tests").iterdir()
                         if p.is_dir() and not p.name.startswith((".", "_")) and any(p.glob("test_*.py")))
    assert directories, "no test directories found"
    unnamed = [d for d in directories if f"`tests/{d}`" not in text]
    assert not unnamed, f"docs/testing.md does not name these test directories: {unnamed}"
