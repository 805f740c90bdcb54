"""One scope's lexical postings in CSR form (``Postings``: sorted term keys, offsets) and the scope
itself (``ScopeIndex``): those postings plus a small append buffer merged once it grows, the field
statistics, each query term's BM25F contributions kept between searches, the per-record columns
(``columns.py``) and each model's vector matrix with its int8 sketch (``vector_sketch.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engram_core.store.changes import Posting
from engram_core.store.fields import FIELD_CODE, FIELDS
from engram_core.store.search_index import tuning
from engram_core.store.search_index.columns import Columns, RecordMeta
from engram_core.store.vector_sketch import VectorSketch
from engram_core.store.vector_sketch import available as sketch_available

__all__ = ["Layer", "Postings", "ScopeIndex", "add_layers"]

# A term's contributions to add to the documents' BM25 sums: (documents, values), added posting
# by posting in order, or (values of every document,) for a layer that holds a large share of them.
Layer = tuple[np.ndarray, ...]


@dataclass
class Postings:
    """Postings of one scope sorted by term: ``terms[i]`` owns rows ``starts[i]:starts[i + 1]``."""

    terms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    df: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    doc: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    fld: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    tf: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    flen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    @classmethod
    def build(cls, term: np.ndarray, doc: np.ndarray, fld: np.ndarray, tf: np.ndarray, flen: np.ndarray) -> Postings:
        return cls.build_owned([term, doc, fld, tf, flen])

    @classmethod
    def build_owned(cls, arrays: list[np.ndarray]) -> Postings:
        """``build`` from [term, doc, fld, tf, flen], taken out of the list one by one so that
        each original can be freed once its sorted copy exists (the peak at open)."""
        order = np.lexsort((arrays[1], arrays[0]))
        for i in range(len(arrays)):
            arrays[i] = arrays[i][order]
        del order
        term, doc, fld, tf, flen = arrays
        arrays.clear()
        if len(term) == 0:
            return cls()
        boundary = np.flatnonzero(np.diff(term)) + 1
        starts = np.concatenate(([0], boundary, [len(term)])).astype(np.int64)
        # Document frequency: distinct documents per term (a document has one row per field).
        new_doc = np.ones(len(term), dtype=bool)
        new_doc[1:] = (term[1:] != term[:-1]) | (doc[1:] != doc[:-1])
        df = np.add.reduceat(new_doc.astype(np.int64), starts[:-1])
        # float32 holds any term frequency / field length exactly; scoring promotes to float64.
        return cls(terms=term[starts[:-1]], starts=starts, df=df, doc=doc.astype(np.int32, copy=False),
                   fld=fld.astype(np.int8, copy=False), tf=tf.astype(np.float32, copy=False),
                   flen=flen.astype(np.float32, copy=False))

    def slice_of(self, term: int) -> slice | None:
        i = int(np.searchsorted(self.terms, term))
        if i < len(self.terms) and self.terms[i] == term:
            return slice(int(self.starts[i]), int(self.starts[i + 1]))
        return None

    def df_of(self, term: int) -> int:
        i = int(np.searchsorted(self.terms, term))
        return int(self.df[i]) if i < len(self.terms) and self.terms[i] == term else 0

    def dfs_of(self, terms: np.ndarray) -> np.ndarray:
        """``df_of`` of each of ``terms`` in one search (a query with related words has ~100)."""
        if len(self.terms) == 0:
            return np.zeros(len(terms), dtype=np.int64)
        at = np.minimum(np.searchsorted(self.terms, terms), len(self.terms) - 1)
        return np.where(self.terms[at] == terms, self.df[at], 0)


class ScopeIndex:
    def __init__(self) -> None:
        self.columns = Columns()
        self.local: dict[str, int] = {}
        self.base = Postings()
        self.buffer: dict[int, list[tuple[int, int, int, int]]] = {}  # term -> [(doc, field, tf, field_len)]
        self.buffered = 0
        self.df_delta: dict[int, int] = {}
        self.field_docs = [0] * len(FIELDS)
        self.field_len = [0] * len(FIELDS)
        self.docs = 0
        self.terms_of: dict[int, list[tuple[int, int, int]]] = {}  # doc -> [(term, field, field_len)] for removal
        self.vectors: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # model -> (rows by doc, row present)
        self.vector_norms: dict[str, float] = {}  # model -> bound on its rows' norms (``vector_norm``)
        self.sketches: dict[str, VectorSketch] = {}  # model -> its rows' int8 sketch (``sketch``)
        # Per query term, scoring parameters and weighted IDF: the BM25F contributions times the
        # IDF of its postings (``contribution``), least recently used first. Common terms recur
        # across searches and their arithmetic was most of ranking; any change to the scope's
        # postings or statistics empties it.
        self.contributions: dict[tuple[Any, ...], list[Layer]] = {}
        self.contribution_bytes = 0

    def put_vector(self, record_id: str, model: str, vector: Any) -> None:
        doc = self.local.get(record_id)
        if doc is None:
            return  # not indexed (never happens in admission: index_record comes first)
        # Held as the float32 values the projection stores; similarities are computed in float64
        # (``similarities``).
        v = np.asarray(vector, dtype=np.float32)
        matrix, present = self.vectors.get(model, (np.zeros((0, len(v)), dtype=np.float32),
                                                   np.zeros(0, dtype=bool)))
        if doc >= len(matrix):
            cap = max(1024, 2 * len(matrix), doc + 1)
            grown = np.zeros((cap, len(v)), dtype=np.float32)
            grown[: len(matrix)] = matrix
            flags = np.zeros(cap, dtype=bool)
            flags[: len(present)] = present
            matrix, present = grown, flags
        matrix[doc] = v
        present[doc] = True
        self.vectors[model] = (matrix, present)
        sketch = self.sketches.get(model)
        if sketch is not None:
            sketch.put(doc, v)
        if model in self.vector_norms:
            self.vector_norms[model] = max(self.vector_norms[model], float(np.linalg.norm(v.astype(np.float64))))

    def vector_norm(self, model: str) -> float:
        """An upper bound on the norm of the model's rows (``nearest``'s error bound): computed
        once, then raised by every vector put."""
        norm = self.vector_norms.get(model)
        if norm is None:
            rows = self.vectors[model][0]
            squares = np.einsum("ij,ij->i", rows, rows, dtype=np.float64) if len(rows) else np.zeros(1)
            norm = self.vector_norms[model] = float(np.sqrt(squares.max()))
        return norm

    def sketch(self, model: str, n: int) -> VectorSketch | None:
        """The int8 sketch of the model's rows [0, n) and every row put after: built by the first
        search that needs it (as ``vector_norm``), then kept by ``put_vector``. None below
        ``tuning.SKETCH_FROM`` rows or without onnxruntime."""
        found = self.sketches.get(model)
        if found is None and n >= tuning.SKETCH_FROM and sketch_available():
            found = self.sketches[model] = VectorSketch.of(self.vectors[model][0], n)
        return found

    def df(self, term: int) -> int:
        return self.base.df_of(term) + self.df_delta.get(term, 0)

    def dfs(self, terms: list[int]) -> list[int]:
        """``df`` of each of ``terms``."""
        base = self.base.dfs_of(np.array(terms, dtype=np.int64)).tolist()
        delta = self.df_delta
        return [n + delta.get(t, 0) for t, n in zip(terms, base, strict=True)] if delta else base

    def add(self, meta: RecordMeta, postings: Sequence[Posting]) -> None:
        if meta.record_id in self.local:
            self.remove(meta.record_id)
        self.forget_contributions()
        doc = self.columns.add(meta)
        self.local[meta.record_id] = doc
        lengths: dict[int, int] = {}
        for p in postings:
            code = FIELD_CODE[p.field]
            self.buffer.setdefault(p.term, []).append((doc, code, p.tf, p.field_len))
            lengths[code] = p.field_len
        for term in {p.term for p in postings}:
            self.df_delta[term] = self.df_delta.get(term, 0) + 1
        for code, length in lengths.items():
            self.field_docs[code] += 1
            self.field_len[code] += length
        self.docs += 1
        self.buffered += len(postings)
        self.terms_of[doc] = [(p.term, FIELD_CODE[p.field], p.field_len) for p in postings]
        if self.buffered >= tuning.MERGE_AT:
            self.merge()

    def remove(self, record_id: str) -> None:
        doc = self.local.pop(record_id, None)
        if doc is None or not self.columns.live[doc]:
            return
        self.columns.kill(doc)
        self.forget_contributions()
        # The vector goes too (the row a killed document keeps is never read again): a forget
        # leaves nothing of the record's content in this process's index (docs/security.md).
        for model, (matrix, present) in self.vectors.items():
            if doc < len(matrix):
                matrix[doc] = 0.0
                present[doc] = False
                sketch = self.sketches.get(model)
                if sketch is not None:
                    sketch.put(doc, matrix[doc])
        rows = self.terms_of.pop(doc, None)
        if rows is None:
            rows = self.rows_of(doc)
        if not rows:
            return  # as the database's unindex: a record without postings leaves the statistics alone
        for term in {t for t, _, _ in rows}:
            self.df_delta[term] = self.df_delta.get(term, 0) - 1
        for code, length in {(c, n) for _, c, n in rows}:
            self.field_docs[code] -= 1
            self.field_len[code] -= length
        self.docs -= 1

    def rows_of(self, doc: int) -> list[tuple[int, int, int]]:
        """The (term, field, field_len) rows of a merged document (rare: forget of an older record)."""
        hits = np.flatnonzero(self.base.doc == doc)
        owner = np.searchsorted(self.base.starts, hits, side="right") - 1
        return [(int(self.base.terms[o]), int(self.base.fld[h]), int(self.base.flen[h])) for h, o in zip(hits, owner, strict=True)]

    def set_state(self, record_id: str, current: bool, state_cursor: int) -> None:
        doc = self.local.get(record_id)
        if doc is not None:
            self.columns.set_state(doc, current, state_cursor)

    def evict_row(self, record_id: str) -> None:
        doc = self.local.get(record_id)
        if doc is not None:
            self.columns.rows[doc] = None

    def forget_contributions(self) -> None:
        self.contributions, self.contribution_bytes = {}, 0

    def contribution(self, term: int, weight: np.ndarray, inv_avg: np.ndarray, k1: float,
                     b: float, idf: float = 1.0) -> list[Layer] | None:
        """The term's BM25F contributions, weight * (k1 + 1) * tf / (tf + k1 * (1 - b + b * len /
        avg)) * idf per posting, as layers to add to the documents' sums in order (``add_layers``),
        kept while the scope does not change (bounded by tuning.CONTRIBUTION_BYTES).

        With the term's weighted IDF: multiplying each posting by it was a third of ranking a
        capture's whole text as the query (50 terms, 1.3M postings at 100k records); the
        products are the ones ``rank`` made from the unweighted contributions, and a term keeps
        its IDF until the scope changes, which empties the cache."""
        key = (term, k1, b, weight.tobytes(), inv_avg.tobytes(), idf)
        kept = self.contributions
        hit = kept.pop(key, None)
        if hit is not None:
            kept[key] = hit  # the most recently used last: evicted last
            return hit
        rows = self.term_rows(term)
        if rows is None:
            return None
        doc, fld, tf, flen = rows
        fld = fld.astype(np.intp)
        # float64 arrays first: a Python scalar times a float32 array would stay float32 (NEP 50).
        norm = k1 * (1 - b + (inv_avg[fld] * flen) * b)
        value = _layers(doc, (weight[fld] * (k1 + 1)) * tf / (norm + tf) * idf, self.columns.n)
        size = _nbytes(value)
        if size <= tuning.CONTRIBUTION_BYTES:
            # The least recently used terms make room: a query's rare terms come and go, the
            # common ones (most of its postings) stay, where emptying the whole cache when it
            # was full recomputed them for every long query in turn.
            while kept and self.contribution_bytes + size > tuning.CONTRIBUTION_BYTES:
                self.contribution_bytes -= _nbytes(kept.pop(next(iter(kept))))
            kept[key] = value
            self.contribution_bytes += size
        return value

    def merge(self) -> None:
        """Fold the buffer into the sorted arrays and drop postings of removed documents."""
        self.forget_contributions()
        b = self.base
        parts = [(b.terms.repeat(np.diff(b.starts)), b.doc, b.fld, b.tf, b.flen)]
        if self.buffer:
            rows = [(t, *r) for t, rs in self.buffer.items() for r in rs]
            arr = np.array(rows, dtype=np.int64)
            parts.append((arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4]))
        term, doc, fld, tf, flen = (np.concatenate([p[i] for p in parts]) for i in range(5))
        keep = self.columns.live[doc.astype(np.int64)]
        self.base = Postings.build(term[keep], doc[keep], fld[keep], tf[keep], flen[keep])
        self.buffer, self.buffered, self.df_delta, self.terms_of = {}, 0, {}, {}

    def term_rows(self, term: int) -> tuple[np.ndarray, ...] | None:
        parts = []
        s = self.base.slice_of(term)
        if s is not None:
            b = self.base
            parts.append((b.doc[s], b.fld[s], b.tf[s], b.flen[s]))
        extra = self.buffer.get(term)
        if extra:
            arr = np.array(extra, dtype=np.int64)
            parts.append((arr[:, 0], arr[:, 1], arr[:, 2].astype(np.float64), arr[:, 3].astype(np.float64)))
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def _layers(doc: np.ndarray, value: np.ndarray, n: int) -> list[Layer]:
    """A term's postings (``doc``, ``value``) as layers that ``add_layers`` adds to the same sums,
    bit for bit, as adding each posting in order: layer k holds each document's k-th posting
    (a document has one per field it has the term in), so a document's postings are still
    added one after another in their order. A layer with ``tuning.DENSE_SHARE`` of the scope's
    documents or more is kept dense (zero elsewhere: adding 0.0 leaves a sum as it is) and
    added with one pass over the sums instead of one scattered update per posting: a capture's
    whole text as the query names words every record has (~100k postings each at 100k records,
    most of the query's postings)."""
    if len(doc) < tuning.DENSE_SHARE * n:
        return [(doc, value)]
    if not (doc[1:] >= doc[:-1]).all():
        # (A term's rows are in document order, the append buffer's after the merged ones';
        # should they not be, a stable sort keeps each document's own in order.)
        order = np.argsort(doc, kind="stable")
        doc, value = doc[order], value[order]
    again = doc[1:] == doc[:-1]  # a row after its document's first
    if not again.any():
        return [_layer(doc, value, n)]
    places = np.arange(len(doc))
    first = np.empty(len(doc), dtype=bool)
    first[0], first[1:] = True, ~again
    rank = places - np.maximum.accumulate(np.where(first, places, 0))
    layers = []
    for k in range(int(rank.max()) + 1):
        at = np.flatnonzero(rank == k)
        layers.append(_layer(doc[at], value[at], n))
    return layers


def _layer(doc: np.ndarray, value: np.ndarray, n: int) -> Layer:
    """Postings of distinct documents, dense if they are ``tuning.DENSE_SHARE`` of them or more."""
    if len(doc) < tuning.DENSE_SHARE * n:
        return (doc, value)
    dense = np.zeros(n)
    dense[doc] = value
    return (dense,)


def _nbytes(layers: list[Layer]) -> int:
    return sum(part.nbytes for layer in layers for part in layer)


def add_layers(sums: np.ndarray, layers: list[Layer]) -> None:
    """Add a term's layers (``ScopeIndex.contribution``) to ``sums``, in order."""
    for layer in layers:
        if len(layer) == 1:
            np.add(sums, layer[0], out=sums)
        else:
            # ``np.add.at`` is unbuffered: a document's postings add up in order, to the same
            # sums as ``np.bincount`` over all terms' postings end to end.
            np.add.at(sums, layer[0], layer[1])
