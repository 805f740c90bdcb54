"""The search projections' read side, held in memory (SPEC §11 ``offline_lexical_v4``, ``semantic_v4``, ``semantic_v5``).

DuckDB holds the durable projection (``postings``, ``field_stats``),
written in the admission and forget transactions. Scoring it with SQL meant reading
and grouping every posting of every query term on each search: at 100k records that
alone took about 20 ms. This index keeps the same postings as numpy arrays, so BM25
over all matching records is a handful of vector operations, exact (no approximate
top-k: every eligible match is scored, as the rank receipt's ``candidate_count`` says).

Consistency: the index is built from the database when the store opens and after
bulk changes, and the writer applies each committed transaction's projection changes
(collected by ``DuckDBTx``) before readers may start a snapshot that sees the commit
(``DuckDBStore`` holds one publish lock over both). A reader's index is therefore
never older than its database snapshot; it may be newer, which the pinned cursors
absorb (records accepted or changed after ``system_as_of`` are not candidates, and a
record forgotten after the pin is gone from the index, as SPEC §5 paging requires).

Per scope: postings in CSR form (sorted term keys, offsets) plus a small append
buffer merged once it grows; per-record metadata columns for read-time eligibility;
forgotten records are masked until the next merge drops their postings. No plaintext:
terms are the keyed hashes the postings table stores.

Rows: each indexed record's committed ``records`` row (sealed body included: ciphertext,
useless once the forget destroys its key) is held too, so a search reads its page's rows from
memory; a DuckDB fetch of ten rows by id took ~3 ms at 100k records (no point lookup is used
for an IN list). A state change or a dropped body evicts the copy (readers then go to the
database), and a forget unindexes the record. At 100k records this adds ~2 s to the open and
~150 MB.

Between searches a scope keeps its eligibility mask (until a record's valid time or expiry
flips it; an admission, a state change or a forget updates the record's entry), the neighbourhood
neighbours lend over (an admission appends to it; a forget drops it) and each query term's BM25F
contributions times its weighted IDF (until any admission, forget or merge in the scope; at most
``CONTRIBUTION_BYTES``).

Vectors (the semantic channel) are a float32 matrix per scope and model, one row per record
(1.5 KB per 384-dimension record, as stored), so the nearest neighbours are a matrix-vector
product (the SQL scan over ``list_inner_product`` took ~80 ms at 100k records). Similarities
are float64 (``_similarities``: the answer must not depend on how BLAS blocks a product), but
converting every row to float64 cost ~30 ms at 100k records; so ``nearest`` first takes the
float32 product of every row (~4 ms), then the float64 similarities of only the rows within
float32's error bound of the page (``_candidates``), and answers what the float64 pass over
every row would. Rows of forgotten records stay allocated but masked until the store reopens.

Building at open (``IndexBuilder``) streams: the indexed records' rows first, then their
opened projections in any order, each appended to per-scope byte buffers and vector matrices
(no per-record objects beyond the row), the arrays made once per scope. Memory per record at
100k and 1M: docs/performance.md "Start-up and memory at scale".
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from engram_core.store.changes import (
    Change,
    Posting,
    RecordIndexed,
    RecordRowChanged,
    RecordStateChanged,
    RecordUnindexed,
    ScopeProjectionsDropped,
    VectorIndexed,
)
from engram_core.store.fields import FIELD_CODE, FIELDS
from engram_core.store.port import LexicalPage, LexicalStats, RecordRow
from engram_core.store.projection import split
from engram_core.store.vector_sketch import VectorSketch
from engram_core.store.vector_sketch import available as sketch_available

__all__ = ["FIELDS", "FIELD_CODE", "IndexBuilder", "Posting", "RecordMeta", "SearchIndex"]

NEVER = np.iinfo(np.int64).max  # no valid_time end / no expiry
MERGE_AT = 65_536  # buffered postings of a scope before they are merged into its arrays
CONTRIBUTION_BYTES = 32 << 20  # per scope: cached term contributions (a common term: ~1 MB at 100k)
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


@dataclass
class RecordMeta:
    """What read-time eligibility needs of one indexed record (SPEC §5)."""

    record_id: str
    current: bool  # state == accepted_current
    accepted_cursor: int
    state_cursor: int
    valid_t: int
    valid_t_end: int | None
    expires_at_ms: int | None
    # Who captured it and when (``session_of``; None: unknown, e.g. restored from an old backup):
    # neighbours of one session captured close together lend each other (v4).
    session: str | None = None
    captured_at_ms: int | None = None
    # The record's row as committed, for searches to read their page from memory (a DuckDB
    # point read of ten rows by id costs ~3 ms at 100k records); None: read it from the database.
    row: RecordRow | None = None

    @classmethod
    def of(cls, row: RecordRow) -> RecordMeta:
        return cls(row.record_id, row.state == "accepted_current", row.accepted_cursor, row.state_cursor,
                   row.valid_t, row.valid_t_end, row.expires_at_ms, session_of(row), row.captured_at_ms, row=row)


def session_of(row: RecordRow) -> str | None:
    """The host-bound session a record was captured in, as one key: the session id is the host's,
    so two principals (or agents) of a scope may use the same one; only all three together name
    one session."""
    if row.session is None:
        return None
    return f"{row.principal}\x00{row.agent_id}\x00{row.session}"


def _linked(vt: np.ndarray, vt_before: np.ndarray, session: np.ndarray, session_before: np.ndarray,
            captured: np.ndarray, captured_before: np.ndarray, within_ms: int, session_ms: int) -> np.ndarray:
    """Per pair of documents (later, earlier), whether neighbours link them (``_Columns._neighbourhood``):
    valid times within ``within_ms``, or (``session_ms`` > 0) one known capture session with
    capture instants and valid times each within ``session_ms``."""
    gap = np.abs(vt - vt_before)
    link = gap <= within_ms
    if session_ms > 0:
        link |= ((session == session_before) & (session >= 0) & (np.abs(captured - captured_before) <= session_ms)
                 & (gap <= session_ms))
    return link


def _next_flip(valid_t: np.ndarray, valid_end: np.ndarray, expires: np.ndarray, now_ms: int) -> int:
    """The first instant after ``now_ms`` at which ``valid_t <= now``, ``valid_end >= now`` or
    ``expires > now`` changes for any of these documents (NEVER: none does)."""
    later = [int(a.min()) for a in (valid_t[valid_t > now_ms], expires[expires > now_ms]) if len(a)]
    ending = valid_end[(valid_end >= now_ms) & (valid_end < NEVER)]
    if len(ending):
        later.append(int(ending.min()) + 1)
    return min(later, default=NEVER)


class _Tail:
    """A 1-D array that grows at its end in amortized constant time: ``view`` is the first ``n``
    entries of a buffer with room to spare. Appending one entry used to copy the whole array
    (``np.append``): at 100k records, extending the kept eligibility mask and neighbourhood
    with an admitted record cost ~0.6 ms, under the index's lock, on every core that indexed it.
    Writing in place is safe because the index is read and changed only under its owner's lock
    (``StoreKernel.search_index``), and nothing keeps a view past it."""

    __slots__ = ("buf", "n")

    def __init__(self, values: np.ndarray) -> None:
        self.buf = np.empty(max(16, 2 * len(values)), dtype=values.dtype)
        self.buf[: len(values)] = values
        self.n = len(values)

    def append(self, value: Any) -> None:
        if self.n == len(self.buf):
            grown = np.empty(2 * len(self.buf), dtype=self.buf.dtype)
            grown[: self.n] = self.buf
            self.buf = grown
        self.buf[self.n] = value
        self.n += 1

    @property
    def view(self) -> np.ndarray:
        return self.buf[: self.n]


def _read_only(view: np.ndarray) -> np.ndarray:
    view.flags.writeable = False  # this view only: the kept buffer stays the owner's to change
    return view


@dataclass
class _Order:
    """The live documents in order and who neighbours whom (``_Columns._neighbourhood``)."""

    key: tuple[int, int, int]  # (span, within_ms, session_ms)
    live: _Tail  # live documents in order
    position: _Tail  # each document's place among the live ones (-1: not live)
    close: list[_Tail]  # per step 1..span: whether the live documents ``step`` places apart are linked
    pairs: list[tuple[_Tail, _Tail]]  # per step: those linked pairs, as documents (earlier, later)
    apart: list[_Tail]  # per step: the places p whose documents p and p + step are not linked


class _Columns:
    """Growable per-record columns of one scope, indexed by the scope's local document number."""

    def __init__(self) -> None:
        self.n = 0
        self.record_ids: list[str] = []
        self.rows: list[RecordRow | None] = []
        cap = 1024
        self.live = np.zeros(cap, dtype=bool)
        self.current = np.zeros(cap, dtype=bool)
        self.accepted = np.zeros(cap, dtype=np.int64)
        self.changed = np.zeros(cap, dtype=np.int64)
        self.valid_t = np.zeros(cap, dtype=np.int64)
        self.valid_end = np.zeros(cap, dtype=np.int64)
        self.expires = np.zeros(cap, dtype=np.int64)
        self.session = np.full(cap, -1, dtype=np.int64)  # a code per capture session (-1: unknown)
        self.captured = np.zeros(cap, dtype=np.int64)  # capture instant (ms)
        self._session_codes: dict[str, int] = {}
        self.cursor_bound = 0  # at least every document's accepted and state cursor
        # The last eligibility mask computed for a pin at or past ``cursor_bound`` (where the
        # cursors no longer matter), and the instants [from, until) over which no document's
        # valid time or expiry changes it. A change to a document updates its entry (``_mask_with``).
        self._mask: _Tail | None = None
        self._mask_from = self._mask_until = 0
        self._order: _Order | None = None  # neighbourhood of documents (see _neighbourhood)
        self._scratch_buf: np.ndarray | None = None  # lend's working buffer (``_scratch``)

    _ARRAYS = ("live", "current", "accepted", "changed", "valid_t", "valid_end", "expires", "session", "captured")

    def add(self, meta: RecordMeta) -> int:
        if self.n == len(self.live):
            for name in self._ARRAYS:
                old = getattr(self, name)
                grown = np.full(len(old) * 2, -1 if name == "session" else 0, dtype=old.dtype)
                grown[: self.n] = old[: self.n]
                setattr(self, name, grown)
        doc = self.n
        self.n += 1
        self.record_ids.append(meta.record_id)
        self.rows.append(meta.row)
        self.live[doc] = True
        self._assign(doc, meta)
        # A new document comes after every other: what was derived from the others still holds,
        # and is extended by the new one instead of recomputed over the whole scope on the next
        # search (at 100k records the neighbourhood and the mask cost ~2.4 ms, paid by the first
        # search after every admission, this core's or another's it caught up with).
        if self._order is not None and not self._order_appended(self._order, doc):
            self._order = None
        if self._mask is not None:
            self._mask_with(doc, appended=True)
        return doc

    def load_rows(self, rows: list[RecordRow]) -> None:
        """Every document at once, as ``add`` for each in order would (the index build at open:
        one array per column instead of a Python call per record and column)."""
        n = len(rows)
        cap = max(1024, n)

        def column(values: Iterable[Any], dtype: Any) -> np.ndarray:
            out = np.zeros(cap, dtype=dtype)
            out[:n] = np.fromiter(values, dtype=dtype, count=n)
            return out

        self.n = n
        self.record_ids = [r.record_id for r in rows]
        self.rows = list(rows)
        self.live = np.zeros(cap, dtype=bool)
        self.live[:n] = True
        self.current = column((r.state == "accepted_current" for r in rows), bool)
        self.accepted = column((r.accepted_cursor for r in rows), np.int64)
        self.changed = column((r.state_cursor for r in rows), np.int64)
        self.valid_t = column((r.valid_t for r in rows), np.int64)
        self.valid_end = column((NEVER if r.valid_t_end is None else r.valid_t_end for r in rows), np.int64)
        self.expires = column((NEVER if r.expires_at_ms is None else r.expires_at_ms for r in rows), np.int64)
        self._session_codes = {}
        self.session = column((self._session_code(session_of(r)) for r in rows), np.int64)
        self.session[n:] = -1
        self.captured = column((r.captured_at_ms or 0 for r in rows), np.int64)
        self.cursor_bound = max(int(self.accepted[:n].max()), int(self.changed[:n].max())) if n else 0
        self._mask = None

    def _assign(self, doc: int, meta: RecordMeta) -> None:
        self.cursor_bound = max(self.cursor_bound, meta.accepted_cursor, meta.state_cursor)
        self.current[doc] = meta.current
        self.accepted[doc] = meta.accepted_cursor
        self.changed[doc] = meta.state_cursor
        self.valid_t[doc] = meta.valid_t
        self.valid_end[doc] = NEVER if meta.valid_t_end is None else meta.valid_t_end
        self.expires[doc] = NEVER if meta.expires_at_ms is None else meta.expires_at_ms
        self.session[doc] = self._session_code(meta.session)
        self.captured[doc] = meta.captured_at_ms or 0

    def _session_code(self, session: str | None) -> int:
        if session is None:
            return -1
        return self._session_codes.setdefault(session, len(self._session_codes))

    def set_state(self, doc: int, current: bool, state_cursor: int) -> None:
        self.cursor_bound = max(self.cursor_bound, state_cursor)
        self.current[doc] = current
        self.changed[doc] = state_cursor
        self.rows[doc] = None  # the row changed: readers go to the database
        if self._mask is not None:
            self._mask_with(doc)

    def kill(self, doc: int) -> None:
        self._order = None  # the live documents' order changes in the middle: computed again
        self.live[doc] = False
        self.rows[doc] = None
        if self._mask is not None:
            self._mask_with(doc)

    def _mask_with(self, doc: int, *, appended: bool = False) -> None:
        """Set ``doc``'s entry of the kept eligibility mask (``eligible``) as its columns now say,
        ``appended`` as a new last entry. The mask serves pins at or past ``cursor_bound`` only,
        which the caller has raised to ``doc``'s cursors, so only its state and times count; they
        are taken at ``_mask_from``, and the instants after it at which they flip end the
        mask's span as ``eligible`` ends it for every document."""
        assert self._mask is not None
        now, one = self._mask_from, slice(doc, doc + 1)
        valid_t, valid_end, expires = self.valid_t[one], self.valid_end[one], self.expires[one]
        entry = bool(self.live[doc] and self.current[doc] and valid_t[0] <= now and valid_end[0] >= now
                     and expires[0] > now)
        self._mask_until = min(self._mask_until, _next_flip(valid_t, valid_end, expires, now))
        if appended:
            self._mask.append(entry)
        else:
            self._mask.buf[doc] = entry

    def _order_appended(self, order: _Order, doc: int) -> bool:
        """Extend ``order`` (``_neighbourhood``) with ``doc``, just added after every other
        document, as the last live document: its links to the ``span`` documents before it, by
        the same rules. False (computed again when next needed) if the kept order does not end
        where ``doc`` starts."""
        span, within_ms, session_ms = order.key
        if order.position.n != doc:
            return False
        at = order.live.n  # the new document's place among the live ones
        order.live.append(doc)
        order.position.append(at)
        steps = min(span, at)
        if steps == 0:
            return True
        # The documents 1..steps places before, and their links to ``doc`` in one call of the rule.
        before = order.live.view[at - steps : at][::-1]
        this = np.full(steps, doc)
        links = _linked(self.valid_t[this], self.valid_t[before], self.session[this], self.session[before],
                        self.captured[this], self.captured[before], within_ms, session_ms).tolist()
        for step, (prev, link) in enumerate(zip(before.tolist(), links, strict=True), 1):
            order.close[step - 1].append(link)
            if link:
                a, b = order.pairs[step - 1]
                a.append(prev)
                b.append(doc)
            else:
                order.apart[step - 1].append(at - step)
        return True

    def lend(self, scores: np.ndarray, eligible: np.ndarray, span: int, weight: float, within_ms: int,
             session_ms: int = 0) -> np.ndarray:
        """``scores`` plus, for each document, ``weight`` times the best score among its eligible
        neighbours: the ``span`` live documents indexed just before and after it that are linked to
        it (``_neighbourhood``: the same valid time, or one capture session close together in
        time). Neighbours are counted over live documents only, so a forgotten record in between
        changes nothing, as after a reload (which does not see it). Only eligible documents lend:
        what the search may not return does not count.

        The work is proportional to what can lend: nothing when no two neighbours are linked
        (notes captured and dated days apart), the matches' neighbours when few documents
        match, the linked pairs when few are linked, else shifted passes over the scope."""
        if span <= 0 or weight == 0:
            return scores
        live, position, close, pairs, apart = self._neighbourhood(span, within_ms, session_ms)
        linked = sum(len(a) for a, _ in pairs)
        if linked == 0:
            return scores
        path = LEND_PATH
        if path is None and linked * 8 < len(live):
            path = "pairs"
        if path in (None, "sparse"):
            matched = (scores > 0) & eligible[: len(scores)]
            # With a span of 3, visiting the matches' neighbours costs ~70 ns a match, the dense
            # passes ~6 ns a document (at 100k documents captured live: 0.58 ms dense against
            # 1.56 ms sparse for the median query's 18k matches); below one match in 20, sparse wins.
            path = path or ("sparse" if np.count_nonzero(matched) * 20 < len(live) else "dense")
        lent = np.zeros(len(scores))
        if path == "sparse":  # few matches: visit each match's neighbours
            src = np.flatnonzero(matched)
            src_pos, src_score = position[src], scores[src]
            for step in range(1, span + 1):
                before = src_pos - step  # the neighbour ``step`` places before: close[step-1][before]
                ok = before >= 0
                ok[ok] = close[step - 1][before[ok]]
                tgt = live[before[ok]]  # one (step, direction) maps distinct sources to distinct targets
                lent[tgt] = np.maximum(lent[tgt], src_score[ok])
                after = src_pos + step
                ok = after < len(live)
                ok[ok] = close[step - 1][src_pos[ok]]
                tgt = live[after[ok]]
                lent[tgt] = np.maximum(lent[tgt], src_score[ok])
        elif path == "pairs":  # few linked documents: only their pairs
            for a, b in pairs:  # documents ``step`` places apart sharing a time, a before b
                sa = np.where(eligible[a], scores[a], 0.0)
                sb = np.where(eligible[b], scores[b], 0.0)
                lent[a] = np.maximum(lent[a], sb)  # within one step each document is once an a, once a b
                lent[b] = np.maximum(lent[b], sa)
        else:  # many matches and links: shifted passes over the live documents in order
            every = len(live) == len(scores)  # no document forgotten: no gathering needed
            dense = np.where(eligible[: len(scores)], scores, 0.0) if every else np.where(eligible[live], scores[live], 0.0)
            run = lent if every else np.zeros(len(live))
            # Each step: the scores ``step`` places on, with the unlinked places zeroed, then the
            # maximum. A copy and a scatter of the unlinked places cost a fifth of ``np.where``
            # over the link mask (~0.12 ms at 100k documents, per step and direction).
            shifted = self._scratch(len(dense))
            for step in range(1, span + 1):
                far, to = apart[step - 1], len(dense) - step
                if to <= 0:  # fewer live documents than the step: nobody that far apart
                    break
                shifted[:to] = dense[step:]
                shifted[far] = 0.0
                np.maximum(run[:-step], shifted[:to], out=run[:-step])
                shifted[:to] = dense[:-step]
                shifted[far] = 0.0
                np.maximum(run[step:], shifted[:to], out=run[step:])
            if not every:
                lent[live] = run
        lent *= weight  # in place: two passes over the scope fewer than ``scores + weight * lent``
        lent += scores
        return lent

    def _scratch(self, n: int) -> np.ndarray:
        """A float64 buffer of ``n`` entries kept between searches (under the index's lock, like
        every kept form): a fresh one costs its page faults again on every lending."""
        if self._scratch_buf is None or len(self._scratch_buf) < n:
            self._scratch_buf = np.empty(max(n, 1024) * 2)
        return self._scratch_buf[:n]

    def neighbourhood_of(self, neighbours: tuple[int, float, int, int]
                         ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[tuple[np.ndarray, np.ndarray]],
                                    list[np.ndarray]]:
        """``_neighbourhood`` for a profile's (span, weight, within_ms, session_ms)."""
        span, _, within_ms, session_ms = neighbours
        return self._neighbourhood(span, within_ms, session_ms)

    def best_neighbour(self, docs: np.ndarray, value_of: Callable[[np.ndarray], np.ndarray],
                       neighbours: tuple[int, float, int, int]) -> np.ndarray:
        """For each of ``docs`` (live), the best non-negative ``value_of`` among its neighbours as
        ``lend`` finds them, 0 if none: ``lend``'s lent value at these documents alone, when the
        lenders are the documents whose value is above 0 (``value_of`` is asked only for
        neighbours of ``docs``)."""
        live, position, close, _, _ = self.neighbourhood_of(neighbours)
        at = position[docs]
        best = np.zeros(len(docs))
        for step in range(1, neighbours[0] + 1):
            c = close[step - 1]
            before = at - step
            ok = before >= 0
            ok[ok] = c[before[ok]]
            best[ok] = np.maximum(best[ok], value_of(live[before[ok]]))
            after = at + step
            ok = after < len(live)
            ok[ok] = c[at[ok]]
            best[ok] = np.maximum(best[ok], value_of(live[after[ok]]))
        return best

    def _neighbourhood(self, span: int, within_ms: int, session_ms: int = 0
                       ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[tuple[np.ndarray, np.ndarray]],
                                  list[np.ndarray]]:
        """(live documents in order, each document's place among them (-1: not live), per step
        1..span whether the live documents ``step`` places apart are linked, those pairs as
        documents, and the places not linked to the one ``step`` on), kept until a document is
        removed or changed (an admission extends them).

        Two documents are linked when their valid times are within ``within_ms`` of each other
        (v3: a session's turns captured after the fact with the session's date), or, with
        ``session_ms`` > 0 (v4), when they were captured in the same known session, their
        capture instants and their valid times each within ``session_ms`` of the other's: an
        agent capturing a conversation as it goes, each turn dated with its own instant. Both
        times, because either alone links what does not belong together: notes of one session
        captured in one burst but dated days apart (a backfill) are not one conversation, nor are
        records dated minutes apart but captured hours apart (a shared valid time links them by
        the first rule anyway)."""
        key = (span, within_ms, session_ms)
        if self._order is None or self._order.key != key:
            live = np.flatnonzero(self.live[: self.n])
            position = np.full(self.n, -1, dtype=np.int64)
            position[live] = np.arange(len(live))
            vt, session, captured = self.valid_t[live], self.session[live], self.captured[live]
            close = [_linked(vt[step:], vt[:-step], session[step:], session[:-step], captured[step:],
                             captured[:-step], within_ms, session_ms) for step in range(1, span + 1)]
            pairs = [(live[np.flatnonzero(c)], live[np.flatnonzero(c) + step]) for step, c in enumerate(close, 1)]
            self._order = _Order(key, _Tail(live), _Tail(position), [_Tail(c) for c in close],
                                 [(_Tail(a), _Tail(b)) for a, b in pairs], [_Tail(np.flatnonzero(~c)) for c in close])
        o = self._order
        return (o.live.view, o.position.view, [c.view for c in o.close], [(a.view, b.view) for a, b in o.pairs],
                [f.view for f in o.apart])

    def eligible(self, *, now_ms: int, max_cursor: int) -> np.ndarray:
        """SPEC §5 eligibility as of the pin, over every local document.

        Reading seven columns of every document was a fifth of ranking at 100k records, and the
        answer rarely changes between searches: a first page pins the latest cursor, and the
        time conditions flip only at the documents' own instants. So the mask is kept until the
        next instant any of them flips or until a column changes. Read-only for callers."""
        n = self.n
        if max_cursor >= self.cursor_bound and self._mask is not None and self._mask_from <= now_ms < self._mask_until:
            return _read_only(self._mask.view)
        valid_t, valid_end, expires = self.valid_t[:n], self.valid_end[:n], self.expires[:n]
        mask = (self.live[:n] & self.current[:n] & (self.accepted[:n] <= max_cursor) & (self.changed[:n] <= max_cursor)
                & (valid_t <= now_ms) & (valid_end >= now_ms) & (expires > now_ms))
        if max_cursor >= self.cursor_bound:
            self._mask, self._mask_from = _Tail(mask), now_ms
            self._mask_until = _next_flip(valid_t, valid_end, expires, now_ms)
            return _read_only(self._mask.view)
        return mask


@dataclass
class _Postings:
    """Postings of one scope sorted by term: ``terms[i]`` owns rows ``starts[i]:starts[i + 1]``."""

    terms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    df: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    doc: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    fld: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    tf: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    flen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    @classmethod
    def build(cls, term: np.ndarray, doc: np.ndarray, fld: np.ndarray, tf: np.ndarray, flen: np.ndarray) -> _Postings:
        return cls.build_owned([term, doc, fld, tf, flen])

    @classmethod
    def build_owned(cls, arrays: list[np.ndarray]) -> _Postings:
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


class _Scope:
    def __init__(self) -> None:
        self.columns = _Columns()
        self.local: dict[str, int] = {}
        self.base = _Postings()
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
        # Per query term, scoring parameters and weighted IDF: (documents, BM25F contribution
        # times the IDF) of its postings. Common terms recur across searches and their
        # arithmetic was most of ranking; any change to the scope's postings or statistics
        # empties it.
        self.contributions: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}
        self.contribution_bytes = 0

    def put_vector(self, record_id: str, model: str, vector: Any) -> None:
        doc = self.local.get(record_id)
        if doc is None:
            return  # not indexed (never happens in admission: index_record comes first)
        # Held as the float32 values the projection stores; similarities are computed in float64
        # (``_similarities``).
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
        ``SKETCH_FROM`` rows or without onnxruntime."""
        found = self.sketches.get(model)
        if found is None and n >= SKETCH_FROM and sketch_available():
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
        if self.buffered >= MERGE_AT:
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
            rows = self._rows_of(doc)
        if not rows:
            return  # as the database's unindex: a record without postings leaves the statistics alone
        for term in {t for t, _, _ in rows}:
            self.df_delta[term] = self.df_delta.get(term, 0) - 1
        for code, length in {(c, n) for _, c, n in rows}:
            self.field_docs[code] -= 1
            self.field_len[code] -= length
        self.docs -= 1

    def _rows_of(self, doc: int) -> list[tuple[int, int, int]]:
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
                     b: float, idf: float = 1.0) -> tuple[np.ndarray, np.ndarray] | None:
        """(documents, weight * (k1 + 1) * tf / (tf + k1 * (1 - b + b * len / avg)) * idf) of the
        term's postings, kept while the scope does not change (bounded by CONTRIBUTION_BYTES).

        With the term's weighted IDF: multiplying each posting by it was a third of ranking a
        capture's whole text as the query (50 terms, 1.3M postings at 100k records); the
        products are the ones ``rank`` made from the unweighted contributions, and a term keeps
        its IDF until the scope changes, which empties the cache."""
        key = (term, k1, b, weight.tobytes(), inv_avg.tobytes(), idf)
        hit = self.contributions.get(key)
        if hit is not None:
            return hit
        rows = self.term_rows(term)
        if rows is None:
            return None
        doc, fld, tf, flen = rows
        fld = fld.astype(np.intp)
        # float64 arrays first: a Python scalar times a float32 array would stay float32 (NEP 50).
        norm = k1 * (1 - b + (inv_avg[fld] * flen) * b)
        value = (doc, (weight[fld] * (k1 + 1)) * tf / (norm + tf) * idf)
        size = value[0].nbytes + value[1].nbytes
        if self.contribution_bytes + size > CONTRIBUTION_BYTES:
            self.forget_contributions()
        if size <= CONTRIBUTION_BYTES:
            self.contributions[key] = value
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
        self.base = _Postings.build(term[keep], doc[keep], fld[keep], tf[keep], flen[keep])
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


class _Loading:
    """One scope's projections as collected at open, before its arrays are built: byte buffers
    that grow per record (no per-record objects), and each model's vectors written straight
    into their float32 matrix."""

    def __init__(self) -> None:
        self.scope = _Scope()
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

    def finish(self, *, sketch: bool = True) -> _Scope:
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
            scope.base = _Postings.build_owned(arrays)
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
        self.index = SearchIndex()
        self._sketch_vectors = sketch_vectors
        self._loading: dict[tuple[str, str], _Loading] = {}
        # Repeated row values (scope, state, principal, ...) share one string object.
        self._interned: dict[str, str] = {}

    def _intern(self, value: str | None) -> str | None:
        return None if value is None else self._interned.setdefault(value, value)

    def add_row(self, row: RecordRow) -> None:
        self.add_values([getattr(row, f.name) for f in fields(RecordRow)])

    def add_values(self, values: Sequence[Any]) -> None:
        """A row as fetched (``record_sql.RECORD_COLS``' order): one ``RecordRow`` made from it."""
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
        self.index._scope_of[row.record_id] = key
        part.opened.append(0)

    def row(self, record_id: str) -> RecordRow | None:
        """The row added for this record (the store needs its key slot to open the projection)."""
        key = self.index._scope_of.get(record_id)
        if key is None:
            return None
        part = self._loading[key]
        return part.rows[part.scope.local[record_id]]

    def add_projection(self, record_id: str, raw: bytes) -> None:
        """The record's opened projection (``projection.encode``'s bytes)."""
        key = self.index._scope_of.get(record_id)
        if key is not None:
            part = self._loading[key]
            part.add(part.scope.local[record_id], raw)

    def finish(self) -> SearchIndex:
        index = self.index
        for key, part in self._loading.items():
            scope = part.scope
            scope.columns.load_rows(part.rows)
            part.rows = []
            for doc in np.flatnonzero(np.frombuffer(part.opened, dtype=np.uint8) == 0).tolist():
                record_id = scope.columns.record_ids[doc]
                scope.columns.kill(doc)
                del scope.local[record_id]
                del index._scope_of[record_id]
            scope.docs = len(scope.local)
            index._scopes[key] = part.finish(sketch=self._sketch_vectors)
        self._loading = {}
        return index


class SearchIndex:
    """All scopes' lexical and vector projections in memory. Not thread-safe by itself:
    ``DuckDBStore`` holds its publish lock around every change and every read."""

    def __init__(self) -> None:
        self._scopes: dict[tuple[str, str], _Scope] = {}
        self._scope_of: dict[str, tuple[str, str]] = {}

    def document_count(self) -> int:
        """Records indexed across all scopes (the metrics' index size)."""
        return sum(scope.docs for scope in self._scopes.values())

    def scope_documents(self, tenant: str, workspace: str) -> int:
        """Records indexed in one scope."""
        scope = self._scopes.get((tenant, workspace))
        return scope.docs if scope is not None else 0

    def replace_scope(self, tenant: str, workspace: str, built: SearchIndex) -> None:
        """Hold ``built``'s index of the scope instead of this one's (a scope loaded on first use)."""
        self.drop_scope(tenant, workspace)
        scope = built._scopes.get((tenant, workspace))
        if scope is not None:
            self._scopes[(tenant, workspace)] = scope
            for record_id in scope.local:
                self._scope_of[record_id] = (tenant, workspace)

    def drop_scope(self, tenant: str, workspace: str) -> None:
        """Forget the scope's index (evicted, or about to be replaced)."""
        self.apply([ScopeProjectionsDropped(tenant, workspace)])

    def vector_models(self) -> set[str]:
        """The models whose vectors some scope holds (start-up: vectors of an older model)."""
        return {model for scope in self._scopes.values() for model in scope.vectors}

    # -- changes (applied by the store kernel after each commit) -------------------
    def apply(self, changes: Iterable[Change]) -> None:
        """Follow committed changes (``store/changes.py``), in the order they were made."""
        for change in changes:
            if isinstance(change, RecordIndexed):
                key = (change.row.tenant, change.row.workspace)
                scope = self._scopes.get(key)
                if scope is None:  # (not setdefault: a scope's arrays are made only for a new one)
                    scope = self._scopes[key] = _Scope()
                scope.add(RecordMeta.of(change.row), change.postings)
                self._scope_of[change.row.record_id] = key
            elif isinstance(change, RecordStateChanged):
                key = self._scope_of.get(change.record_id)
                if key is not None:
                    self._scopes[key].set_state(change.record_id, change.current, change.state_cursor)
                    if change.body_dropped:
                        self._scopes[key].evict_row(change.record_id)
            elif isinstance(change, RecordRowChanged):
                key = self._scope_of.get(change.record_id)
                if key is not None:
                    self._scopes[key].evict_row(change.record_id)
            elif isinstance(change, RecordUnindexed):
                scope = self._scopes.get((change.tenant, change.workspace))
                if scope is not None:
                    scope.remove(change.record_id)
                self._scope_of.pop(change.record_id, None)
            elif isinstance(change, VectorIndexed):
                scope = self._scopes.get((change.tenant, change.workspace))
                if scope is not None:
                    scope.put_vector(change.record_id, change.model, change.vector)
            elif isinstance(change, ScopeProjectionsDropped):
                dropped = self._scopes.pop((change.tenant, change.workspace), None)
                for record_id in dropped.local if dropped else ():
                    self._scope_of.pop(record_id, None)
            else:
                raise ValueError(f"unknown committed change {change!r}")

    def state_cursor_of(self, tenant: str, workspace: str, record_id: str) -> int | None:
        """The state cursor the index holds for a record (None: not indexed)."""
        scope = self._scopes.get((tenant, workspace))
        doc = scope.local.get(record_id) if scope is not None else None
        return int(scope.columns.changed[doc]) if scope is not None and doc is not None else None

    def indexed_postings(self, tenant: str, workspace: str, record_id: str) -> int | None:
        """How many postings the index holds for one record; None when it does not hold the record."""
        scope = self._scopes.get((tenant, workspace))
        doc = scope.local.get(record_id) if scope is not None else None
        if scope is None or doc is None:
            return None
        rows = scope.terms_of.get(doc)
        return len(rows) if rows is not None else len(scope._rows_of(doc))

    # -- reads ----------------------------------------------------------------------
    def rows(self, tenant: str, workspace: str, record_ids: list[str]) -> dict[str, RecordRow]:
        """The committed rows the index holds for these records of the scope (not those whose
        row changed since it was indexed: their state or body is read from the database)."""
        scope = self._scopes.get((tenant, workspace))
        if scope is None:
            return {}
        found = {}
        for rid in record_ids:
            doc = scope.local.get(rid)
            row = scope.columns.rows[doc] if doc is not None else None
            if row is not None:
                found[rid] = row
        return found

    def stats(self, tenant: str, workspace: str, terms: list[int]) -> LexicalStats:
        scope = self._scopes.get((tenant, workspace))
        if scope is None:
            return LexicalStats(docs=0, avg_len={}, df={})
        avg = {FIELDS[c]: scope.field_len[c] / max(scope.field_docs[c], 1)
               for c in range(len(FIELDS)) if scope.field_docs[c] > 0}
        unique = sorted(set(terms))
        df = {t: n for t, n in zip(unique, scope.dfs(unique), strict=True) if n > 0}
        return LexicalStats(docs=scope.docs, avg_len=avg, df=df)

    def rank(
        self, tenant: str, workspace: str, stats: LexicalStats, weights: dict[str, float], *, k1: float, b: float,
        now_ms: int, half_life_ms: int, lexical_weight: float, max_accepted_cursor: int,
        best_bm25: float | None, after: tuple[float, int, str] | None, limit: int,
        window: tuple[int, int] | None = None, neighbours: tuple[int, float, int, int] | None = None,
    ) -> LexicalPage:
        """BM25F-style ranking (SPEC §11) of records eligible at ``now_ms``, with pinned statistics.

        Scores are ``lexical_weight * bm25 / best_bm25 + (1 - lexical_weight) * recency``,
        rounded to 1e-9 so that the same inputs give the same order on every page; rows are
        ordered by score desc, valid_t desc, record_id asc, strictly after ``after`` when
        paging. ``best_bm25`` None means: normalize to this snapshot's best eligible hit and
        report it (first page); later pages pass the pinned value. Records accepted, or
        changed state, after ``max_accepted_cursor`` are not candidates. ``window`` (a valid-time
        window the query named) replaces recency by closeness to it (``timeq.proximity``).
        ``neighbours`` (span, weight, within_ms, session_ms): each eligible record's BM25 gains
        ``weight`` times its best eligible neighbour's (``_Columns.lend``), so the neighbours of
        matches are candidates too.
        """
        scope = self._scopes.get((tenant, workspace))
        # A term's weight in the query (1, or the thesaurus's for a related term) times its IDF.
        idf = [(t, stats.weights.get(t, 1.0) * math.log(1 + (stats.docs - n + 0.5) / (n + 0.5)))
               for t, n in sorted(stats.df.items()) if n > 0]
        weight = np.zeros(len(FIELDS))
        inv_avg = np.zeros(len(FIELDS))
        for name, w in weights.items():
            avg = stats.avg_len.get(name)
            if avg and name in FIELD_CODE:
                weight[FIELD_CODE[name]], inv_avg[FIELD_CODE[name]] = w, 1.0 / avg
        if scope is None or not idf or not weight.any():
            return LexicalPage(0, [], best_bm25 or 0.0)
        cols = scope.columns
        docs, contribs = [], []
        for term, term_idf in idf:
            found = scope.contribution(term, weight, inv_avg, k1, b, term_idf)
            if found is None:
                continue
            docs.append(found[0])
            contribs.append(found[1])
        if not docs:
            return LexicalPage(0, [], best_bm25 or 0.0)
        # Each term's contributions added in place, in order (``np.add.at`` is unbuffered: a
        # document's rows add up in the same order, to the same sums, as ``np.bincount`` over
        # all terms' postings end to end, which first copied every posting twice: for a
        # capture's whole text as the query, 1.3M postings at 100k records, 4x slower).
        bm25 = np.zeros(cols.n)
        for doc, contrib in zip(docs, contribs, strict=True):
            np.add.at(bm25, doc, contrib)
        eligible = cols.eligible(now_ms=now_ms, max_cursor=max_accepted_cursor)
        own = bm25
        if neighbours is not None:
            bm25 = cols.lend(bm25, eligible, *neighbours)
        hit = np.flatnonzero((bm25 > 0) & eligible)
        if len(hit) == 0:
            return LexicalPage(0, [], best_bm25 or 0.0)
        raw = bm25[hit]
        best = float(raw.max()) if best_bm25 is None else best_bm25
        own_best = float(own[hit].max())
        total = len(hit)

        def scored(at: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
            """The scores and valid times of the hits ``at`` selects."""
            vt = cols.valid_t[hit[at]]
            if window is None:
                recency = np.exp2(np.maximum(now_ms - vt, 0) / -float(half_life_ms))  # 0.5 ** age; np.power is 5x slower
            else:  # the query named a time (services/timeq.py): closeness to its window instead of recency
                start, end = window
                scale = float(max(end - start, 7 * 86_400_000))
                recency = np.exp2((np.maximum(start - vt, 0) + np.maximum(vt - end, 0)) / -scale)
            return _score(raw[at], best, recency, lexical_weight), vt

        if after is None:
            found = _first_page(raw, best, limit, lexical_weight, scored)
            if found is not None:
                at, score, vt = found
                return LexicalPage(total, _top(hit[at], score, vt, cols.record_ids, limit), best, own_best)
        score, vt = scored(slice(None))
        if after is not None:
            a_score, a_vt, a_rid = after
            later = (score < a_score) | ((score == a_score) & (vt < a_vt))
            tie = np.flatnonzero((score == a_score) & (vt == a_vt))
            for i in tie:
                later[i] = cols.record_ids[hit[i]] > a_rid
            hit, score, vt = hit[later], score[later], vt[later]
        rows_out = _top(hit, score, vt, cols.record_ids, limit)
        return LexicalPage(total, rows_out, best, own_best)


    def nearest(self, tenant: str, workspace: str, model: str, vector: list[float], *, now_ms: int,
                max_accepted_cursor: int, min_similarity: float, limit: int,
                neighbours: tuple[int, float, int, int] | None = None) -> list[tuple[str, float, int]]:
        """Eligible records by cosine similarity (vectors are unit length), at least
        ``min_similarity``, best first, ties by record_id: (record_id, similarity, valid_t).
        ``neighbours`` (span, weight, within_ms, session_ms): records are ordered and thresholded by their
        similarity (at least 0) plus ``weight`` times their best eligible neighbour's
        (``_Columns.lend``); rows still carry their own similarity."""
        scope = self._scopes.get((tenant, workspace))
        if scope is None or model not in scope.vectors or limit <= 0:
            return []
        matrix, present = scope.vectors[model]
        cols = scope.columns
        n = min(cols.n, len(matrix))
        query = np.asarray(vector, dtype=np.float64)
        ok = present[:n] & cols.eligible(now_ms=now_ms, max_cursor=max_accepted_cursor)[:n]
        # Two passes: approximate similarities of every row, then the float64 ones
        # (``_similarities``) of the rows within the first pass's error bound of the page. The
        # answer is the float64 answer: a row the first pass leaves out cannot be on the page
        # (``_candidates``). The first pass reads the int8 sketch at scale (``vector_sketch``:
        # ~1 ms at 100k records), else the float32 rows (BLAS's product: ~5 ms at 100k, against
        # ~30 ms for converting the rows to float64 first).
        sketch = scope.sketch(model, n)
        if sketch is not None:
            approx, err = sketch.similarities(query, n)
        else:
            approx = (matrix[:n] @ query.astype(np.float32)).astype(np.float64)
            err = _float32_error(matrix.shape[1], scope.vector_norm(model), float(np.linalg.norm(query)))
        if neighbours is None:
            slack = err + 1e-9  # the float64 similarities are rounded to 1e-9, the first pass's are not
        else:  # key = own + weight * a neighbour's: each off by at most err, both rounded
            slack = (1 + abs(neighbours[1])) * (err + 1e-9) + 1e-9
        cand = _candidates(_semantic_keys(cols, ok, approx, n, neighbours), ok, min_similarity, limit, slack)
        if len(cand) == 0:
            return []
        # Rows whose float64 similarity the page needs: the candidates and, when neighbours lend,
        # every live document within ``span`` places of one (whoever may lend to it).
        exact_rows = cand
        if neighbours is not None:
            live, position, _, _, _ = cols.neighbourhood_of(neighbours)
            span = neighbours[0]
            places = (position[cand][:, None] + np.arange(-span, span + 1)).ravel()
            # A mark per row, not ``np.union1d``: sorting the few thousand rows cost more than
            # one pass over the scope's flags.
            wanted = np.zeros(n, dtype=bool)
            wanted[live[places[(places >= 0) & (places < len(live))]]] = True
            wanted[cand] = True
            exact_rows = np.flatnonzero(wanted)
        sims = np.round(_similarities(matrix[exact_rows], query), 9)  # by place in exact_rows
        at = np.searchsorted(exact_rows, cand)
        if neighbours is None:
            key = sims[at]
        else:  # as _semantic_keys over every row, but only where a candidate is
            base = np.where(ok[exact_rows], np.maximum(sims, 0.0), 0.0)
            lent = cols.best_neighbour(cand, lambda docs: base[np.searchsorted(exact_rows, docs)], neighbours)
            key = np.round(base[at] + neighbours[1] * lent, 9)
        keep = key >= min_similarity
        hit, score, own = cand[keep], key[keep], sims[at[keep]]
        if len(hit) == 0:
            return []
        if len(hit) > limit:
            kth = np.partition(score, len(score) - limit)[len(score) - limit]
            keep = score >= kth
            hit, score, own = hit[keep], score[keep], own[keep]
        ids = cols.record_ids
        rows = [(ids[d], float(x), float(sim), int(cols.valid_t[d]))
                for d, x, sim in zip(hit.tolist(), score.tolist(), own.tolist(), strict=True)]
        rows.sort(key=lambda r: (-r[1], r[0]))
        return [(rid, sim, vt) for rid, _, sim, vt in rows[:limit]]


_U32 = 2.0**-24  # float32's unit roundoff


def _float32_error(dims: int, row_norm: float, query_norm: float) -> float:
    """A bound on |float32 dot − exact dot| for rows of norm at most ``row_norm``: the query
    rounded to float32 (u each), then any order of float32 multiply-adds over ``dims`` terms
    (γ_dims = dims·u / (1 − dims·u), Higham's bound, FMA or not), both relative to
    Σ|x_i q_i| ≤ ‖x‖‖q‖; plus the float64 reference's own error."""
    gamma = dims * _U32 / (1 - dims * _U32)
    return (gamma * (1 + _U32) + _U32) * row_norm * query_norm * (1 + 1e-6) + 1e-12


def _semantic_keys(cols: _Columns, ok: np.ndarray, sims: np.ndarray, n: int,
                   neighbours: tuple[int, float, int, int] | None) -> np.ndarray:
    """What orders and thresholds the semantic channel, for every row at once: the similarity,
    or with neighbours its eligible non-negative part plus ``weight`` times the best eligible
    neighbour's. ``nearest`` takes it over the float32 similarities, then the same formula at
    the candidates alone (``_Columns.best_neighbour``) over the float64 ones."""
    if neighbours is None:
        return sims
    base = np.zeros(cols.n)
    base[:n] = np.where(ok, np.maximum(sims, 0.0), 0.0)
    return np.round(cols.lend(base, base > 0, *neighbours)[:n], 9)


def _candidates(approx: np.ndarray, ok: np.ndarray, min_similarity: float, limit: int, slack: float) -> np.ndarray:
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


def _similarities(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``matrix @ vector`` in float64 for a float32 matrix, one block of rows at a time.

    float64 so that a similarity does not depend on how BLAS blocks the product (which varies
    with the matrix's size and alignment, i.e. between a running core and one that reloaded):
    float32 sums differed in the last bit, enough to reorder exact ties (scores are rounded to
    1e-9) across a restart. Converting block by block keeps the matrix itself at 4 bytes a value
    (half the memory) for about the time of the float64 product over a float64 matrix."""
    out = np.empty(len(matrix))
    block = np.empty((min(SIMILARITY_BLOCK, len(matrix)), matrix.shape[1]))
    for lo in range(0, len(matrix), SIMILARITY_BLOCK):
        hi = min(lo + SIMILARITY_BLOCK, len(matrix))
        np.copyto(block[: hi - lo], matrix[lo:hi])
        np.dot(block[: hi - lo], vector, out=out[lo:hi])
    return out


def _score(raw: np.ndarray, best: float, recency: np.ndarray, lexical_weight: float) -> np.ndarray:
    """A lexical hit's score: its BM25 relative to the best, and its recency (at most 1)."""
    return np.round(lexical_weight * raw / max(best, 1e-12) + (1 - lexical_weight) * recency, 9)


def _first_page(raw: np.ndarray, best: float, limit: int, lexical_weight: float,
                scored: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(which hits, their scores, their valid times) holding a first page of ``limit``, scoring
    only the best raw BM25s, or None when that cannot be shown (then every hit is scored).

    The score is monotone in the raw BM25 and in recency, which is at most 1: a hit whose raw
    BM25 is below ``floor`` scores at most ``ceiling`` (``_score`` of both). So if ``limit``
    hits at or above ``floor`` all score more than ``ceiling``, no hit below it is on the page,
    nor ties with one that is. Scoring every hit was a third of ranking at 100k records captured
    live (neighbours make most documents hits)."""
    if limit <= 0 or len(raw) <= PRUNE_FROM * limit or not 0.0 <= lexical_weight <= 1.0:
        return None  # (a weight outside [0, 1] would make the score fall with recency or BM25)
    for fraction in PRUNE_FRACTIONS:
        floor = best * fraction
        at = np.flatnonzero(raw >= floor)
        if len(at) < limit:
            continue
        score, vt = scored(at)
        ceiling = _score(np.array([floor]), best, np.ones(1), lexical_weight)[0]
        if np.partition(score, len(score) - limit)[len(score) - limit] > ceiling:
            return at, score, vt
    return None


def _top(hit: np.ndarray, score: np.ndarray, vt: np.ndarray, record_ids: list[str],
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
