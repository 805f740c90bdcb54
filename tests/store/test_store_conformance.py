"""The store conformance suite: every guarantee of the storage contract (store_checks.py), on
every engine. An engine is ready when it passes this file unchanged.

PostgreSQL runs on the session's own test cluster (tests/pg_cluster.py), a fresh database per
check; a missing PostgreSQL fails the run (tools/setup installs it), it never skips."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_checks import CHECKS
from store_targets import DuckDBTarget, PostgresTarget

# name -> (the test's request, a directory of its own) -> target
ENGINES: dict[str, Callable[[pytest.FixtureRequest, Path], Any]] = {
    "duckdb": lambda request, root: DuckDBTarget(root),
    "postgresql": lambda request, root: PostgresTarget(root, request.getfixturevalue("pg_database")),
}


@pytest.fixture(params=sorted(ENGINES))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made = ENGINES[request.param](request, tmp_path)
    yield made
    made.close_all()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_store_contract(target: Any, check: Callable[[Any], None]) -> None:
    check(target)
