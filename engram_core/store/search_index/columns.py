"""One scope's per-record columns: what read-time eligibility needs of each indexed record (SPEC §5),
the eligibility mask kept between searches, and the neighbourhood over which neighbours lend their
scores (``Columns.lend``), extended in place by an admission."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engram_core.store.port import RecordRow
from engram_core.store.search_index import tuning

__all__ = ["NEVER", "Columns", "RecordMeta", "session_of"]

NEVER = np.iinfo(np.int64).max  # no valid_time end / no expiry


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
    """Per pair of documents (later, earlier), whether neighbours link them (``Columns._neighbourhood``):
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
    """The live documents in order and who neighbours whom (``Columns._neighbourhood``)."""

    key: tuple[int, int, int]  # (span, within_ms, session_ms)
    live: _Tail  # live documents in order
    position: _Tail  # each document's place among the live ones (-1: not live)
    close: list[_Tail]  # per step 1..span: whether the live documents ``step`` places apart are linked
    pairs: list[tuple[_Tail, _Tail]]  # per step: those linked pairs, as documents (earlier, later)
    apart: list[_Tail]  # per step: the places p whose documents p and p + step are not linked


class Columns:
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
        path = tuning.LEND_PATH
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
