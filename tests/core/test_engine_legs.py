"""The core-level suites (core, MCP, reliability, admin, operations, search) run on both engines
(issue 28), and nothing lets a PostgreSQL leg go
missing unnoticed: a test that starts a core other than through the engine fixtures (which
would run on DuckDB only) fails here, and a run without PostgreSQL fails its legs, never skips
them (tests/conftest.py, tests/support/core_engines.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SUITES = ("core", "mcp", "reliability", "admin", "ops", "search")
# The helpers of those suites (tests/support holds every suite's helpers).
SUITE_HELPERS = ("core_support", "governance_support", "mcp_helpers", "core_support_fuzz", "reliability_crash",
                 "reliability_support", "admin_support", "ops_support", "search_support")

# Files that start a core on the embedded store on purpose, each with why: they are about the
# one-machine experience itself, which is DuckDB (`engram init`, `engram serve --data`).
EMBEDDED_ON_PURPOSE = {
    "mcp/test_first_run.py": "a new user's first run: engram init and engram serve --data, as the README says",
    "mcp/test_mcp_local_users.py": "local users' setup: engram serve --data in a home directory",
    "admin/test_first_steps.py": "a new user's first minutes: engram init, tools/serve and the files a data "
                                 "directory holds (git ignores them all), as the README says",
    "core/test_intent_log.py": "DuckDB's intent log: a core in a child process dies before DuckDB commits "
                               "what it answered",
}
# A core started in-process (start_core/open_core called bare) or `engram serve --data`.
_BARE_START = re.compile(r"(?<![\w.])(?:start_core|open_core)\(|\"serve\",\s*\"--data\"")


def test_every_core_of_the_core_level_suites_comes_from_the_engine_fixtures() -> None:
    bare = []
    files = [(suite, path) for suite in SUITES for path in sorted((TESTS / suite).glob("*.py"))]
    files += [("support", TESTS / "support" / f"{name}.py") for name in SUITE_HELPERS]
    for suite, path in files:
        rel = f"{suite}/{path.name}"
        if rel in EMBEDDED_ON_PURPOSE:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _BARE_START.search(line) and not line.lstrip().startswith("#"):
                bare.append(f"{rel}:{n}: {line.strip()}")
    assert not bare, ("start these cores through the stores/module_stores fixtures (stores.start_core, "
                      "stores.serve_args), or mark the test duckdb_only with its reason:\n" + "\n".join(bare))


def test_a_missing_postgresql_fails_a_core_level_leg_and_skips_none(tmp_path: Path) -> None:
    empty = tmp_path / "no-postgresql-here"
    empty.mkdir()
    leg = "tests/core/test_core_operations.py::test_capture_replay_and_digest_conflict[postgresql]"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", leg], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "ENGRAM_PG_BIN": str(empty)})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "PostgreSQL 15 is not installed" in out and "run tools/setup" in out, out[-3000:]
    assert "skipped" not in out and "1 error" in out, out[-3000:]
