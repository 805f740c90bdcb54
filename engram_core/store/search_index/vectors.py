"""The semantic channel's arithmetic over a scope's vector matrix (``SearchIndex.nearest``): a first
pass's error bound, the candidates within it of the page, and the exact float64 similarities."""

from __future__ import annotations

import numpy as np

from engram_core.store.search_index import tuning
from engram_core.store.search_index.columns import Columns

__all__ = ["candidates", "float32_error", "semantic_keys", "similarities"]

_U32 = 2.0**-24  # float32's unit roundoff


def float32_error(dims: int, row_norm: float, query_norm: float) -> float:
    """A bound on |float32 dot − exact dot| for rows of norm at most ``row_norm``: the query
    rounded to float32 (u each), then any order of float32 multiply-adds over ``dims`` terms
    (γ_dims = dims·u / (1 − dims·u), Higham's bound, FMA or not), both relative to
    Σ|x_i q_i| ≤ ‖x‖‖q‖; plus the float64 reference's own error."""
    gamma = dims * _U32 / (1 - dims * _U32)
    return (gamma * (1 + _U32) + _U32) * row_norm * query_norm * (1 + 1e-6) + 1e-12


def semantic_keys(cols: Columns, ok: np.ndarray, sims: np.ndarray, n: int,
                   neighbours: tuple[int, float, int, int] | None) -> np.ndarray:
    """What orders and thresholds the semantic channel, for every row at once: the similarity,
    or with neighbours its eligible non-negative part plus ``weight`` times the best eligible
    neighbour's. ``nearest`` takes it over the float32 similarities, then the same formula at
    the candidates alone (``Columns.best_neighbour``) over the float64 ones."""
    if neighbours is None:
        return sims
    base = np.zeros(cols.n)
    base[:n] = np.where(ok, np.maximum(sims, 0.0), 0.0)
    return np.round(cols.lend(base, base > 0, *neighbours)[:n], 9)


def candidates(approx: np.ndarray, ok: np.ndarray, min_similarity: float, limit: int, slack: float) -> np.ndarray:
    """The documents that may be on the page, given keys within ``slack`` of the exact ones:
    every exact hit of the top ``limit`` is among them. A hit's key is at least
    ``min_similarity``, so its approximate one at least that minus ``slack``. And when ``limit``
    documents are hits for sure (approximate key at least ``min_similarity + slack``), the
    ``limit``-th best of those, ``kth``, puts the exact ``limit``-th best hit at ``kth − slack``
    or above, so a page member's approximate key is at least ``kth − 2·slack``."""
    floor = min_similarity - slack
    sure = approx[ok & (approx >= min_similarity + slack)]
    if len(sure) >= limit:
        # ``kth`` is the limit-th largest of ``sure``; when a strided sample's values put at least
        # ``limit`` of them above a guess, it is the limit-th largest of those few (a partition
        # of tens of thousands of values cost ~0.4 ms at 100k records).
        top = sure
        if len(sure) >= 64 * limit:
            sample = sure[:: len(sure) // (16 * limit)]
            guess = np.partition(sample, len(sample) - 4 * limit)[len(sample) - 4 * limit]
            above = sure[sure >= guess]
            if len(above) >= limit:
                top = above
        kth = float(np.partition(top, len(top) - limit)[len(top) - limit])
        floor = max(floor, kth - 2 * slack)
    return np.flatnonzero(ok & (approx >= floor))


def similarities(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``matrix @ vector`` in float64 for a float32 matrix, one block of rows at a time.

    float64 so that a similarity does not depend on how BLAS blocks the product (which varies
    with the matrix's size and alignment, i.e. between a running core and one that reloaded):
    float32 sums differed in the last bit, enough to reorder exact ties (scores are rounded to
    1e-9) across a restart. Converting block by block keeps the matrix itself at 4 bytes a value
    (half the memory) for about the time of the float64 product over a float64 matrix."""
    out = np.empty(len(matrix))
    block = np.empty((min(tuning.SIMILARITY_BLOCK, len(matrix)), matrix.shape[1]))
    for lo in range(0, len(matrix), tuning.SIMILARITY_BLOCK):
        hi = min(lo + tuning.SIMILARITY_BLOCK, len(matrix))
        np.copyto(block[: hi - lo], matrix[lo:hi])
        np.dot(block[: hi - lo], vector, out=out[lo:hi])
    return out
