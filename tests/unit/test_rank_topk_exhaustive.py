"""Issue 63: ``SearchIndex.rank``'s top-k is bit for bit the exhaustive ranking's.

The exhaustive ranking here scores every posting of every query term straight from the index's
postings (``_Scope.term_rows``: no cached contributions, no kept buffers, no first-page
pruning), sums them per document in posting order as ranking always has, scores every eligible
hit and orders them all by (score desc, valid time desc, record id asc). Corpora are drawn so
that many records tie: copies of one record (the same postings and valid time) differ only in
their record id, which must then decide, and queries of many terms (a capture's whole text)
sit beside queries of two common ones. Equality is exact: the same records, order and scores.
"""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_core.contract.scope import Scope
from engram_core.store import search_index
from engram_core.store.changes import RecordIndexed, RecordUnindexed
from engram_core.store.port import LexicalQuery, RecordRow
from engram_core.store.search_index import FIELD_CODE, FIELDS, Posting, RecordMeta, SearchIndex

WEIGHTS = {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}
K1, B, HALF_LIFE, LW = 1.2, 0.75, 30 * 86_400_000, 0.85
NOW = 1_800_000_000_000
DAY = 86_400_000


def _indexed(meta: RecordMeta, postings: list[Posting]) -> RecordIndexed:
    row = RecordRow(meta.record_id, "t", "w", "cand_" + meta.record_id, "sha256:" + "0" * 64, "sha256:" + "1" * 64,
                    "accepted_current", "asserted", "user:ana", "agent", meta.valid_t, None, None,
                    "make-ineligible", 0, meta.accepted_cursor, meta.state_cursor, None, None)
    return RecordIndexed(row, tuple(postings))


def _corpus(rnd: random.Random, n: int, vocabulary: int, copies: int) -> list[tuple[RecordMeta, list[Posting]]]:
    """``n`` records over ``vocabulary`` terms, Zipf-like (a few terms in most records); each
    drawn record comes ``copies`` times (ties but for the record id)."""
    weights = [1.0 / (t + 1) for t in range(vocabulary)]
    out: list[tuple[RecordMeta, list[Posting]]] = []
    while len(out) < n:
        postings = []
        for name in rnd.sample(FIELDS, rnd.randint(1, 3)):
            terms = rnd.choices(range(vocabulary), weights=weights, k=rnd.randint(1, 8))
            postings += [Posting(t, name, terms.count(t), len(terms)) for t in sorted(set(terms))]
        valid_t = NOW - rnd.choice([0, DAY, 40 * DAY, 400 * DAY])
        for _ in range(rnd.randint(1, copies)):
            i = len(out)
            # Record ids out of admission order, so that the id, not the document number, breaks ties.
            out.append((RecordMeta(f"rec_{rnd.randrange(10**6):06d}_{i:04d}", True, i + 1, i + 1, valid_t, None, None),
                        list(postings)))
    return out[:n]


def _exhaustive(index: SearchIndex, query: list[int], weights: dict[int, float], limit: int
                ) -> tuple[int, list[tuple[str, float, int]], float]:
    """Every posting of every query term scored and every hit ordered (see the module's text)."""
    scope = index._scopes[("t", "w")]  # noqa: SLF001 - the reference reads the postings themselves
    stats = index.stats(Scope("t", "w"), query)
    weight, inv_avg = np.zeros(len(FIELDS)), np.zeros(len(FIELDS))
    for name, w in WEIGHTS.items():
        avg = stats.avg_len.get(name)
        if avg:
            weight[FIELD_CODE[name]], inv_avg[FIELD_CODE[name]] = w, 1.0 / avg
    docs, contribs = [], []
    for term, df in sorted(stats.df.items()):
        idf = weights.get(term, 1.0) * math.log(1 + (stats.docs - df + 0.5) / (df + 0.5))
        doc, fld, tf, flen = scope.term_rows(term)
        fld = fld.astype(np.intp)
        norm = K1 * (1 - B + (inv_avg[fld] * flen) * B)
        docs.append(doc)
        contribs.append((weight[fld] * (K1 + 1)) * tf / (norm + tf) * idf)
    cols = scope.columns
    if not docs:
        return 0, [], 0.0
    bm25 = np.bincount(np.concatenate(docs), weights=np.concatenate(contribs), minlength=cols.n)
    eligible = cols.eligible(now_ms=NOW, max_cursor=10**9)
    hit = np.flatnonzero((bm25 > 0) & eligible)
    if len(hit) == 0:
        return 0, [], 0.0
    raw = bm25[hit]
    best = float(raw.max())
    vt = cols.valid_t[hit]
    score = np.round(LW * raw / best + (1 - LW) * np.exp2(np.maximum(NOW - vt, 0) / -float(HALF_LIFE)), 9)
    rows = [(cols.record_ids[d], float(s), int(v)) for d, s, v in zip(hit.tolist(), score.tolist(), vt.tolist(),
                                                                       strict=True)]
    rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
    return len(hit), rows[:limit], best


def _ranked(index: SearchIndex, query: list[int], weights: dict[int, float], limit: int):
    import dataclasses

    stats = index.stats(Scope("t", "w"), query)
    stats = dataclasses.replace(stats, weights={t: w for t, w in weights.items() if t in stats.df})
    return index.rank(Scope("t", "w"), LexicalQuery(stats, WEIGHTS, k1=K1, b=B, now_ms=NOW, half_life_ms=HALF_LIFE,
                                             lexical_weight=LW, max_accepted_cursor=10**9, best_bm25=None,
                                             after=None, limit=limit))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 400), st.sampled_from([6, 30, 200]), st.integers(1, 6),
       st.sampled_from([1, 3, 10, 50]), st.sampled_from([8, 64, 1_000_000]))
def test_top_k_equals_exhaustive_scoring_ties_included(seed: int, n: int, vocabulary: int, copies: int, limit: int,
                                                        merge_at: int) -> None:
    rnd = random.Random(seed)
    saved = search_index.tuning.MERGE_AT
    search_index.tuning.MERGE_AT = merge_at  # some postings merged, some still in the append buffer
    try:
        index = SearchIndex()
        records = _corpus(rnd, n, vocabulary, copies)
        for meta, ps in records:
            index.apply([_indexed(meta, ps)])
        for meta, _ in rnd.sample(records, n // 7):  # forgotten: masked, then dropped by a merge
            index.apply([RecordUnindexed("t", "w", meta.record_id)])
        queries = [
            rnd.sample(range(vocabulary), min(2, vocabulary)),  # two common words: most records match
            rnd.sample(range(vocabulary), min(vocabulary, rnd.randint(10, 40))),  # a whole text
            [rnd.randrange(vocabulary), vocabulary + 5],  # a term no record has
        ]
        related = {t: 0.3 for t in range(1, vocabulary, 3)}  # related words weigh less (other IDFs)
        for _ in range(2):  # the second time from the kept contributions and buffers
            for query in queries:
                for weights in ({}, related):
                    page = _ranked(index, query, weights, limit)
                    total, rows, best = _exhaustive(index, query, weights, limit)
                    assert (page.total, page.rows) == (total, rows)
                    if total:
                        assert (page.best_bm25, page.own_best_bm25) == (best, best)
    finally:
        search_index.tuning.MERGE_AT = saved


def test_copies_of_one_record_are_ordered_by_record_id() -> None:
    """Twenty records with the same postings and valid time: the page is their ids in order."""
    index = SearchIndex()
    ids = [f"rec_{k:02d}" for k in (7, 3, 19, 0, 12, 5, 16, 1, 9, 14, 2, 18, 6, 11, 4, 17, 8, 13, 10, 15)]
    for i, rid in enumerate(ids):
        meta = RecordMeta(rid, True, i + 1, i + 1, NOW - DAY, None, None)
        index.apply([_indexed(meta, [Posting(1, "primary", 1, 3), Posting(2, "context", 2, 5)])])
    page = _ranked(index, [1, 2], {}, 5)
    assert [r[0] for r in page.rows] == sorted(ids)[:5] and page.total == 20
    assert len({r[1] for r in page.rows}) == 1
    assert _exhaustive(index, [1, 2], {}, 5) == (page.total, page.rows, page.best_bm25)
