"""Several cores over one PostgreSQL store (issue 28): `engram serve --store` processes on the
session's test cluster (tests/pg_cluster.py). The core and MCP test helpers are reused: put
their directories on sys.path. ``replicas``: two cores over one fresh database and one key
directory, the scope acme/alpha activated."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
for _sub in ("core", "mcp"):
    if str(_TESTS / _sub) not in sys.path:
        sys.path.append(str(_TESTS / _sub))

from core_support import activate  # noqa: E402 - found through the path set above
from pg_cluster import Database  # noqa: E402
from replicas import Replica, replica_pair  # noqa: E402


@pytest.fixture
def replicas(pg_database: Database, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    with replica_pair(pg_database.conninfo, tmp_path / "keys", pg_database.env) as (a, b):
        activate(a)  # type: ignore[arg-type]
        yield a, b
