"""The search index's sizes and thresholds, read by its modules at each use (``tuning.MERGE_AT``), so
that a test may change one for the whole index: ``search_index.MERGE_AT = 3`` on the package sets
it here (``search_index/__init__.py``)."""

from __future__ import annotations

__all__ = ["CONTRIBUTION_BYTES", "DENSE_SHARE", "LEND_PATH", "MERGE_AT", "PRUNE_FRACTIONS", "PRUNE_FROM", "SIMILARITY_BLOCK",
           "SKETCH_FROM"]

MERGE_AT = 65_536  # buffered postings of a scope before they are merged into its arrays
CONTRIBUTION_BYTES = 32 << 20  # per scope: cached term contributions (a common term: ~1 MB at 100k)
# A layer of a term's contributions holding this share of a scope's documents or more is kept
# dense (``postings._layers``): one pass over the sums (~0.05 ms at 100k) instead of a scattered
# update per posting (~15 ns each). From 2/3 on, the dense array (8 bytes a document) is no
# larger than the postings it replaces (12 bytes each), so the kept contributions' budget
# holds as many terms as before; at 1/8 dense layers of the common words filled it with four
# long queries and half the lookups missed.
DENSE_SHARE = 2 / 3
SIMILARITY_BLOCK = 1024  # matrix rows converted to float64 at a time for a similarity (3 MB: stays in cache)
PRUNE_FROM = 8  # a first page's hits, in pages, from which ranking scores only the best raw BM25s first
# Of the best raw BM25: the floors tried, highest first. 0.25 for a capture's whole text as the
# query, whose best hit is the record itself, far above every other: without it every hit was
# scored (all of a 100k scope, ~1 ms).
PRUNE_FRACTIONS = (0.8, 0.5, 0.25)
# Rows from which ``nearest``'s first pass reads the int8 sketch (``vector_sketch``) rather than
# the float32 rows: below it the float32 rows stay in the CPU's caches and their product is cheap
# (0.33 ms at 20k rows, against 0.23 for the sketch, which then sends ~4.6 times as many rows to
# the float64 pass); at 40k it is 2.1 ms against 0.45.
SKETCH_FROM = 32_768
LEND_PATH: str | None = None  # neighbours' lending: "sparse", "pairs" or "dense" forced (tests); None: by size
