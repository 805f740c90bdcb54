"""A lexical page's scores and its top-k (``SearchIndex.rank``): the score of a hit, a first page
found by scoring only the best raw BM25s, and the first ``limit`` rows in page order."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engram_core.store.search_index import tuning

__all__ = ["first_page", "lexical_score", "top"]


def lexical_score(raw: np.ndarray, best: float, recency: np.ndarray, lexical_weight: float) -> np.ndarray:
    """A lexical hit's score: its BM25 relative to the best, and its recency (at most 1)."""
    return np.round(lexical_weight * raw / max(best, 1e-12) + (1 - lexical_weight) * recency, 9)


def first_page(raw: np.ndarray, best: float, limit: int, lexical_weight: float,
                scored: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(which hits, their scores, their valid times) holding a first page of ``limit``, scoring
    only the best raw BM25s, or None when that cannot be shown (then every hit is scored).

    The score is monotone in the raw BM25 and in recency, which is at most 1: a hit whose raw
    BM25 is below ``floor`` scores at most ``ceiling`` (``lexical_score`` of both). So if ``limit``
    hits at or above ``floor`` all score more than ``ceiling``, no hit below it is on the page,
    nor ties with one that is. Scoring every hit was a third of ranking at 100k records captured
    live (neighbours make most documents hits)."""
    if limit <= 0 or len(raw) <= tuning.PRUNE_FROM * limit or not 0.0 <= lexical_weight <= 1.0:
        return None  # (a weight outside [0, 1] would make the score fall with recency or BM25)
    kth = None
    for fraction in tuning.PRUNE_FRACTIONS:
        floor = best * fraction
        at = np.flatnonzero(raw >= floor)
        if len(at) < limit:
            continue
        score, vt = scored(at)
        ceiling = lexical_score(np.array([floor]), best, np.ones(1), lexical_weight)[0]
        kth = np.partition(score, len(score) - limit)[len(score) - limit]
        if kth > ceiling:
            return at, score, vt
    if kth is None or lexical_weight == 0.0:
        return None
    # The floor below which a hit cannot score the limit-th best score already found, even at
    # recency 1 (a little under it, so that its ceiling is below that score after rounding):
    # when the best hit is far above the rest (a capture's whole text as the query finds
    # itself) no fraction of it above held a page, and this spared scoring every hit (31 of 40
    # such queries at 100k). The same check as above decides; hits at or above the floor only
    # add scores, so their limit-th best is at least ``kth``.
    floor = best * float(kth - (1 - lexical_weight)) / lexical_weight * (1 - 1e-6)
    if floor <= 0.0:
        return None
    at = np.flatnonzero(raw >= floor)
    if len(at) == len(raw):
        return None
    score, vt = scored(at)
    ceiling = lexical_score(np.array([floor]), best, np.ones(1), lexical_weight)[0]
    if np.partition(score, len(score) - limit)[len(score) - limit] > ceiling:
        return at, score, vt
    return None


def top(hit: np.ndarray, score: np.ndarray, vt: np.ndarray, record_ids: list[str],
         limit: int) -> list[tuple[str, float, int]]:
    """The first ``limit`` rows by (score desc, valid_t desc, record_id asc), ties included exactly."""
    if limit <= 0 or len(hit) == 0:
        return []
    if len(hit) > limit:
        # Everything scoring at least the limit-th best score: a superset of the page.
        kth = np.partition(score, len(score) - limit)[len(score) - limit]
        sel = np.flatnonzero(score >= kth)
        hit, score, vt = hit[sel], score[sel], vt[sel]
    order = np.lexsort((-vt, -score))
    if len(order) > limit:
        # Keep whole (score, valid_t) tie groups at the edge: record_id decides among them.
        end, edge = limit, order[limit - 1]
        while end < len(order) and score[order[end]] == score[edge] and vt[order[end]] == vt[edge]:
            end += 1
        order = order[:end]
    rows = [(record_ids[d], float(s), int(v))
            for d, s, v in zip(hit[order].tolist(), score[order].tolist(), vt[order].tolist(), strict=True)]
    rows.sort(key=lambda r: (-r[1], -r[2], r[0]))
    return rows[:limit]
