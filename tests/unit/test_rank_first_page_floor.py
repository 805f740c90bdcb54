"""Issue 63: when the best hit is far above the rest (a capture's whole text as the query finds
itself), no fraction of the best holds a first page; ``first_page`` then derives the floor from
the page's limit-th best score found so far, and scores only the hits at or above it. Its page
must be the page of scoring every hit, ties and rounding included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_core.store import search_index


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 12), st.sampled_from([0.85, 0.6, 0.99]),
       st.sampled_from([0.3, 0.24, 0.1]))
def test_a_floor_from_the_page_s_own_scores_keeps_the_whole_ranking_s_page(seed: int, limit: int,
                                                                            lexical_weight: float,
                                                                            spread: float) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(limit * search_index.tuning.PRUNE_FROM + 1, 600))
    best = 9.0
    # One outlier; the rest below ``spread`` of it, crowded, some on a grid so that scores tie.
    raw = best * spread * rng.choice([rng.random(n), np.round(rng.random(n), 2)])
    raw[0] = best
    recency = rng.choice([0.0, 0.4, 0.9, 0.99, 1.0], n) * (1 - rng.random(n) * rng.choice([0, 1e-9, 1e-3], n))
    vt = rng.integers(0, 4, n)
    record_ids = [f"rec_{i:04d}" for i in range(n)]

    def scored(at):
        return search_index.lexical_score(raw[at], best, recency[at], lexical_weight), vt[at]

    everything = search_index.top(np.arange(n), *scored(np.arange(n)), record_ids, limit)
    found = search_index.first_page(raw, best, limit, lexical_weight, scored)
    if found is not None:
        at, score, v = found
        assert search_index.top(at, score, v, record_ids, limit) == everything


def test_the_derived_floor_spares_scoring_every_hit() -> None:
    """The shape it is for: hits above the lowest fraction of the best exist but are old (their
    scores under that fraction's ceiling), so no fraction holds a page; the floor derived from
    their scores does, scoring a part of the hits."""
    rng = np.random.default_rng(63)
    n, limit, lw, best = 5000, 11, 0.85, 9.0
    raw = best * 0.24 * rng.random(n)
    recency = rng.random(n)
    old = rng.choice(np.arange(1, n), 40, replace=False)
    raw[old], recency[old] = best * 0.26, 0.1
    raw[0] = best
    vt = rng.integers(0, 4, n)
    record_ids = [f"rec_{i:04d}" for i in range(n)]

    def scored(at):
        return search_index.lexical_score(raw[at], best, recency[at], lw), vt[at]

    found = search_index.first_page(raw, best, limit, lw, scored)
    assert found is not None and len(found[0]) < n
    assert search_index.top(found[0], found[1], found[2], record_ids, limit) == search_index.top(
        np.arange(n), *scored(np.arange(n)), record_ids, limit)
