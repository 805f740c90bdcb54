"""Time in the query (docs/search.md): a time the query names ranks by valid time, not recency."""

from __future__ import annotations

import datetime as dt

from engram_core.rpc.server import RunningCore
from engram_core.services.timeq import parse_time, proximity
from tests.support.search_support import SEMANTIC, Client, activate

DAY = 86_400_000
NOW = int(dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC).timestamp() * 1000)


def _day(ms: int) -> dt.date:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date()


def test_expressions_become_windows_and_leave_the_query() -> None:
    text, w = parse_time("what did we decide last spring", NOW)
    assert text == "what did we decide" and (_day(w.start_ms), _day(w.end_ms)) == (dt.date(2026, 3, 1),
                                                                                      dt.date(2026, 5, 31))
    text, w = parse_time("the ledger decision in March 2025", NOW)
    assert text == "the ledger decision" and (_day(w.start_ms), _day(w.end_ms)) == (dt.date(2025, 3, 1),
                                                                                      dt.date(2025, 3, 31))
    _, w = parse_time("the trip about two months ago", NOW)
    assert _day(w.start_ms) < dt.date(2026, 10, 1) < _day(w.end_ms) < dt.date(2026, 11, 1)
    _, w = parse_time("anything from yesterday?", NOW)
    assert _day(w.start_ms) == _day(w.end_ms) == dt.date(2026, 11, 29)
    # a month that is also a verb needs a preposition or a year; no time: the query is untouched
    assert parse_time("may I ask about the march route", NOW) == ("may I ask about the march route", None)
    # an open-ended bound is not a window
    assert parse_time("friends since 2016", NOW)[1] is None and parse_time("since March 2025", NOW)[1] is None
    assert parse_time("x" * 8000 + " in 2025", NOW)[1] is not None  # long untrusted input, linear patterns


def test_proximity_is_one_inside_and_halves_per_window_length() -> None:
    _, w = parse_time("in March 2025", NOW)
    assert proximity(w.start_ms + DAY, w) == 1.0
    length = w.end_ms - w.start_ms
    assert abs(proximity(w.end_ms + length, w) - 0.5) < 1e-9


def _month_year(ms: int) -> str:
    d = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return d.strftime("%B %Y")


def test_named_time_outranks_recency(core: RunningCore) -> None:
    activate(core, workspace="time")
    ana = Client(core, workspace="time")
    now = ana.clock.now_ms()
    old_t, new_t = now - 200 * DAY, now - 5 * DAY
    old = ana.remember("Decision: the ledger moves to PostgreSQL for transactions.", t=old_t)
    new = ana.remember("Decision: the ledger moves to Cassandra for write volume.", t=new_t)
    assert ana.ids("ledger decision")[0] == new  # no time named: the recent one first
    for channels in ({}, {"capability_policy": SEMANTIC}):
        assert ana.ids(f"what did we decide about the ledger in {_month_year(old_t)}", **channels)[0] == old
        assert ana.ids(f"what did we decide about the ledger in {_month_year(new_t)}", **channels)[0] == new
