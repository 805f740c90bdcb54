"""Analyzer and keyed term hashing for the lexical projection (SPEC §11).

Postings store keyed 64-bit hashes of terms, never the terms: the projection
holds no plaintext even of accepted records, and forgetting a record leaves no
readable word behind in freed pages. The key lives outside the database.

The analyzer (``ANALYZER_ID``, pinned in every lexical profile's config digest) turns text into
terms: NFKC, case folding, Unicode word tokens, English stop words dropped, Snowball English
stems (PyStemmer). A query also drops the words that frame a question ("do you remember", "tell
me"). Stored postings were made by the analyzer of their time: the store records its id
(``store_meta``) and the core re-derives every posting when it changes
(``services/maintenance/projections.reanalyze_lexical``), so a search never mixes two analyzers.
"""

from __future__ import annotations

import hashlib
import re
import threading
import unicodedata
from collections import Counter
from typing import Any

ANALYZER_ID = "nfkc-casefold-unicode-words-stop-en-v2-snowball-english-pystemmer-3.1.0"
_WORD = re.compile(r"\w+", re.UNICODE)
_MAX_TOKEN = 64

# English function words (the NLTK list, split the way the tokenizer splits "didn't"): they
# are in nearly every turn of a conversation, so as evidence they only add noise ("is there
# anything about kubernetes" matched a Kafka record on "about").
STOP_WORDS = frozenset("""
a about above after again against ain all am an and any are aren as at be because been before being
below between both but by can couldn d did didn do does doesn doing don down during each few for from
further had hadn has hasn have haven having he her here hers herself him himself his how i if in into
is isn it its itself just ll m ma me mightn more most mustn my myself needn no nor not now o of off on
once only or other our ours ourselves out over own re s same shan she should shouldn so some such t
than that the their theirs them themselves then there these they this those through to too under
until up ve very was wasn we were weren what when where which while who whom why will with won
wouldn y you your yours yourself yourselves
""".split())

# Words that frame a question rather than say what it is about ("do you remember what she
# said about ..."): dropped from queries only, since in a memory they can be content.
QUERY_WORDS = frozenset("""
anything something everything anyone someone remember recall recalled mention mentioned tell told
know say said talk talked discuss discussed ever also would could might must shall may us let
please
""".split())


_QUERY_STOP = STOP_WORDS | QUERY_WORDS


def tokenize(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [t for t in _WORD.findall(folded) if len(t) <= _MAX_TOKEN]


_stemmers = threading.local()


def _stem(words: list[str]) -> list[str]:
    # PyStemmer's Stemmer objects are not thread-safe: one per thread (gRPC serves on a pool).
    stemmer = getattr(_stemmers, "english", None)
    if stemmer is None:
        import Stemmer

        stemmer = _stemmers.english = Stemmer.Stemmer("english")
    return stemmer.stemWords(words)


def analyze(text: str) -> list[str]:
    """The terms of a memory's text: tokens without stop words, stemmed."""
    return _stem([t for t in tokenize(text) if t not in STOP_WORDS])


def query_terms(text: str) -> list[str]:
    """The terms of a query: as ``analyze``, and without the words that frame a question."""
    return _stem([t for t in tokenize(text) if t not in _QUERY_STOP])


def query_words(text: str) -> list[tuple[str, str | None]]:
    """Each word of a query with its term (``None`` for a stop or question word, which has none)."""
    words = tokenize(text)
    content = [w for w in words if w not in _QUERY_STOP]
    stems = dict(zip(content, _stem(content), strict=True))
    return [(w, stems.get(w)) for w in words]


class TermHasher:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def term(self, token: str) -> int:
        h = hashlib.blake2b(token.encode(), key=self._key, digest_size=8).digest()
        return int.from_bytes(h, "big", signed=True)

    def terms(self, text: str) -> list[int]:
        """Hashed terms of a memory's text (what postings hold)."""
        return [self.term(t) for t in analyze(text)]

    def query_terms(self, text: str) -> list[int]:
        """Hashed terms of a search query."""
        return [self.term(t) for t in query_terms(text)]

    def counts(self, text: str) -> Counter[int]:
        return Counter(self.terms(text))


def record_fields(payload: dict[str, Any], hasher: TermHasher) -> dict[str, Counter[int]]:
    """Per-field term counts of a record payload: primary, decision, evidence, context, citations."""
    fields: dict[str, Counter[int]] = {k: Counter() for k in ("primary", "decision", "evidence", "context", "citations")}
    primary = payload["primary_component_id"]
    for comp in payload["components"]:
        name = "primary" if comp["component_id"] == primary else comp["kind"]
        fields[name].update(hasher.counts(comp["text"]))
    for citation in payload["citations"]:
        fields["citations"].update(hasher.counts(citation["source_ref"]))
    return {k: v for k, v in fields.items() if v}
