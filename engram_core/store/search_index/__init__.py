"""The search projections' read side, held in memory (SPEC §11 ``offline_lexical_v4``, ``semantic_v4``, ``semantic_v5``).

What is durable is each record's projection, sealed under its own data key next to its body
(``store/projection.py``: keyed term hashes, term frequencies, field lengths, and its vector).
This index holds the same postings opened, as numpy arrays, so BM25F over all matching records
is a handful of vector operations, exact (no approximate top-k: every eligible match is scored,
as the rank receipt's ``candidate_count`` says). No plaintext: terms are keyed hashes.

Consistency: the index is built from the engine's rows and projections when the store opens
(or, with scopes loaded on first use, when a scope is first searched), and the store kernel
applies each committed transaction's changes (``store/changes.py``) before readers may start a
snapshot that sees the commit (``StoreKernel`` holds one publish lock over both). A reader's
index is therefore never older than its database snapshot; it may be newer, which the pinned
cursors absorb (records accepted or changed after ``system_as_of`` are not candidates, and a
record forgotten after the pin is gone from the index, as SPEC §5 paging requires).

What it holds, per scope (``postings.ScopeIndex``):

- **Postings** in CSR form (sorted term keys, offsets) plus a small append buffer merged once it
  grows (``postings.py``); forgotten records are masked until the next merge drops their postings.
  Each query term's BM25F contributions times its weighted IDF are kept between searches (until
  any admission, forget or merge in the scope; at most ``CONTRIBUTION_BYTES``).
- **Per-record columns** for read-time eligibility (``columns.py``), the eligibility mask (kept
  until a record's valid time or expiry flips it; an admission, a state change or a forget
  updates the record's entry) and the neighbourhood neighbours lend over (an admission appends
  to it; a forget drops it).
- **Rows**: each indexed record's committed ``records`` row (sealed body included: ciphertext,
  useless once the forget destroys its key), so a search reads its page's rows from memory (a
  database fetch of ten rows by id took ~3 ms at 100k records). A state change or a dropped body
  evicts the copy (readers then go to the database), and a forget unindexes the record. At 100k
  records this adds ~2 s to the open and ~150 MB.
- **Vectors** (the semantic channel): a float32 matrix per model, one row per record (1.5 KB per
  384-dimension record, as stored), so the nearest neighbours are a matrix-vector product.
  Similarities are float64 (``vectors.similarities``: the answer must not depend on how BLAS
  blocks a product), but converting every row to float64 cost ~30 ms at 100k records; so
  ``nearest`` first takes an approximate product of every row (float32, or the int8 sketch of
  ``store/vector_sketch.py`` at scale), then the float64 similarities of only the rows within
  its error bound of the page (``vectors.candidates``), and answers what the float64 pass over
  every row would. Rows of forgotten records are zeroed and masked until the store reopens.

Modules: ``index.py`` (``SearchIndex``: the scopes, the changes it follows, ``rank`` and
``nearest``), ``ranking.py`` (a lexical page's scores and top-k), ``vectors.py`` (the semantic
channel's arithmetic), ``postings.py``, ``columns.py``, ``builder.py`` (``IndexBuilder``: the
build at open, streaming the rows, then the opened projections in any order; memory per record
at 100k and 1M: docs/performance.md "Start-up and memory at scale") and ``tuning.py`` (its sizes
and thresholds, read at each use: ``search_index.tuning.MERGE_AT = 3`` changes them for every
module).
"""

from __future__ import annotations

from engram_core.store.changes import Posting
from engram_core.store.fields import FIELD_CODE, FIELDS
from engram_core.store.search_index import tuning
from engram_core.store.search_index.builder import IndexBuilder
from engram_core.store.search_index.columns import Columns, RecordMeta
from engram_core.store.search_index.index import SearchIndex
from engram_core.store.search_index.ranking import first_page, lexical_score, top
from engram_core.store.search_index.vectors import similarities

__all__ = ["FIELDS", "FIELD_CODE", "Columns", "IndexBuilder", "Posting", "RecordMeta", "SearchIndex", "first_page",
           "lexical_score", "similarities", "top", "tuning"]

