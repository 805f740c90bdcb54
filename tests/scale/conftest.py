"""Several cores over one PostgreSQL store (issue 28): `engram serve --store` processes on the
session's test cluster (tests/support/pg_cluster.py). The core and MCP test helpers (tests/support) are
reused. ``replicas``: two cores over one fresh database and one key
directory, the scope acme/alpha activated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.core_support import activate
from tests.support.pg_cluster import Database
from tests.support.replicas import Replica, replica_pair


@pytest.fixture
def replicas(pg_database: Database, tmp_path: Path) -> Iterator[tuple[Replica, Replica]]:
    with replica_pair(pg_database.conninfo, tmp_path / "keys", pg_database.env) as (a, b):
        activate(a)  # type: ignore[arg-type]
        yield a, b
