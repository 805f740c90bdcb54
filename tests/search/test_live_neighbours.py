"""Version 4's neighbours through the real core (docs/search.md, "Neighbours"): an agent capturing a
conversation as it goes dates each turn with its own instant, so no two turns share a valid time;
records captured in one host-bound session close together in time (capture instants and valid
times each within two hours) lend each other score all the same. Another session, a turn captured
hours later, notes of one session dated days apart, a forgotten turn and another scope lend
nothing. Records admitted before migration 12 take their session from their candidate."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from engram_core.app.composition import RunningCore
from engram_core.clock import FixedClock
from tests.support.search_support import Client, activate

HOUR = 3_600_000
DAY = 24 * HOUR
QUESTION = "What breed is Luna?"


def _live_chat(ana: Client, clock: FixedClock) -> dict[str, str]:
    """Turns said (and captured) 45 s apart in session ``s-chat``, one of another session between
    them, and the last turn of the session three hours on."""
    def say(text: str, *, session: str = "s-chat", gap: int = 45_000) -> str:
        clock.advance(gap)
        return ana.remember(text, t=clock.now_ms(), session=session)

    return {
        "hello": say("Melanie: hey, how was your weekend?"),
        "ask": say("Melanie: what breed is Luna?"),
        # Admitted between the question and its answer, at the same minute, by another session.
        "other": say("Jon: is the printer jammed again?", session="s-other"),
        "answer": say("Caroline: she's a beagle, about 3 months old"),
        "later": say("Caroline: gotta run, talk soon", gap=3 * HOUR),
    }


def test_turns_captured_live_in_one_session_lend_each_other(clocked: tuple[RunningCore, FixedClock]) -> None:
    running, clock = clocked
    ana = Client(running, clock=clock)
    chat = _live_chat(ana, clock)
    res = ana.search(QUESTION)
    ids = [p["record"]["record_id"] for p in res["records"]]
    assert res["rank_receipt"]["profile"] == "offline_lexical_v5"
    # "answer" holds no query term: its neighbour "ask" (two places on, same session) lends to it.
    assert ids[0] == chat["ask"]
    assert set(ids) == {chat["ask"], chat["hello"], chat["answer"]}
    # Another session's turn between them lends and borrows nothing; nor does a turn of the same
    # session captured three hours later (beyond the window), though it is within three places.
    assert res["rank_receipt"]["candidate_count"] == 3
    # The top score's query relevance is the best record's own match, not what it borrowed.
    assert 0 < res["records"][0]["score"] <= 1.0
    # Forgotten, the question lends nothing: no record left holds a query term.
    ana.forget(chat["ask"])
    assert ana.ids(QUESTION) == []


def test_what_a_session_captured_in_one_burst_but_dated_apart_does_not_lend(
        clocked: tuple[RunningCore, FixedClock]) -> None:
    """A backfill: notes about different days captured one after another in one session are not
    one conversation (the synthetic harness's notes are captured this way)."""
    running, clock = clocked
    ana = Client(running, clock=clock)
    now = clock.now_ms()
    kafka = ana.remember("We chose Kafka for the events pipeline.", t=now - 3 * DAY, session="s-backfill")
    ana.remember("The staging database is refreshed on Mondays.", t=now - 2 * DAY, session="s-backfill")
    ana.remember("Deploys freeze on the last Friday of the quarter.", t=now - DAY, session="s-backfill")
    assert ana.ids("kafka") == [kafka]


def test_another_scope_never_lends(clocked: tuple[RunningCore, FixedClock]) -> None:
    """The same session id and the same instants in another workspace: nothing of one scope reaches
    the other's neighbourhood."""
    running, clock = clocked
    activate(running, workspace="beta", clock=clock)
    ana, beta = Client(running, clock=clock), Client(running, workspace="beta", clock=clock)
    clock.advance(45_000)
    ana.remember("Melanie: what breed is Luna?", t=clock.now_ms(), session="s-chat")
    beagle = beta.remember("Caroline: she's a beagle, about 3 months old", t=clock.now_ms(), session="s-chat")
    clock.advance(45_000)
    park = beta.remember("Caroline: she loves the park", t=clock.now_ms(), session="s-chat")
    assert beta.ids(QUESTION) == []
    # Within the scope the session's turns do lend: the park turn is found through the beagle.
    assert beta.ids("beagle") == [beagle, park]


@pytest.mark.duckdb_only(reason="rewrites the DuckDB file back into DuckDB's schema version 11 (its DDL and "
                               "migration ledger); PostgreSQL's migration 3, which fills the same columns, has no "
                               "such rewind here")
def test_records_admitted_before_migration_12_take_their_session_from_their_candidate(tmp_path: Path,
                                                                                        stores) -> None:
    """Migration 12 adds the record's session and capture instant and fills them from the
    candidate row, which outlives admission: a store upgraded from version 11 lends as one
    written by this version."""
    clock = FixedClock(1_900_000_000_000)
    data = tmp_path / "data"
    running = stores.start_core(data, clock=clock, semantic=False)
    try:
        activate(running, clock=clock)
        ana = Client(running, clock=clock)
        chat = _live_chat(ana, clock)
        before = ana.ids(QUESTION)
    finally:
        running.stop()
    assert chat["answer"] in before
    con = duckdb.connect(str(_database(data)))
    try:  # the store as version 11 left it (DuckDB alters no table that an index depends on)
        con.execute("DROP INDEX records_scope")
        con.execute("DROP INDEX records_payload")
        con.execute("ALTER TABLE records DROP COLUMN session")
        con.execute("ALTER TABLE records DROP COLUMN captured_at_ms")
        con.execute("CREATE INDEX records_scope ON records (tenant, workspace)")
        con.execute("CREATE INDEX records_payload ON records (payload_digest)")
        for column in ("tenants", "all_tenants", "maintenance_scopes"):  # and as before 13 (host key bindings)
            con.execute(f"ALTER TABLE trusted_host_keys DROP COLUMN {column}")
        con.execute("DELETE FROM schema_migrations WHERE version >= 12")
    finally:
        con.close()
    running = stores.start_core(data, clock=clock, semantic=False)
    try:
        assert Client(running, clock=clock).ids(QUESTION) == before
    finally:
        running.stop()


def _database(data: Path) -> Path:
    found = sorted(p for p in data.iterdir() if p.suffix in (".duckdb", ".db"))
    assert found, list(data.iterdir())
    return found[0]
