"""Commit announcements between cores (issue 28; engram_core/store/postgres/change_feed.py): a
core over a shared PostgreSQL store that holds a scope's index brings it to another core's
write as soon as that core announces its COMMIT, before any read of the scope comes, and keeps
doing so after its listening session was cut. Reads never depend on it (they catch up
themselves: test_two_replicas.py); these tests watch the index with no read in between."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from core_support import Client, activate
from pg_cluster import Database

from engram_core.app.composition import RunningCore, start_core


@pytest.fixture
def cores(pg_database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunningCore, RunningCore]]:
    for name, value in pg_database.env.items():
        monkeypatch.setenv(name, value)
    writer = start_core(tmp_path / "keys", store_url=pg_database.conninfo, semantic=False)
    try:
        activate(writer)
        follower = start_core(tmp_path / "keys", store_url=pg_database.conninfo, semantic=False)
    except BaseException:
        writer.stop()
        raise
    try:
        yield writer, follower
    finally:
        follower.stop()
        writer.stop()


def _eventually(what: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.02)
    return what()


def _listening_sessions(db: Database) -> list[int]:
    with db.connect() as con:
        return [r[0] for r in con.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'engram-listen' AND query ILIKE 'LISTEN%'")]


def test_a_core_follows_another_cores_writes_before_any_read(cores: tuple[RunningCore, RunningCore]) -> None:
    writer, follower = cores
    written = Client(writer).remember("Change feed: the storm petrel nests on the outer skerry.")
    Client(follower).search("storm petrel")  # the follower loads the scope: its index now holds it
    index = follower.core.store
    assert index.document_count() == 1

    added = Client(writer).remember("Change feed: the storm petrel feeds at night.")
    assert _eventually(lambda: index.document_count() == 2), "the follower's index did not follow the write"

    Client(writer).call("forget", {"record_id": written, "idempotency_key": "feed-forget-0001", "reason_ref": "r:x"},
                        grant=True)
    assert _eventually(lambda: index.document_count() == 1), "the follower's index did not follow the forget"
    found = {r["record"]["record_id"] for r in Client(follower).search("storm petrel")["records"]}
    assert found == {added}


def test_a_cut_listening_session_listens_again(cores: tuple[RunningCore, RunningCore], pg_database: Database) -> None:
    writer, follower = cores
    Client(writer).remember("Change feed: the fulmar glides on stiff wings.")
    Client(follower).search("fulmar")
    index = follower.core.store
    assert _eventually(lambda: len(_listening_sessions(pg_database)) == 2)  # one per core
    with pg_database.connect() as con:
        con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'engram-listen'")
    assert _eventually(lambda: len(_listening_sessions(pg_database)) == 2), "a listener did not come back"

    Client(writer).remember("Change feed: the fulmar spits oil at intruders.")
    assert _eventually(lambda: index.document_count() == 2), "the follower's index did not follow after the cut"
