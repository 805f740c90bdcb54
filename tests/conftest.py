"""Session-wide test fixtures: the PostgreSQL cluster the PostgreSQL tests run on (``pg_cluster.py``).

The cluster starts on first use only, so a run that needs no PostgreSQL starts none; a test
that needs it and finds PostgreSQL 15 missing fails (never skips), saying to run tools/setup.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pg_cluster import Database, PgCluster, PostgresMissing, start_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    try:
        cluster = start_cluster()
    except PostgresMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    # Clients in this process find the password where libpq looks for it; processes the tests
    # start are given the same environment (Database.env).
    previous = os.environ.get("PGPASSFILE")
    os.environ["PGPASSFILE"] = str(cluster.passfile)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("PGPASSFILE", None)
        else:
            os.environ["PGPASSFILE"] = previous
        cluster.destroy()


@pytest.fixture
def pg_database(pg_cluster: PgCluster) -> Iterator[Database]:
    """A fresh, empty database of the session's cluster, dropped after the test."""
    db = pg_cluster.create_database()
    try:
        yield db
    finally:
        pg_cluster.drop_database(db)
