"""semantic_v5 (and v6, which keeps it) through the real core (docs/search.md, "The query's embedding"): the query's
embedding leaves out the words most of the scope's records contain, such as a speaker's name in
a conversation captured one turn per memory. The name still counts in the lexical list (BM25
gives it a low IDF), but it no longer makes every turn of that speaker look alike to the vector
list, so the turn that answers in other words ("made lasagna" for "cook") is found."""

from __future__ import annotations

import dataclasses

import pytest

from engram_core.contract.scope import Scope
from engram_core.rpc.server import RunningCore
from engram_core.services.ranking import semantic_v4
from engram_core.services.reading import embedding_text
from tests.support.search_support import SEMANTIC, Client, activate

DAY = 86_400_000

# Caroline's small talk, in half the turns with her name and none about food or cooking.
CHAT = [
    "Caroline: hey! how have you been?",
    "Melanie: good, thanks! what about you?",
    "Caroline: work has been crazy, but good.",
    "Melanie: did you do anything fun this weekend?",
    "Caroline: made lasagna last night, recipe from my grandma",
    "Melanie: that sounds amazing!",
    "Caroline: the weather has been awful here.",
    "Melanie: it's finally sunny here!",
    "Caroline: I need a vacation tbh",
    "Melanie: any plans for the summer?",
    "Caroline: not yet, maybe a trip somewhere.",
    "Melanie: we should catch up more often.",
    "Caroline: talk soon!",
    "Melanie: bye! take care",
]


@pytest.fixture(scope="module")
def chat(core: RunningCore) -> dict[str, str]:
    ana = Client(core, workspace="chat-v5")
    activate(core, workspace="chat-v5")
    t = ana.clock.now_ms() - 3 * DAY
    return {text: ana.remember(text, t=t - 30 * DAY * i) for i, text in enumerate(CHAT)}


def test_the_answer_in_other_words_is_found_once_the_name_is_left_out(core: RunningCore, chat: dict[str, str]) -> None:
    ana = Client(core, workspace="chat-v5")
    res = ana.search("What did Caroline cook?", capability_policy=SEMANTIC)
    assert res["rank_receipt"]["profile"] == "semantic_v6" and res["rank_receipt"]["profile_version"] == "6"
    ids = [p["record"]["record_id"] for p in res["records"]]
    assert ids[0] == chat["Caroline: made lasagna last night, recipe from my grandma"]


def test_version_4_stays_selectable_with_its_own_digest(core: RunningCore, chat: dict[str, str]) -> None:
    assert core.memory is not None
    v5 = core.memory.reading.profiles["semantic"]
    v4 = semantic_v4(v5.model_id or "", needs_network=v5.needs_network)
    assert v4.config_digest() != v5.config_digest()
    assert v5.config()["semantic"]["query_embedding"]["share"] == "0.35"
    assert "query_embedding" not in v4.config()["semantic"]
    # The same search with version 4 (the whole question embedded): a cursor or receipt of one
    # version never passes for the other, and the name made every turn of Caroline's alike.
    ana = Client(core, workspace="chat-v5")
    core.memory.reading.profiles["semantic"] = v4
    try:
        res = ana.search("What did Caroline cook?", capability_policy=SEMANTIC)
    finally:
        core.memory.reading.profiles["semantic"] = v5
    assert res["rank_receipt"]["profile"] == "semantic_v4"
    assert res["rank_receipt"]["profile_config_digest"] == v4.config_digest()
    ids = [p["record"]["record_id"] for p in res["records"]]
    assert ids[0] != chat["Caroline: made lasagna last night, recipe from my grandma"]


def test_only_the_scope_s_common_words_leave_the_embedding(core: RunningCore, chat: dict[str, str]) -> None:
    """Statistics are the scope's own: a name common in one scope and rare in another is left out
    of the query's embedding in the first only; a query made only of common words keeps them all
    (an embedding of nothing would match nothing), and stop words are never looked up."""
    other = Client(core, workspace="notes-v5")
    activate(core, workspace="notes-v5")
    t = other.clock.now_ms() - DAY
    for text in ("Caroline owns the billing service.", "The billing service runs nightly.",
                 "Deploys go out on Tuesdays.", "The staging database is refreshed on Mondays."):
        other.remember(text, t=t)
    assert core.memory is not None
    profile = core.memory.reading.profiles["semantic"]
    hasher = core.core.hasher
    query = "What did Caroline cook?"
    with core.core.store.read() as tx:
        chat_stats = tx.lexical_stats(Scope("acme", "chat-v5"), hasher.query_terms(query))
        notes_stats = tx.lexical_stats(Scope("acme", "notes-v5"), hasher.query_terms(query))
        only_name = tx.lexical_stats(Scope("acme", "chat-v5"), hasher.query_terms("Caroline?"))
    assert embedding_text(profile, hasher, query, chat_stats) == "what did cook"
    assert embedding_text(profile, hasher, query, notes_stats) == query  # 1 of 4 notes: not common
    assert embedding_text(profile, hasher, "Caroline?", only_name) == "Caroline?"
    v4 = dataclasses.replace(profile, embed_common_share=0.0)
    assert embedding_text(v4, hasher, query, chat_stats) == query
