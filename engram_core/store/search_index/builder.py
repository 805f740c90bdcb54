"""The index built at open in two streaming passes (``IndexBuilder``): the indexed records' rows
first, then their opened projections in any order, each appended to per-scope byte buffers and
vector matrices (no per-record objects beyond the row), the arrays made once per scope."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from engram_core.store.fields import FIELDS
from engram_core.store.port import RecordRow
from engram_core.store.projection import split
from engram_core.store.search_index.index import SearchIndex
from engram_core.store.search_index.postings import Postings, ScopeIndex

__all__ = ["IndexBuilder"]


class _Loading:
    """One scope's projections as collected at open, before its arrays are built: byte buffers
    that grow per record (no per-record objects), and each model's vectors written straight
    into their float32 matrix."""

    def __init__(self) -> None:
        self.scope = ScopeIndex()
        self.codes = bytearray()  # u8 field code per (record, field) segment
        self.counts = array("I")  # postings per segment
        self.segment_docs = array("i")  # the document of each segment
        self.terms = bytearray()  # int64 term hashes, all segments in order
        self.tfs = bytearray()  # int32 term frequencies, same order
        self.opened = bytearray()  # per document: 1 once its projection is in
        self.rows: list[RecordRow] = []  # by document, made into the scope's columns at the end
        self.vectors: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, doc: int, raw: bytes) -> None:
        parts = split(memoryview(raw))  # slices of ``raw`` until copied into the buffers
        self.opened[doc] = 1
        self.codes += parts.codes
        self.counts.extend(parts.counts)
        self.segment_docs.extend([doc] * len(parts.counts))
        self.terms += parts.terms
        self.tfs += parts.tfs
        if parts.model:
            vector = np.frombuffer(parts.vector, dtype="<f4")
            found = self.vectors.get(parts.model)
            if found is None:
                found = self.vectors[parts.model] = (np.zeros((max(len(self.rows), 1), len(vector)),
                                                              dtype=np.float32),
                                                     np.zeros(max(len(self.rows), 1), dtype=bool))
            found[0][doc] = vector
            found[1][doc] = True

    def finish(self, *, sketch: bool = True) -> ScopeIndex:
        scope = self.scope
        counts = np.frombuffer(self.counts, dtype=np.uint32).astype(np.int64)
        if counts.sum():
            codes = np.frombuffer(self.codes, dtype=np.uint8)
            tfs = np.frombuffer(self.tfs, dtype="<i4")
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            lengths = np.add.reduceat(tfs, starts, dtype=np.int64)  # each segment's field length (none is empty)
            # Narrow types going in (the arrays are float32 / int8 / int32 in the end anyway), so
            # the sort's copies stay small at a million records; term frequencies and field
            # lengths are exact in float32.
            scope.field_docs = np.bincount(codes, minlength=len(FIELDS)).astype(int).tolist()
            scope.field_len = np.bincount(codes, weights=lengths, minlength=len(FIELDS)).astype(int).tolist()
            arrays = [np.frombuffer(self.terms, dtype="<i8"),
                      np.repeat(np.frombuffer(self.segment_docs, dtype=np.int32), counts),
                      np.repeat(codes.astype(np.int8), counts), tfs.astype(np.float32),
                      np.repeat(lengths.astype(np.float32), counts)]
            del codes, tfs, lengths
            # The buffers now live only as long as the arrays viewing them.
            self.codes, self.terms, self.tfs = bytearray(), bytearray(), bytearray()
            self.counts, self.segment_docs = array("I"), array("i")
            scope.base = Postings.build_owned(arrays)
        for model in sorted(self.vectors):
            scope.vectors[model] = self.vectors[model]
            if sketch:  # at open rather than in the first search that needs it (0.5 s at 100k records)
                scope.sketch(model, len(self.vectors[model][0]))
        return scope


# RecordRow fields whose values repeat across records (scope, state, trust class, principal,
# agent, derivative rule, session): the builder shares one string object per value.
_INTERNED = (1, 2, 6, 7, 8, 9, 13, 20)
_ROW_WIDTH = len(fields(RecordRow))


class IndexBuilder:
    """Builds a ``SearchIndex`` at open in two streaming passes, so that the database need not
    join, sort or hold a million projections and rows at once: ``add_row`` for every record
    that has a projection, in document order (a scope's local document numbers follow it), then
    ``add_projection`` with each one's opened bytes, in any order. A row whose projection never
    came (its key is gone) is not indexed. ``sketch_vectors`` False: the vectors' int8 sketch
    is left to the first search that reads it (a core that serves no semantic search)."""

    def __init__(self, *, sketch_vectors: bool = True) -> None:
        # The index's maps, filled as rows come and handed to it whole by ``finish``.
        self._scopes: dict[tuple[str, str], ScopeIndex] = {}
        self._scope_of: dict[str, tuple[str, str]] = {}
        self._sketch_vectors = sketch_vectors
        self._loading: dict[tuple[str, str], _Loading] = {}
        # Repeated row values (scope, state, principal, ...) share one string object.
        self._interned: dict[str, str] = {}

    def _intern(self, value: str | None) -> str | None:
        return None if value is None else self._interned.setdefault(value, value)

    def add_row(self, row: RecordRow) -> None:
        self.add_values([getattr(row, f.name) for f in fields(RecordRow)])

    def add_values(self, values: Sequence[Any]) -> None:
        """A row as fetched (``sql/codecs.py``'s ``RECORD_COLS`` order): one ``RecordRow`` made from it."""
        r = list(values[:_ROW_WIDTH])
        for i in _INTERNED:
            r[i] = self._intern(r[i])
        if r[18] is not None:
            r[18] = bytes(r[18])
        self._add(RecordRow(*r))

    def _add(self, row: RecordRow) -> None:
        key = (row.tenant, row.workspace)
        part = self._loading.get(key)
        if part is None:
            part = self._loading[key] = _Loading()
        if row.record_id in part.scope.local:
            return
        part.scope.local[row.record_id] = len(part.rows)
        part.rows.append(row)
        self._scope_of[row.record_id] = key
        part.opened.append(0)

    def row(self, record_id: str) -> RecordRow | None:
        """The row added for this record (the store needs its key slot to open the projection)."""
        key = self._scope_of.get(record_id)
        if key is None:
            return None
        part = self._loading[key]
        return part.rows[part.scope.local[record_id]]

    def add_projection(self, record_id: str, raw: bytes) -> None:
        """The record's opened projection (``projection.encode``'s bytes)."""
        key = self._scope_of.get(record_id)
        if key is not None:
            part = self._loading[key]
            part.add(part.scope.local[record_id], raw)

    def finish(self) -> SearchIndex:
        for key, part in self._loading.items():
            scope = part.scope
            scope.columns.load_rows(part.rows)
            part.rows = []
            for doc in np.flatnonzero(np.frombuffer(part.opened, dtype=np.uint8) == 0).tolist():
                record_id = scope.columns.record_ids[doc]
                scope.columns.kill(doc)
                del scope.local[record_id]
                del self._scope_of[record_id]
            scope.docs = len(scope.local)
            self._scopes[key] = part.finish(sketch=self._sketch_vectors)
        self._loading = {}
        return SearchIndex(self._scopes, self._scope_of)
