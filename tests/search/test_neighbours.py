"""Neighbours through the real core (docs/search.md, "Neighbours"), the rule version 3 brought:
turns of one session, admitted one after another with the session's date as valid time, lend each
other score, so the turn that answers a question is found through the turn that asked it. Records
with other valid times (captured in other sessions) never lend, an ineligible neighbour lends
nothing, and the score's query relevance is the best record's own. Version 4's links between
records captured live in one session: test_live_neighbours.py."""

from __future__ import annotations

import pytest

from engram_core.contract.scope import Scope
from engram_core.rpc.server import RunningCore
from tests.support.search_support import SEMANTIC, Client, activate

DAY = 86_400_000


@pytest.fixture(scope="module")
def chat(lexical_core: RunningCore) -> dict[str, str]:
    ana = Client(lexical_core, workspace="chat")
    activate(lexical_core, workspace="chat")
    session = ana.clock.now_ms() - 3 * DAY  # every turn dated with its session, as a transcript import does
    other = session - 30 * DAY
    turns = {
        "hello": ("Melanie: hey, how was your weekend?", session),
        "ask": ("Melanie: what breed is Luna?", session),
        "answer": ("Caroline: she's a beagle, about 3 months old", session),
        "later": ("Caroline: gotta run, talk soon", session),
        "far1": ("Caroline: work is crazy", session),
        "far2": ("Melanie: same here", session),
        "far3": ("Caroline: ok bye", session),
        "far4": ("Melanie: bye!", session),
        # Another session: it mentions a beagle too, but is nobody's neighbour here.
        "elsewhere": ("Caroline: the neighbours have a beagle as well", other),
        "pair_q": ("Melanie: which dog food do you buy for Luna?", other + DAY),
    }
    return {k: ana.remember(text, t=t) for k, (text, t) in turns.items()}


def test_the_answer_turn_is_found_through_the_turn_that_asked(lexical_core: RunningCore, chat: dict[str, str]) -> None:
    ana = Client(lexical_core, workspace="chat")
    res = ana.search("What breed is Luna?")
    ids = [p["record"]["record_id"] for p in res["records"]]
    # "answer" holds no query term ("breed", "luna"): only its neighbour "ask" lends it a score.
    assert ids[0] == chat["ask"]
    assert chat["answer"] in ids
    # Neighbours are the 3 records either side in admission order with the same valid time.
    assert chat["hello"] in ids and chat["later"] in ids and chat["far1"] in ids
    assert chat["far2"] not in ids and chat["far3"] not in ids
    # A turn of another session (other valid time) matches "luna" on its own and lends nothing.
    assert chat["pair_q"] in ids and chat["elsewhere"] not in ids
    # Candidates: the two matches ("ask", "pair_q") and the four neighbours of "ask".
    assert res["rank_receipt"]["candidate_count"] == 6
    # The relevance in the top score is the best record's own match, not what it borrowed.
    top = res["records"][0]["score"]
    assert 0 < top <= 1.0


def test_a_forgotten_neighbour_lends_nothing(lexical_core: RunningCore) -> None:
    ana = Client(lexical_core, workspace="forgetful")
    activate(lexical_core, workspace="forgetful")
    t = ana.clock.now_ms() - DAY
    asked = ana.remember("Jon: which exam did you pass?", t=t)
    answer = ana.remember("Gina: the CPA one, woohoo", t=t)  # no word the query or its relatives have
    assert set(ana.ids("exam passed")) == {asked, answer}
    ana.forget(asked)
    # Its words are gone and so is what it lent: nothing in the scope matches any more.
    assert ana.ids("exam passed") == []


def test_notes_of_other_sessions_dated_apart_never_lend(lexical_core: RunningCore) -> None:
    ana = Client(lexical_core, workspace="notes")
    activate(lexical_core, workspace="notes")
    now = ana.clock.now_ms()
    kafka = ana.remember("We chose Kafka for the events pipeline.", t=now - 2_000)
    other = ana.remember("The staging database is refreshed on Mondays.", t=now - 1_000)
    assert ana.ids("kafka") == [kafka]
    assert other not in ana.ids("kafka")


def test_semantic_profile_lends_in_both_lists(core: RunningCore) -> None:
    """A turn with no word of the query and a low similarity to it ("ok, talk soon") is found
    beside the turn that matches, in the semantic profile too; the same words in another session
    are not (semantic_v2 returned neither)."""
    ana = Client(core, workspace="chat-semantic")
    activate(core, workspace="chat-semantic")
    t = ana.clock.now_ms() - 2 * DAY
    ask = ana.remember("Melanie: what breed is Luna?", t=t)
    beside = ana.remember("Caroline: ok, talk soon", t=t)
    elsewhere = ana.remember("Caroline: ok, talk soon!", t=t - 20 * DAY)
    query = "What breed is Luna?"
    res = ana.search(query, capability_policy=SEMANTIC)
    ids = [p["record"]["record_id"] for p in res["records"]]
    assert res["rank_receipt"]["profile"] == "semantic_v6"
    assert ids[0] == ask and beside in ids and elsewhere not in ids
    # The vector list itself lends: "beside" is below the threshold on its own similarity.
    with core.core.store.read() as tx:
        model = core.core.embedder.model_id
        vector = core.core.embedder.embed(query)
        cursor = core.core.store.committed_scope(Scope("acme", "chat-semantic")).last_cursor
        args = dict(now_ms=ana.clock.now_ms(), max_accepted_cursor=cursor, min_similarity=0.2, limit=100)
        plain = [r[0] for r in tx.rank_vectors(Scope("acme", "chat-semantic"), model, vector, **args)]
        lent = tx.rank_vectors(Scope("acme", "chat-semantic"), model, vector, neighbours=(3, 0.5, 0, 0), **args)
    assert beside not in plain and beside in [r[0] for r in lent]
    assert dict((r[0], r[1]) for r in lent)[beside] < 0.2  # rows carry the record's own similarity
