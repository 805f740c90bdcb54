"""Issue 63: a term's contributions kept as layers (``postings._layers``: each document's k-th
posting in layer k, dense where a layer holds a large share of the scope) add up to the very
sums that adding every posting in order makes, bit for bit, whatever the order of the rows and
however many each document has."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_core.store.search_index import tuning
from engram_core.store.search_index.postings import _layers, add_layers


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 300), st.integers(1, 600), st.sampled_from([0.0, 0.01, 0.5, 2 / 3, 2.0]),
       st.booleans(), st.booleans())
def test_layers_add_up_to_the_postings_added_in_order(seed: int, n: int, rows: int, dense_share: float,
                                                      in_order: bool, prior: bool) -> None:
    rng = np.random.default_rng(seed)
    doc = rng.integers(0, n, rows).astype(np.int32)
    if in_order:
        doc.sort()
    # Values of many magnitudes, so that adding them in another order would round differently.
    value = rng.random(rows) * 10.0 ** rng.integers(-8, 4, rows)
    start = rng.random(n) * 3 if prior else np.zeros(n)  # the terms before this one
    expected = start.copy()
    np.add.at(expected, doc, value)
    saved = tuning.DENSE_SHARE
    tuning.DENSE_SHARE = dense_share
    try:
        layers = _layers(doc, value, n)
    finally:
        tuning.DENSE_SHARE = saved
    sums = start.copy()
    add_layers(sums, layers)
    assert np.array_equal(sums, expected)
    assert all(len(layer) == 1 and len(layer[0]) == n or len(layer) == 2 for layer in layers)
