"""The search index a core builds at open, from the sealed projections, answers exactly as the
one the previous process kept up to date commit by commit (issue 14: the build streams rows and
projections into compact arrays, vectors held as float32)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from engram_core.clock import FixedClock
from engram_core.contract.scope import Scope
from engram_core.store import search_index
from engram_core.store.duckdb import engine as duckdb_store
from engram_core.store.search_index import IndexBuilder
from tests.support.search_support import SEMANTIC, Client, activate

QUERIES = ["pintail rollout canary", "pintail checklist", "rollback of the pintail canary", "eider migration plan",
           "how do we release the pintail service safely"]

TEXTS = [
    "Pintail rollout uses a canary in one region first.",
    "First a canary in one region uses pintail rollout.",  # the same words: a lexical tie, the id decides
    "Pintail checklist: canary, then rollback drill, then the rest.",
    "Eider migration plan: dual writes for a week, then cut over.",
    "Rollback of the pintail canary takes one command.",
    "The pintail service is released behind a flag, region by region.",
    "Eider migration plan was approved by the data team.",
]


# The tie's two texts are kept as context (what was said, not a decision): the same words as a
# second decision would be a restatement the admission policy rejects (issue 59), and a tie needs both.
TIE = frozenset(TEXTS[:2])


def _remember(ana: Client, text: str, t: int) -> str:
    if text not in TIE:
        return ana.remember(text, t=t)
    return ana.remember(text, t=t, components=[{"component_id": "c1", "kind": "context", "text": text,
                                               "citation_ids": ["cit1"]}])


def _answers(ana: Client) -> list[Any]:
    """Every page of every query, lexical and semantic: ids, scores and the receipts' counts."""
    out = []
    for query in QUERIES:
        for channels in ({}, {"capability_policy": SEMANTIC}):
            pages, page = [], ana.search(query, limit=3, **channels)
            while True:
                pages.append(([(p["record"]["record_id"], p["score"], p["rank"]) for p in page["records"]],
                              page["rank_receipt"]["candidate_count"], page["rank_receipt"]["system_as_of"]))
                if "next_page_cursor" not in page:
                    break
                page = ana.search(query, limit=3, page_cursor=page["next_page_cursor"], **channels)
            out.append((query, bool(channels), pages))
    return out


def _first_core(tmp_path: Path, stores, clock: FixedClock) -> tuple[Any, Client, int]:
    """A core serving the semantic channel on a new data directory, its scope activated: the
    core, a client and a valid time a day back (the tests' records' time)."""
    running = stores.start_core(tmp_path / "data", clock=clock, semantic=True)
    try:
        activate(running, clock=clock)
        return running, Client(running, clock=clock), clock.now_ms() - 86_400_000
    except BaseException:
        running.stop()
        raise


def test_a_restarted_core_answers_every_search_as_before(tmp_path: Path, stores) -> None:
    clock = FixedClock(time.time_ns() // 1_000_000)  # the same instant in both processes: recency is equal
    running, ana, t = _first_core(tmp_path, stores, clock)
    try:
        ids = [_remember(ana, text, t) for text in TEXTS]
        ana.forget(ids[3])
        before = _answers(ana)
        assert any(len(pages) > 1 for _, _, pages in before)  # paging is covered
        assert ids[3] not in str(before) and ids[0] in str(before) and ids[1] in str(before)
    finally:
        running.stop()
    running = stores.start_core(tmp_path / "data", clock=clock, semantic=True)
    try:
        assert _answers(Client(running, clock=clock)) == before
    finally:
        running.stop()


def test_the_vector_sketch_changes_no_answer(tmp_path: Path, stores, monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8 sketch (``engram_core/store/vector_sketch.py``) changes which rows the float64
    pass computes, never an answer: through a real core, with the sketch from the first vector,
    records admitted after a search built it and one forgotten, every page of every search equals
    what a restarted core answers without a sketch."""
    clock = FixedClock(time.time_ns() // 1_000_000)
    monkeypatch.setattr(search_index.tuning, "SKETCH_FROM", 0)
    running, ana, t = _first_core(tmp_path, stores, clock)
    try:
        ids = [_remember(ana, TEXTS[i], t) for i in (0, 3, 4)]
        ana.search(QUERIES[0], limit=3, capability_policy=SEMANTIC)  # builds the sketch
        ids += [_remember(ana, TEXTS[i], t) for i in (2, 5, 6)]
        ana.forget(ids[1])
        with running.core.store.search_index(Scope("acme", "alpha")) as index:
            assert index._scopes[("acme", "alpha")].sketches  # the searches below read it
        sketched = _answers(ana)
        assert ids[1] not in str(sketched) and ids[5] in str(sketched)
    finally:
        running.stop()
    monkeypatch.setattr(search_index.tuning, "SKETCH_FROM", 10**9)
    running = stores.start_core(tmp_path / "data", clock=clock, semantic=True)
    try:
        with running.core.store.search_index(Scope("acme", "alpha")) as index:
            assert not index._scopes[("acme", "alpha")].sketches
        assert _answers(Client(running, clock=clock)) == sketched
    finally:
        running.stop()


def test_a_core_without_the_semantic_channel_builds_no_sketch_at_open(tmp_path: Path, stores,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The sketch serves the semantic channel's first pass alone: a core that does not serve the
    channel leaves it unbuilt when it loads a scope (0.5 s per 100k vectors), one that does
    builds it then, and the lexical answers are the same either way."""
    clock = FixedClock(time.time_ns() // 1_000_000)
    monkeypatch.setattr(search_index.tuning, "SKETCH_FROM", 0)
    running, ana, t = _first_core(tmp_path, stores, clock)
    try:
        for text in TEXTS:
            _remember(ana, text, t)
    finally:
        running.stop()
    answers = {}
    for semantic in (False, True):
        running = stores.start_core(tmp_path / "data", clock=clock, semantic=semantic)
        try:
            with running.core.store.search_index(Scope("acme", "alpha")) as index:
                scope = index._scopes[("acme", "alpha")]
                assert scope.vectors  # the vectors are loaded either way
                assert bool(scope.sketches) == semantic
            ana = Client(running, clock=clock)
            answers[semantic] = [[p["record"]["record_id"] for p in ana.search(q, limit=5)["records"]]
                                 for q in QUERIES]
        finally:
            running.stop()
    assert answers[False] == answers[True] and any(answers[False])


def test_the_builder_indexes_only_records_whose_projection_opened() -> None:
    """A row whose projection never comes (its key was destroyed) is not indexed: not counted,
    not ranked, no row copy served."""
    from engram_core.store.port import RecordRow
    from engram_core.store.projection import Projection, encode

    def row(rid: str) -> RecordRow:
        return RecordRow(rid, "acme", "alpha", "cand", "rd", "pd", "accepted_current", "asserted", "user:ana",
                         "agent", 1, None, None, "make-ineligible", 1, 1, 1, None, b"body", 7)

    builder = IndexBuilder()
    for rid in ("rec_a", "rec_b", "rec_c"):
        builder.add_row(row(rid))
    vector = np.full(4, 0.5, dtype=np.float32)
    for rid in ("rec_c", "rec_a"):  # any order; rec_b's never arrives
        builder.add_projection(rid, encode(Projection.of({0: {11: 2, 12: 1}}, "m", vector.tolist())))
    index = builder.finish()
    assert index.document_count() == 2
    assert set(index.rows(Scope("acme", "alpha"), ["rec_a", "rec_b", "rec_c"])) == {"rec_a", "rec_c"}
    near = index.nearest(Scope("acme", "alpha"), "m", [0.5] * 4, now_ms=10, max_accepted_cursor=10, min_similarity=-1.0,
                         limit=10)
    assert [r[0] for r in near] == ["rec_a", "rec_c"] and near[0][1] == 1.0
    stats = index.stats(Scope("acme", "alpha"), [11, 12])
    assert stats.docs == 2 and stats.df == {11: 2, 12: 2}
    matrix, _ = index._scopes[("acme", "alpha")].vectors["m"]
    assert matrix.dtype == np.float32  # 4 bytes a value, not 8


def _cached(con: duckdb.DuckDBPyConnection) -> int:
    return sum(n for tag, n in con.execute("SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall()
               if tag == "BASE_TABLE")


@pytest.mark.duckdb_only(reason="DuckDB's block cache and memory limit after the index build (PostgreSQL's "
                               "shared buffers are the server's, sized by its operator)")
def test_building_the_index_leaves_no_table_blocks_cached_and_the_limit_as_it_was(
        tmp_path: Path, monkeypatch, stores) -> None:
    """The build reads every row and projection once; DuckDB would keep those blocks cached (up
    to 80% of RAM by default: gigabytes at a million records). After the build they are evicted
    and DuckDB's memory limit is the one it had."""
    running = stores.start_core(tmp_path / "data", semantic=False)
    try:
        activate(running)
        ana = Client(running)
        ids = [ana.remember(f"Scaup note {i}: " + " ".join(f"w{i}x{k}" for k in range(400))) for i in range(40)]
        store = running.core.store
        con = store.engine._con
        limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        store.checkpoint()  # the rows in table blocks, as in a store that was reopened
        # What a scan of both tables leaves in DuckDB's cache, as the build used to.
        con.execute("SELECT count(*), sum(octet_length(sealed_body)) FROM records").fetchall()
        con.execute("SELECT count(*), sum(octet_length(sealed)) FROM projections").fetchall()
        assert _cached(con) > 1 << 20
        monkeypatch.setattr(duckdb_store, "CACHE_AFTER_BUILD", 0, raising=False)
        store.reload_indexes()
        assert _cached(con) < 1 << 20
        assert con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == limit
        assert ana.ids("w7x3") == [ids[7]]  # and the rebuilt index serves
    finally:
        running.stop()
