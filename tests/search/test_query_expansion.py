"""offline_lexical_v5 through the real core (docs/search.md, "Related words"): a query word's
WordNet relatives count as terms of weight 0.3, so the lexical channel finds an answer said in
other words ("cook" -> "made"), ranks a record holding the query's own word above one holding
only a relative, pins the weights with the first page (every later page, on any core, scores as
the first did), and leaves a scope without the relatives exactly as version 4 ranked it."""

from __future__ import annotations

import pytest

from engram_core.rpc.server import RunningCore
from engram_core.services.paging import Binding
from engram_core.services.ranking import OFFLINE_LEXICAL_V4, OFFLINE_LEXICAL_V5
from engram_core.store.page_pins import Pin, pin_from_json, pin_to_json
from engram_core.store.port import LexicalStats
from tests.support.search_support import Client, activate

DAY = 86_400_000
QUESTION = "What did Caroline cook?"
# Every turn dated a month from the next, each in a session of its own: nobody's neighbour.
CHAT = {
    "weather": "Caroline: the weather has been awful here.",
    "trip": "Caroline: not yet, maybe a trip somewhere.",
    "lasagna": "Caroline: made lasagna last night, recipe from my grandma",
}


@pytest.fixture(scope="module")
def chat(lexical_core: RunningCore) -> dict[str, str]:
    ana = Client(lexical_core, workspace="expansion")
    activate(lexical_core, workspace="expansion")
    t = ana.clock.now_ms() - 3 * DAY
    return {k: ana.remember(text, t=t - 30 * DAY * i) for i, (k, text) in enumerate(CHAT.items())}


def _with_profile(core: RunningCore, profile, query: str, workspace: str = "expansion") -> dict:  # type: ignore[no-untyped-def]
    assert core.memory is not None
    saved = core.memory.reading.profiles["lexical"]
    core.memory.reading.profiles["lexical"] = profile
    try:
        return Client(core, workspace=workspace).search(query)
    finally:
        core.memory.reading.profiles["lexical"] = saved


def test_the_answer_in_related_words_is_found(lexical_core: RunningCore, chat: dict[str, str]) -> None:
    res = Client(lexical_core, workspace="expansion").search(QUESTION)
    receipt = res["rank_receipt"]
    assert receipt["profile"] == "offline_lexical_v5" and receipt["profile_config_digest"] == \
        OFFLINE_LEXICAL_V5.config_digest()
    ids = [p["record"]["record_id"] for p in res["records"]]
    # "made" is a synonym of "cook" (its first senses): the oldest of Caroline's turns comes first.
    assert ids[0] == chat["lasagna"]
    # Version 4 matches the name alone in every turn, and the most recent leads.
    v4 = _with_profile(lexical_core, OFFLINE_LEXICAL_V4, QUESTION)
    assert v4["rank_receipt"]["profile_config_digest"] == OFFLINE_LEXICAL_V4.config_digest()
    assert [p["record"]["record_id"] for p in v4["records"]][0] == chat["weather"]


def test_the_query_s_own_word_outweighs_a_related_one(lexical_core: RunningCore) -> None:
    ana = Client(lexical_core, workspace="own-word")
    activate(lexical_core, workspace="own-word")
    t = ana.clock.now_ms() - DAY
    for n in range(3):  # so that "bake" is in fewer than 35 % of the scope's records
        ana.remember(f"Garden note {n}: water the tomatoes.", t=t - (n + 90) * DAY)
    related = ana.remember("Dinner plan: bake the salmon on Friday.", t=t)
    own = ana.remember("Dinner plan: cook the salmon on Friday.", t=t - 60 * DAY)  # older: only its word can lift it
    assert ana.ids("cook salmon")[:2] == [own, related]
    # A related word alone finds the record, below what the query's own word would score.
    res = ana.search("cook")
    assert [p["record"]["record_id"] for p in res["records"]] == [own, related]
    assert res["records"][1]["score"] < res["records"][0]["score"]


def test_a_scope_without_the_relatives_ranks_as_version_4(lexical_core: RunningCore) -> None:
    ana = Client(lexical_core, workspace="no-relatives")
    activate(lexical_core, workspace="no-relatives")
    for n in range(4):
        ana.remember(f"The grebe cache {n} is warmed nightly.", t=ana.clock.now_ms() - (n + 1) * DAY)
    v5 = ana.search("grebe cache warm")
    v4 = _with_profile(lexical_core, OFFLINE_LEXICAL_V4, "grebe cache warm", "no-relatives")
    assert [p["record"]["record_id"] for p in v5["records"]] == [p["record"]["record_id"] for p in v4["records"]]
    # The same scores but for recency's drift between the two calls' instants.
    assert [p["score"] for p in v5["records"]] == pytest.approx([p["score"] for p in v4["records"]], abs=1e-6)


def test_a_relative_most_of_the_scope_holds_counts_nowhere(lexical_core: RunningCore) -> None:
    """A related term in more than 35 % of the scope's records says nothing about which answers."""
    ana = Client(lexical_core, workspace="common-relative")
    activate(lexical_core, workspace="common-relative")
    t = ana.clock.now_ms() - DAY
    baked = [ana.remember(f"Bakery log {n}: we bake rye at dawn.", t=t - n * DAY) for n in range(2)]
    assert ana.ids("cook") == []  # "bake" is in every record of the scope
    others = [ana.remember(f"Bakery log {n}: the oven was serviced.", t=t - n * DAY) for n in range(2, 6)]
    assert set(ana.ids("cook")) == set(baked)  # in 2 of 6 records now: a relative that tells
    assert not set(ana.ids("cook")) & set(others)


def test_later_pages_score_with_the_pinned_weights(lexical_core: RunningCore) -> None:
    ana = Client(lexical_core, workspace="paged")
    activate(lexical_core, workspace="paged")
    now = ana.clock.now_ms()
    for n, verb in enumerate(("cook", "bake", "fry", "roast", "grill", "cook", "stew", "poach")):
        ana.remember(f"Kitchen rota {n}: {verb} the vegetables.", t=now - (n + 1) * DAY)
    whole = ana.ids("who cooks the vegetables", limit=10)
    assert len(whole) == 8
    assert ana.all_pages("who cooks the vegetables", limit=3) == whole


def test_a_pin_keeps_its_weights_where_every_core_reads_it() -> None:
    """What another core reads (PostgreSQL's shared pins) scores later pages with the same weights."""
    stats = LexicalStats(docs=10, avg_len={"primary": 4.0}, df={1: 2, -7: 3}, weights={-7: 0.3})
    pin = Pin(binding=Binding("p", "t", "w", "sha256:r", "sha256:p"), system_as_of=5, valid_as_of=6,
              candidate_count=3, created_ms=7, lexical_stats=stats, best_bm25=1.5)
    assert pin_from_json(pin_to_json(pin)) == pin
    # A pin written before version 5 (no weights) reads as every term weighing 1.
    old = pin_to_json(Pin(binding=pin.binding, system_as_of=5, valid_as_of=6, candidate_count=3, created_ms=7,
                          lexical_stats=LexicalStats(docs=10, avg_len={}, df={1: 2}))).replace(b',"weights":[]', b"")
    assert b"weights" not in old and pin_from_json(old).lexical_stats == LexicalStats(10, {}, {1: 2})
