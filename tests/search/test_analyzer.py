"""The lexical analyzer v2 (docs/search.md): stop words and question words are not evidence,
Snowball stems match word forms, and postings made by an older analyzer are re-derived when the
core starts, never matched against queries analyzed the new way."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from engram_core.app.composition import RunningCore
from engram_core.contract.scope import Scope
from engram_core.services.lexical import ANALYZER_ID, analyze, query_terms, tokenize
from engram_core.services.maintenance import ANALYZER_META
from engram_core.store.projection import Projection, seal_projection
from engram_core.store.search_index import FIELD_CODE
from tests.support.core_engines import EngineStores
from tests.support.search_support import Client, activate


def test_analyzer_drops_stop_and_question_words_and_stems() -> None:
    assert analyze("The puppies were adopted by Melanie") == ["puppi", "adopt", "melani"]
    assert query_terms("is there anything about kubernetes?") == ["kubernet"]
    assert query_terms("Do you remember what Caroline said about the adoption?") == ["carolin", "adopt"]
    # a memory keeps words a query drops: "said" can be content there
    assert "said" in analyze("she said yes")


def test_a_stop_word_is_not_evidence(lexical_core: RunningCore) -> None:
    # Issue 17: "is there anything about kubernetes" put a Kafka record at the top for "about".
    bob = Client(lexical_core, workspace="stopwords")
    activate(lexical_core, workspace="stopwords")
    kafka = bob.remember("We chose Kafka for the events pipeline; it is about throughput.")
    assert bob.ids("is there anything about kubernetes") == []
    assert bob.ids("what about the events pipeline?") == [kafka]


def test_word_forms_match_through_stems(lexical_core: RunningCore) -> None:
    bob = Client(lexical_core, workspace="stems")
    activate(lexical_core, workspace="stems")
    rid = bob.remember("Melanie: we finally adopted two puppies last weekend")
    # A day apart: not a neighbour of the first (version 3 lends score between turns of one session).
    other = bob.remember("Melanie: the weekend was rainy", t=bob.clock.now_ms() - 86_400_000)
    assert bob.ids("when did Melanie adopt a puppy?")[0] == rid
    assert other not in bob.ids("adopting puppy")


def test_postings_of_an_older_analyzer_are_rederived_at_start(tmp_path: Path, stores: EngineStores) -> None:
    data = tmp_path / "old-store"
    running = stores.start_core(data, semantic=False)
    try:
        activate(running)
        ana = Client(running)
        rid = ana.remember("Melanie adopted puppies; the shelter called them the twins.")
        forgotten = ana.remember("Melanie adopted kittens before the puppies.")
        ana.forget(forgotten)
        hasher = running.core.hasher
    finally:
        running.stop()
    # Make it a store written by the v1 analyzer: postings of unstemmed tokens, stop words
    # included, no analyzer id (stores before v2 had none).
    # The projection is sealed under the record's key (store/projection.py): re-seal a v1 one.
    v1 = Counter(hasher.term(t) for t in tokenize("Melanie adopted puppies; the shelter called them the twins."))
    with stores.open_store(data) as store:
        with store.read() as tx:
            rec = tx.record(Scope("acme", "alpha"), rid)
        assert rec is not None
        key = store.data_key(rec)
    sealed = seal_projection(key, rid, Projection.of({FIELD_CODE["primary"]: v1}))
    with stores.sql(data) as con:
        con.run("UPDATE projections SET sealed = ? WHERE record_id = ?", [sealed, rid])
        con.run("DELETE FROM store_meta WHERE k = ?", [ANALYZER_META])

    running = stores.start_core(data, semantic=False)
    try:
        ana = Client(running)
        # "adopting a puppy" analyzes to adopt + puppi: only re-derived postings can match it.
        assert ana.ids("adopting a puppy") == [rid]
        assert ana.ids("them") == []  # no stop-word posting survived
        with running.core.store.read() as tx:
            assert tx.meta(ANALYZER_META) == ANALYZER_ID
            the = running.core.hasher.term("the")
            held = tx.projection(rid)
            assert held is not None and the not in {int(t) for terms, _ in held.fields.values() for t in terms}
            # the forgotten record stays without postings
            assert tx.postings_count(forgotten) == 0
    finally:
        running.stop()

