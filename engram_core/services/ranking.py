"""Ranking profiles (SPEC §11): parameters pinned in a config digest."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from engram_core.contract.canonical import digest
from engram_core.services.lexical import ANALYZER_ID
from engram_core.services.timeq import PARSER_ID

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Fusion:
    """How ``semantic_v2`` fuses the lexical and vector lists (reciprocal rank; SPEC §11's v1 had k = 60).

    Each list contributes ``weight / (k + rank)``. Only the top ``depth`` of each list
    take part, and a vector hit counts only at cosine similarity ``min_similarity`` or
    more: a dense model always returns *something*, and unrelated neighbours must not
    crowd out lexical hits. k 1 (v1: 60) lets each list's own top hits lead, nearly an
    interleaving: with k 60 a record ranked 30th in both lists outranked the first of
    one list, and on conversation, where each list finds different answers, fusion lost
    to lexical alone. Chosen on both retrieval harnesses (docs/retrieval-quality.md).
    """

    k: int = 1
    lexical_weight: float = 1.0
    vector_weight: float = 1.0
    depth: int = 100
    min_similarity: float = 0.2

    def config(self) -> dict[str, Any]:
        return {"fusion": "weighted_rrf", "k": self.k, "lexical_list_weight": str(self.lexical_weight),
                "vector_list_weight": str(self.vector_weight), "depth": self.depth,
                "min_similarity": str(self.min_similarity)}


@dataclass(frozen=True)
class Neighbours:
    """Records that belong together lend each other part of their score.

    A conversation captured one turn per memory puts a question's words and its answer in
    different turns ("what breed is she?" ... "a beagle"; "Biscuit" in one turn, "she had
    surgery" in the next). Each eligible record's BM25 gains ``weight`` times the best BM25 among
    the ``span`` records admitted just before and after it in its scope that are linked to it;
    the neighbours of a match become candidates. The semantic profile lends the same way in its
    vector list (cosine similarity, at least 0).

    Linked (v3): valid times within ``within_ms`` of each other (0: the same), as a transcript
    captured after the fact dates a session's turns. Linked too (v4, ``session_window_ms`` > 0):
    captured in the same host-bound session (principal, agent and session id) with capture
    instants and valid times each within ``session_window_ms`` of the other's, as an agent
    capturing a conversation as it goes dates each turn with its own instant. Notes dated days
    apart never lend. Chosen on both retrieval harnesses and both capture modes
    (docs/retrieval-quality.md): conversations recall@10 lexical 0.530 -> 0.642 (v3, dated by
    session), live-captured 0.530 -> 0.644 (v4); synthetic unchanged.
    """

    span: int = 3
    weight: float = 0.5
    # The same valid time: a transcript imported after the fact dates every turn of a session
    # with the session's date.
    within_ms: int = 0
    # 0: no session links (v3). v4: 2 hours, measured flat from 1 to 3 hours on the live-captured
    # conversations (turns minutes apart, pauses up to an hour, sessions days apart) and costing
    # the synthetic notes nothing up to 3 hours (a day links notes dated a day apart).
    session_window_ms: int = 0

    def args(self) -> tuple[int, float, int, int]:
        return (self.span, self.weight, self.within_ms, self.session_window_ms)

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"order": "admission", "span": self.span, "weight": str(self.weight),
                               "within_ms": self.within_ms, "lends": "best eligible neighbour's bm25"}
        if self.session_window_ms:
            cfg["session"] = {"window_ms": self.session_window_ms,
                              "same": "principal, agent_id and session of the capture",
                              "within_window": "capture instants and valid times"}
        return cfg


@dataclass(frozen=True)
class Expansion:
    """Query words expanded with their WordNet relatives (``services/thesaurus.py``, from
    ``offline_lexical_v5``): each query word's first ``senses`` senses in every part of speech,
    their synonyms and the ``relations`` of those senses, as terms of weight ``weight`` (a query's
    own terms weigh 1). A related term counts only where the scope has it and the query does not.
    Chosen on both retrieval harnesses and both capture modes (docs/retrieval-quality.md,
    "Version 6"): weights 0.2-0.4 and 2-5 senses measured alike; the hypernyms are what the
    synthetic notes gain from, the hyponyms what the conversations gain from."""

    weight: float = 0.3
    senses: int = 3
    relations: tuple[str, ...] = ("hyponyms", "hypernyms")
    # A related term in more than this share of the scope's indexed records is left out: it says
    # nothing about which record answers (an IDF below ln 2, times the weight), and its posting
    # list is most of the scope. 0.3 and 0.5 measured the same as none on both harnesses.
    max_share: float = 0.35

    def config(self) -> dict[str, Any]:
        from engram_core.services.thesaurus import SOURCE

        return {"source": SOURCE, "senses": self.senses, "relations": ["synonyms", *self.relations],
                "weight": str(self.weight), "max_share": str(self.max_share),
                "counts": "terms the scope has in at most max_share of its records and the query does not have"}


@dataclass(frozen=True)
class Profile:
    name: str
    version: str
    k1: float = 1.2
    b: float = 0.5
    weights: dict[str, float] = field(
        default_factory=lambda: {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}
    )
    half_life_ms: int = 30 * DAY_MS
    lexical_weight: float = 0.85
    # A query that names a time ("last spring", "in March") ranks by closeness to that window
    # instead of recency, with this weight (services/timeq.py; docs/search.md).
    time_weight: float = 0.5
    neighbours: Neighbours | None = None
    model_id: str | None = None
    fusion: Fusion | None = None
    needs_network: bool = False
    # From semantic_v5: the query's embedding leaves out the words found in more than this share
    # of the scope's indexed records (0: none left out). See ``embedding_text``.
    embed_common_share: float = 0.0
    # From offline_lexical_v5 and semantic_v6: the query's words expanded by the thesaurus.
    expansion: Expansion | None = None

    @property
    def semantic(self) -> bool:
        return self.model_id is not None

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "profile": self.name, "version": self.version, "analyzer": ANALYZER_ID,
            "bm25": {"k1": str(self.k1), "b": str(self.b)},
            "field_weights": {k: str(v) for k, v in sorted(self.weights.items())},
            "recency": {"half_life_ms": self.half_life_ms, "weight": str(round(1 - self.lexical_weight, 4))},
            "time_in_query": {"parser": PARSER_ID, "weight": str(self.time_weight),
                              "outside_window": "halves per window length, at least 7 days"},
            # Reported scores are multiplied by the query's relevance (reading.query_relevance).
            "score": "normalized-times-query-relevance",
        }
        if self.neighbours is not None:
            cfg["neighbours"] = self.neighbours.config()
        if self.expansion is not None:
            cfg["query_expansion"] = self.expansion.config()
        if self.model_id is not None and self.fusion is not None:
            cfg["semantic"] = {"model_id": self.model_id, **self.fusion.config()}
            if self.embed_common_share:
                cfg["semantic"]["query_embedding"] = {
                    "drops": "words whose term is in more than this share of the scope's indexed records",
                    "share": str(self.embed_common_share), "all_dropped": "the whole query"}
        return cfg

    def config_digest(self) -> str:
        # Frozen: computed once per profile, not twice per search.
        cached = self.__dict__.get("_config_digest")
        if cached is None:
            cached = digest("profile-config", self.config())
            object.__setattr__(self, "_config_digest", cached)
        return cached


# Version 2 (SPEC §11's v1 with a new analyzer and b): English stop words and Snowball stems
# (lexical.ANALYZER_ID), question words dropped from queries, b 0.5 instead of 0.75 (single
# conversation turns are short: full length normalization let a name match in "Caroline: ok!"
# outrank the turn that answers). Chosen on both retrieval harnesses (docs/retrieval-quality.md).
OFFLINE_LEXICAL_V2 = Profile(name="offline_lexical_v2", version="2")
DEFAULT_FUSION = Fusion()

# Version 3: version 2 with neighbours (records admitted one after another at the
# same time lend each other part of their score; ``Neighbours``). Same analyzer, so the postings
# stay; a new config digest, so receipts and cursors of the two versions never mix.
OFFLINE_LEXICAL_V3 = replace(OFFLINE_LEXICAL_V2, name="offline_lexical_v3", version="3", neighbours=Neighbours())


# Version 4 (the default): version 3 whose neighbours also link records captured live, in one
# host-bound session close together in time (``Neighbours.session_window_ms``). Same analyzer.
SESSION_WINDOW_MS = 2 * 3_600_000
OFFLINE_LEXICAL_V4 = replace(OFFLINE_LEXICAL_V3, name="offline_lexical_v4", version="4",
                             neighbours=Neighbours(session_window_ms=SESSION_WINDOW_MS))


def semantic_v2(model_id: str, *, needs_network: bool = False, fusion: Fusion = DEFAULT_FUSION) -> Profile:
    """The ``semantic_v2`` profile for one embedding model (its id is part of the config digest)."""
    return replace(OFFLINE_LEXICAL_V2, name="semantic_v2", model_id=model_id, fusion=fusion,
                   needs_network=needs_network)


def semantic_v3(model_id: str, *, needs_network: bool = False, fusion: Fusion = DEFAULT_FUSION) -> Profile:
    """The ``semantic_v3`` profile: ``semantic_v2`` fusing the v3 lexical list."""
    return replace(OFFLINE_LEXICAL_V3, name="semantic_v3", model_id=model_id, fusion=fusion,
                   needs_network=needs_network)


def semantic_v4(model_id: str, *, needs_network: bool = False, fusion: Fusion = DEFAULT_FUSION) -> Profile:
    """The ``semantic_v4`` profile: ``semantic_v3`` with v4's neighbours in both lists."""
    return replace(OFFLINE_LEXICAL_V4, name="semantic_v4", model_id=model_id, fusion=fusion,
                   needs_network=needs_network)


# Version 5 of the semantic profile (the default): semantic_v4 whose query embedding leaves out
# the words that most of the scope's records contain. In a conversation between two people each
# name is in half the turns ("Caroline: ..."), and in a project's workspace its name is in most
# notes: such a word says nothing about which record answers, but it dominates the embedding of
# a short question, so the vector list ranked every turn of that speaker alike. BM25 already
# gives such words a low IDF, so the lexical list is unchanged (offline_lexical_v4); leaving them
# out of the lexical query lost (docs/retrieval-quality.md, "Version 5"). 0.35: conversations
# gain the same from 0.1 to 0.4 (names are in about half the turns), the synthetic notes lose
# below 0.3 (their services' names are in a fifth of a workspace).
EMBED_COMMON_SHARE = 0.35


def semantic_v5(model_id: str, *, needs_network: bool = False, fusion: Fusion = DEFAULT_FUSION) -> Profile:
    """The ``semantic_v5`` profile (the default): ``semantic_v4`` whose query embedding leaves out
    the scope's most common words (``embedding_text``)."""
    return replace(semantic_v4(model_id, needs_network=needs_network, fusion=fusion), name="semantic_v5",
                   version="5", embed_common_share=EMBED_COMMON_SHARE)


# Version 5 of the lexical profile and 6 of the semantic one (the defaults when the thesaurus's
# data is installed): version 4's lists whose query words are expanded with their WordNet
# relatives (``Expansion``). Same analyzer, so the postings stay.
OFFLINE_LEXICAL_V5 = replace(OFFLINE_LEXICAL_V4, name="offline_lexical_v5", version="5", expansion=Expansion())


def semantic_v6(model_id: str, *, needs_network: bool = False, fusion: Fusion = DEFAULT_FUSION) -> Profile:
    """The ``semantic_v6`` profile: ``semantic_v5`` fusing the v5 lexical list."""
    return replace(semantic_v5(model_id, needs_network=needs_network, fusion=fusion), name="semantic_v6",
                   version="6", expansion=Expansion())
