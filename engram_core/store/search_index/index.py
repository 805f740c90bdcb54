"""``SearchIndex``: every scope's index (``postings.ScopeIndex``) by (tenant, workspace), the committed
changes it follows, and its reads: the rows it holds, lexical statistics, BM25F ranking
(``rank``, scored by ``ranking.py``) and the nearest vectors (``nearest``, ``vectors.py``)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from engram_core.contract.scope import Scope
from engram_core.store.changes import (
    Change,
    RecordIndexed,
    RecordRowChanged,
    RecordStateChanged,
    RecordUnindexed,
    ScopeProjectionsDropped,
    VectorIndexed,
)
from engram_core.store.fields import FIELD_CODE, FIELDS
from engram_core.store.port import LexicalPage, LexicalQuery, LexicalStats, RecordRow
from engram_core.store.search_index.columns import RecordMeta
from engram_core.store.search_index.postings import ScopeIndex, add_layers
from engram_core.store.search_index.ranking import first_page, lexical_score, top
from engram_core.store.search_index.vectors import candidates, float32_error, semantic_keys, similarities

__all__ = ["SearchIndex"]


class SearchIndex:
    """All scopes' lexical and vector projections in memory. Not thread-safe by itself:
    ``DuckDBStore`` holds its publish lock around every change and every read."""

    def __init__(self, scopes: dict[tuple[str, str], ScopeIndex] | None = None,
                 scope_of: dict[str, tuple[str, str]] | None = None) -> None:
        """Empty, or holding the scopes ``IndexBuilder`` built and which scope holds each record."""
        self._scopes: dict[tuple[str, str], ScopeIndex] = {} if scopes is None else scopes
        self._scope_of: dict[str, tuple[str, str]] = {} if scope_of is None else scope_of

    def document_count(self) -> int:
        """Records indexed across all scopes (the metrics' index size)."""
        return sum(held.docs for held in self._scopes.values())

    def scope_documents(self, scope: Scope) -> int:
        """Records indexed in one scope."""
        held = self._scopes.get((scope.tenant, scope.workspace))
        return held.docs if held is not None else 0

    def replace_scope(self, scope: Scope, built: SearchIndex) -> None:
        """Hold ``built``'s index of the scope instead of this one's (a scope loaded on first use)."""
        self.drop_scope(scope)
        held = built._scopes.get((scope.tenant, scope.workspace))
        if held is not None:
            self._scopes[(scope.tenant, scope.workspace)] = held
            for record_id in held.local:
                self._scope_of[record_id] = (scope.tenant, scope.workspace)

    def drop_scope(self, scope: Scope) -> None:
        """Forget the scope's index (evicted, or about to be replaced)."""
        self.apply([ScopeProjectionsDropped(scope.tenant, scope.workspace)])

    def vector_models(self) -> set[str]:
        """The models whose vectors some scope holds (start-up: vectors of an older model)."""
        return {model for held in self._scopes.values() for model in held.vectors}

    # -- changes (applied by the store kernel after each commit) -------------------
    def apply(self, changes: Iterable[Change]) -> None:
        """Follow committed changes (``store/changes.py``), in the order they were made."""
        for change in changes:
            if isinstance(change, RecordIndexed):
                key = (change.row.tenant, change.row.workspace)
                held = self._scopes.get(key)
                if held is None:  # (not setdefault: a scope's arrays are made only for a new one)
                    held = self._scopes[key] = ScopeIndex()
                held.add(RecordMeta.of(change.row), change.postings)
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
                held = self._scopes.get((change.tenant, change.workspace))
                if held is not None:
                    held.remove(change.record_id)
                self._scope_of.pop(change.record_id, None)
            elif isinstance(change, VectorIndexed):
                held = self._scopes.get((change.tenant, change.workspace))
                if held is not None:
                    held.put_vector(change.record_id, change.model, change.vector)
            elif isinstance(change, ScopeProjectionsDropped):
                dropped = self._scopes.pop((change.tenant, change.workspace), None)
                for record_id in dropped.local if dropped else ():
                    self._scope_of.pop(record_id, None)
            else:
                raise ValueError(f"unknown committed change {change!r}")

    def state_cursor_of(self, scope: Scope, record_id: str) -> int | None:
        """The state cursor the index holds for a record (None: not indexed)."""
        held = self._scopes.get((scope.tenant, scope.workspace))
        doc = held.local.get(record_id) if held is not None else None
        return int(held.columns.changed[doc]) if held is not None and doc is not None else None

    def indexed_postings(self, scope: Scope, record_id: str) -> int | None:
        """How many postings the index holds for one record; None when it does not hold the record."""
        held = self._scopes.get((scope.tenant, scope.workspace))
        doc = held.local.get(record_id) if held is not None else None
        if held is None or doc is None:
            return None
        rows = held.terms_of.get(doc)
        return len(rows) if rows is not None else len(held.rows_of(doc))

    # -- reads ----------------------------------------------------------------------
    def rows(self, scope: Scope, record_ids: list[str]) -> dict[str, RecordRow]:
        """The committed rows the index holds for these records of the scope (not those whose
        row changed since it was indexed: their state or body is read from the database)."""
        held = self._scopes.get((scope.tenant, scope.workspace))
        if held is None:
            return {}
        found = {}
        for rid in record_ids:
            doc = held.local.get(rid)
            row = held.columns.rows[doc] if doc is not None else None
            if row is not None:
                found[rid] = row
        return found

    def stats(self, scope: Scope, terms: list[int]) -> LexicalStats:
        held = self._scopes.get((scope.tenant, scope.workspace))
        if held is None:
            return LexicalStats(docs=0, avg_len={}, df={})
        avg = {FIELDS[c]: held.field_len[c] / max(held.field_docs[c], 1)
               for c in range(len(FIELDS)) if held.field_docs[c] > 0}
        unique = sorted(set(terms))
        df = {t: n for t, n in zip(unique, held.dfs(unique), strict=True) if n > 0}
        return LexicalStats(docs=held.docs, avg_len=avg, df=df)

    def rank(self, scope: Scope, query: LexicalQuery) -> LexicalPage:
        """BM25F-style ranking (SPEC §11) of records eligible at ``query.now_ms``, with pinned
        statistics (``LexicalQuery`` says what each part of the query means).

        Scores are ``lexical_weight * bm25 / best_bm25 + (1 - lexical_weight) * recency``,
        rounded to 1e-9 so that the same inputs give the same order on every page; rows are
        ordered by score desc, valid_t desc, record_id asc, strictly after ``after`` when
        paging. Records accepted, or changed state, after ``max_accepted_cursor`` are not
        candidates. ``window`` replaces recency by closeness to it (``timeq.proximity``);
        ``neighbours`` make the neighbours of matches candidates too (``Columns.lend``).
        """
        stats, best_bm25, after, limit = query.stats, query.best_bm25, query.after, query.limit
        now_ms, window, neighbours, lexical_weight = query.now_ms, query.window, query.neighbours, query.lexical_weight
        held = self._scopes.get((scope.tenant, scope.workspace))
        # A term's weight in the query (1, or the thesaurus's for a related term) times its IDF.
        idf = [(t, stats.weights.get(t, 1.0) * math.log(1 + (stats.docs - n + 0.5) / (n + 0.5)))
               for t, n in sorted(stats.df.items()) if n > 0]
        weight = np.zeros(len(FIELDS))
        inv_avg = np.zeros(len(FIELDS))
        for name, w in query.weights.items():
            avg = stats.avg_len.get(name)
            if avg and name in FIELD_CODE:
                weight[FIELD_CODE[name]], inv_avg[FIELD_CODE[name]] = w, 1.0 / avg
        if held is None or not idf or not weight.any():
            return LexicalPage(0, [], best_bm25 or 0.0)
        cols = held.columns
        terms = [layers for term, term_idf in idf
                 if (layers := held.contribution(term, weight, inv_avg, query.k1, query.b, term_idf)) is not None]
        if not terms:
            return LexicalPage(0, [], best_bm25 or 0.0)
        # Each term's contributions added in place, in term order (``add_layers``): a document's
        # postings add up in the same order, to the same sums, as ``np.bincount`` over all terms'
        # postings end to end, which first copied every posting twice.
        bm25 = np.zeros(cols.n)
        for layers in terms:
            add_layers(bm25, layers)
        eligible = cols.eligible(now_ms=now_ms, max_cursor=query.max_accepted_cursor)
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
                recency = np.exp2(np.maximum(now_ms - vt, 0) / -float(query.half_life_ms))  # 0.5 ** age; np.power is 5x slower
            else:  # the query named a time (services/timeq.py): closeness to its window instead of recency
                start, end = window
                scale = float(max(end - start, 7 * 86_400_000))
                recency = np.exp2((np.maximum(start - vt, 0) + np.maximum(vt - end, 0)) / -scale)
            return lexical_score(raw[at], best, recency, lexical_weight), vt

        if after is None:
            found = first_page(raw, best, limit, lexical_weight, scored)
            if found is not None:
                at, score, vt = found
                return LexicalPage(total, top(hit[at], score, vt, cols.record_ids, limit), best, own_best)
        score, vt = scored(slice(None))
        if after is not None:
            a_score, a_vt, a_rid = after
            later = (score < a_score) | ((score == a_score) & (vt < a_vt))
            tie = np.flatnonzero((score == a_score) & (vt == a_vt))
            for i in tie:
                later[i] = cols.record_ids[hit[i]] > a_rid
            hit, score, vt = hit[later], score[later], vt[later]
        rows_out = top(hit, score, vt, cols.record_ids, limit)
        return LexicalPage(total, rows_out, best, own_best)


    def nearest(self, scope: Scope, model: str, vector: list[float], *, now_ms: int,
                max_accepted_cursor: int, min_similarity: float, limit: int,
                neighbours: tuple[int, float, int, int] | None = None) -> list[tuple[str, float, int]]:
        """Eligible records by cosine similarity (vectors are unit length), at least
        ``min_similarity``, best first, ties by record_id: (record_id, similarity, valid_t).
        ``neighbours`` (span, weight, within_ms, session_ms): records are ordered and thresholded by their
        similarity (at least 0) plus ``weight`` times their best eligible neighbour's
        (``Columns.lend``); rows still carry their own similarity."""
        held = self._scopes.get((scope.tenant, scope.workspace))
        if held is None or model not in held.vectors or limit <= 0:
            return []
        matrix, present = held.vectors[model]
        cols = held.columns
        n = min(cols.n, len(matrix))
        query = np.asarray(vector, dtype=np.float64)
        ok = present[:n] & cols.eligible(now_ms=now_ms, max_cursor=max_accepted_cursor)[:n]
        # Two passes: approximate similarities of every row, then the float64 ones
        # (``similarities``) of the rows within the first pass's error bound of the page. The
        # answer is the float64 answer: a row the first pass leaves out cannot be on the page
        # (``candidates``). The first pass reads the int8 sketch at scale (``vector_sketch``:
        # ~1 ms at 100k records), else the float32 rows (BLAS's product: ~5 ms at 100k, against
        # ~30 ms for converting the rows to float64 first).
        sketch = held.sketch(model, n)
        if sketch is not None:
            approx, err = sketch.similarities(query, n)
        else:
            approx = (matrix[:n] @ query.astype(np.float32)).astype(np.float64)
            err = float32_error(matrix.shape[1], held.vector_norm(model), float(np.linalg.norm(query)))
        if neighbours is None:
            slack = err + 1e-9  # the float64 similarities are rounded to 1e-9, the first pass's are not
        else:  # key = own + weight * a neighbour's: each off by at most err, both rounded
            slack = (1 + abs(neighbours[1])) * (err + 1e-9) + 1e-9
        cand = candidates(semantic_keys(cols, ok, approx, n, neighbours), ok, min_similarity, limit, slack)
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
        sims = np.round(similarities(matrix[exact_rows], query), 9)  # by place in exact_rows
        at = np.searchsorted(exact_rows, cand)
        if neighbours is None:
            key = sims[at]
        else:  # as semantic_keys over every row, but only where a candidate is
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
