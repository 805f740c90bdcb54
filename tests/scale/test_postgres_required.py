"""A run without PostgreSQL 15 fails its PostgreSQL legs, naming tools/setup; it never skips them
(CI must not pass with the second engine untested)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_missing_postgresql_fails_the_postgresql_tests_and_skips_none(tmp_path: Path) -> None:
    empty = tmp_path / "no-postgresql-here"
    empty.mkdir()
    leg = "tests/store/test_store_conformance.py::test_store_contract[postgresql-rows_of_another_scope_are_unknown]"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", leg], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "ENGRAM_PG_BIN": str(empty)})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "PostgreSQL 15 is not installed" in out and "run tools/setup" in out, out[-3000:]
    assert "skipped" not in out and "1 error" in out, out[-3000:]
