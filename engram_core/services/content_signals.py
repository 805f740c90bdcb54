"""The content facts the core gives the capture and admission policies (issue 59).

``capture_facts``: what is known of a payload at capture (its primary component's kind, the
instruction signals, the citations' provenance). ``admission_facts``: the same, recomputed from
the sealed payload (a candidate captured before these facts existed gets them too), and the
current records of the scope most like it (``similar``), found with the search index the core
already holds: a BM25 ranking with the candidate's own terms as the query and, when the
semantic channel is served, the nearest vectors; then the few best are opened and compared
text to text in memory (``content_similarity``). Bounded: at most ``SIMILAR_LIMIT`` records of
each channel are opened, whatever the scope's size.

Nothing here is stored: the facts go to the policy (and from there, as codes, counts, scores,
schemes, hosts and record ids, to the decision log); the texts compared never leave memory.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cryptography.exceptions import InvalidTag

from engram_core.content import instructions
from engram_core.content.provenance import provenance
from engram_core.contract.scope import Scope
from engram_core.contract.validation import parse_instant
from engram_core.crypto.sealing import unseal
from engram_core.services import content_similarity as similarity
from engram_core.services.ranking import Profile
from engram_core.services.reading import in_effect
from engram_core.store.port import LexicalQuery, Tx

SIMILAR_LIMIT = 3  # records opened per channel (lexical, semantic)
QUERY_TERMS = 128  # the candidate's distinct terms asked of the index, at most
RARE_TERMS = 12  # of which the rarest in the scope rank the candidates
MIN_LEXICAL = 0.2  # below this a record is not reported as similar (unless semantically)
MIN_SEMANTIC = 0.5
ALL_COMMITTED = 1 << 62  # a cursor beyond any: the index's committed records, however recent


def _components(effective: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["kind"], c["text"]) for c in effective["components"]]


def capture_facts(payload: dict[str, Any]) -> dict[str, Any]:
    """The content facts of a payload known at capture."""
    primary: dict[str, Any] = next(
        (c for c in payload["components"] if c["component_id"] == payload["primary_component_id"]), {})
    return {"primary_kind": str(primary.get("kind", "")), "instructions": instructions.scan(_components(payload)),
            "provenance": provenance(payload)}


class ContentSignals:
    """The similar-records search and the admission facts, for one core."""

    def __init__(self, core: Any, lexical_profile: Profile) -> None:
        self.core = core
        self.profile = lexical_profile

    def admission_facts(self, tx: Tx, scope: Scope, effective: dict[str, Any], *, now: int,
                        vector: Callable[[], list[float] | None]) -> dict[str, Any]:
        """The candidate's content facts at admission. ``vector``: the candidate's record vector
        when the semantic channel is served (None otherwise)."""
        vt = effective["valid_time"]
        expires = effective.get("retention", {}).get("expires_at")
        facts = capture_facts(effective)
        facts["valid_time"] = {k: vt[k] for k in ("t", "t_end") if k in vt}
        facts["eligible_now"] = in_effect(vt["t"], vt.get("t_end"), parse_instant(expires) if expires else None, now)
        mine = similarity.profile(effective)
        facts["text_terms"] = len(mine.terms)
        facts["similar"] = self.similar(tx, scope, mine, now=now, vector=vector)
        return facts

    def similar(self, tx: Tx, scope: Scope, mine: similarity.TextProfile, *, now: int,
                vector: Callable[[], list[float] | None]) -> list[dict[str, Any]]:
        # The profile holds the components' analyzed terms already (the text is analyzed once).
        terms = sorted({self.core.hasher.term(t) for t in mine.terms})[:QUERY_TERMS]
        cursor = ALL_COMMITTED  # every record the index holds (no read of the scope's cursor)
        found: dict[str, float | None] = {}
        if terms:
            stats = tx.lexical_stats(scope, terms)
            # Ranked by its rarest terms only: a restatement shares them, and the postings of
            # common terms (most of a scope's documents) are what a long query would cost.
            rare = sorted((n, t) for t, n in stats.df.items() if n > 0)[:RARE_TERMS]
            stats = dataclasses.replace(stats, df={t: n for n, t in rare})
            page = tx.rank_lexical(scope, LexicalQuery(
                stats, self.profile.weights, k1=self.profile.k1, b=self.profile.b, now_ms=now,
                half_life_ms=self.profile.half_life_ms, lexical_weight=1.0, max_accepted_cursor=cursor,
                best_bm25=None, after=None, limit=SIMILAR_LIMIT))
            for hit in page.rows[:SIMILAR_LIMIT]:
                found.setdefault(hit[0], None)
        embedder = getattr(self.core, "embedder", None)
        if embedder is not None and (query := vector()) is not None:
            for rid, sim, _ in tx.rank_vectors(scope, embedder.model_id, query, now_ms=now,
                                               max_accepted_cursor=cursor, min_similarity=MIN_SEMANTIC,
                                               limit=SIMILAR_LIMIT):
                found[rid] = round(float(sim), 3)
        if not found:
            return []
        rows = tx.records(scope, sorted(found))
        keys = self.core.data_keys(list(rows.values()))
        out = []
        for rid, row in rows.items():
            key = keys.get(rid)
            if row.state != "accepted_current" or key is None or row.sealed_body is None:
                continue  # forgotten or superseded meanwhile: not a current record to compare with
            try:
                other = json.loads(unseal(key[1], row.sealed_body, kind="record", owner=rid))
            except (InvalidTag, ValueError):
                continue  # its key went with a forget committed meanwhile: nothing to compare
            facts = similarity.compare(mine, similarity.profile(other))
            semantic = found[rid]
            if semantic is not None:
                facts["semantic"] = semantic
            if facts["lexical"] >= MIN_LEXICAL or facts["same_text"] or semantic is not None:
                out.append({"record_id": rid, **facts})
        out.sort(key=lambda s: (-max(s["lexical"], s.get("semantic", 0.0)), s["record_id"]))
        return out[:SIMILAR_LIMIT]


def future_vector(embedding: Future[list[float]] | None) -> Callable[[], list[float] | None]:
    """The record vector an admission computes anyway, as the similar-records search asks it."""
    return lambda: embedding.result() if embedding is not None else None
