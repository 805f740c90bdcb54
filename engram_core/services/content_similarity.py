"""How a candidate's text compares with a current record's: a restatement, or a different decision.

A plain lexical threshold cannot tell the two apart: "use Redis for the session cache" and "use
Memcached for the session cache" share almost every word and say different things, while a
paraphrase may share half its words and say the same thing. So besides the lexical similarity
the comparison reports the evidence of a *different* decision:

* ``distinct_added`` / ``distinct_missing`` / ``distinct_shared``: distinctive tokens (names and
  acronyms written with a capital inside a sentence, tokens with digits, identifiers such as
  ``--flag``, ``a.b``, ``snake_case``, number words, weekdays and months) of the candidate that
  the record's text lacks, of the record that the candidate lacks, and that both have. A
  paraphrase keeps its names and numbers (it may drop or add one); a near miss swaps one: both
  an added and a missing one.
* ``polarity_differs``: one text negates or flips what the other says (not/never/no, enable vs
  disable, allow vs deny, sync vs async ...), or the candidate names something new and says it
  changed ("DuckDB instead of SQLite") where the record says no change.
* ``slot_edit``: the two texts are the same words in the same order except one short span
  replaced by another, or a few words replaced in place (a template filled in with other values),
  the words replaced being content words: a different value, not a restatement.
* ``subject_changed``: each text names a thing the other does not (a word the dictionary —
  WordNet, as the lexical channel's thesaurus reads it — does not know, or knows only as a noun;
  synonyms and words of one stem aside): the same sentence about another service, person or
  product. Paraphrases change verbs and word order, not what they name.
* ``same_text``: the same component texts (case, spacing and Unicode forms aside): a
  word-for-word re-capture made at another time.

Everything here works on the texts in memory and returns numbers and booleans only.
"""

from __future__ import annotations

import functools
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any

from engram_core.services import thesaurus
from engram_core.services.lexical import QUERY_WORDS, STOP_WORDS, analyze, tokenize

_NUMBER_WORDS = frozenset("""
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen
eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion
first second third fourth fifth sixth seventh eighth ninth tenth half quarter double triple single once twice
monday tuesday wednesday thursday friday saturday sunday january february march april june july august
september october november december daily weekly monthly yearly hourly nightly quarterly annually
""".split())
# Words that flip a statement, after the sense each carries: a text with one and its
# counterpart without is a different decision.
_POLARITY_SENSES = """
neg: not no never nor without cannot don doesn didn isn aren won shouldn mustn
on: enable enabled enables on true yes
off: disable disabled disables off false
allow: allow allowed allows permit permitted accept accepted
deny: deny denied denies block blocked forbid forbidden prohibit prohibited reject rejected
sync: sync synchronous
async: async asynchronous
up: increase increased raise raised upper higher more above
down: decrease decreased lower lowered reduce reduced less fewer below
add: add added include included
remove: remove removed drop dropped exclude excluded delete deleted
before: before
after: after
min: min minimum
max: max maximum
public: public
private: private
required: required mandatory
optional: optional
keep: keep kept
start: start
stop: stop stopped
open: open
close: close closed
"""
_POLARITY = {word: sense for sense, words in (line.split(":") for line in _POLARITY_SENSES.strip().splitlines())
             for word in words.split()}
_OPPOSITES = (("on", "off"), ("allow", "deny"), ("sync", "async"), ("up", "down"), ("add", "remove"),
              ("before", "after"), ("min", "max"), ("public", "private"), ("required", "optional"),
              ("start", "stop"), ("open", "close"), ("keep", "remove"))
_SENTENCE_END = frozenset(".!?:;\n")
# Function words the stop list does not have, which WordNet does not know as content words.
_FUNCTION_WORDS = frozenset("""
via per etc vs versus upon within without across toward towards onto amongst whilst thus hence
also still now then yet already even else instead either neither whether though although unless
""".split())
_SLOT_MAX = 3  # the longest span (in words) a template edit replaces


@dataclass(frozen=True)
class TextProfile:
    """What the comparison needs of one memory's text (kept in memory for one admission)."""

    terms: frozenset[str]  # analyzed terms (stop words out, stemmed)
    distinct: frozenset[str]
    surface: frozenset[str]  # every token as ``distinct`` reads them (a name at a sentence's start too)
    polarity: tuple[tuple[str, int], ...]  # polarity classes with their counts
    words: tuple[str, ...]  # case-folded tokens, in order
    normalized: tuple[str, ...]  # each component's text, NFKC, case-folded, spacing collapsed (sorted)
    primary_kind: str
    family_refs: frozenset[str]


_EDGE = "\"'()[]{}<>,;!?*`\u201c\u201d\u2018\u2019"


def _tokens(text: str) -> list[tuple[str, bool]]:
    """The text's tokens (split at spaces, surrounding punctuation off), each with whether it
    starts a sentence. String methods only: one pass, no pattern."""
    out: list[tuple[str, bool]] = []
    for line in text.splitlines():
        start = True
        for chunk in line.split():
            raw = chunk.strip(_EDGE).strip(".:/-")
            if raw[-2:] in ("'s", "\u2019s"):  # a possessive: the name itself
                raw = raw[:-2]
            if raw:
                out.append((raw, start))
            start = chunk.rstrip(_EDGE)[-1:] in _SENTENCE_END if chunk.rstrip(_EDGE) else start
    return out


def _shaped(raw: str) -> bool:
    """A token shaped like a number, a version, an identifier, a path, a host or a flag."""
    if raw.isalpha():
        return False
    if any(c.isdigit() for c in raw) or "_" in raw or raw.startswith("-"):
        return True
    return any(c in "./:-" and 0 < i < len(raw) - 1 and raw[i - 1].isalpha() for i, c in enumerate(raw))


def _surface_and_distinct(text: str) -> tuple[set[str], set[str]]:
    surface: set[str] = set()
    distinct: set[str] = set()
    for raw, sentence_start in _tokens(text):
        folded = unicodedata.normalize("NFKC", raw).casefold()
        surface.add(folded)
        if (_shaped(raw) or folded in _NUMBER_WORDS
                or (raw[0].isupper() and not sentence_start and raw != "I")
                or (len(raw) > 1 and raw.isupper() and raw.isalpha())
                or any(c.isupper() for c in raw[1:])):
            distinct.add(folded)
    return surface, distinct


def profile(effective: dict[str, Any]) -> TextProfile:
    """A payload's text profile: its components' texts together."""
    texts = [c["text"] for c in effective["components"]]
    joined = "\n".join(texts)
    words = tuple(tokenize(joined))
    surface, distinct = _surface_and_distinct(joined)
    primary: dict[str, Any] = next(
        (c for c in effective["components"] if c["component_id"] == effective.get("primary_component_id")), {})
    return TextProfile(
        terms=frozenset(analyze(joined)),
        distinct=frozenset(distinct),
        surface=frozenset(surface),
        polarity=tuple(sorted(Counter(_POLARITY[w] for w in words if w in _POLARITY).items())),
        words=words,
        normalized=tuple(sorted(" ".join(tokenize(t)) for t in texts)),
        primary_kind=str(primary.get("kind", "")),
        family_refs=frozenset(effective.get("reconciliation", {}).get("family_refs", [])),
    )


def _wordnet() -> thesaurus.Thesaurus | None:
    try:
        return thesaurus.load(3, ("hyponyms", "hypernyms"))  # the lexical channel's own (``Expansion``)
    except (thesaurus.ThesaurusUnavailable, OSError):
        return None


@functools.lru_cache(maxsize=65_536)
def _names_a_thing(word: str) -> bool:
    """A word that names a thing rather than saying something about it: one the dictionary
    (WordNet, as the thesaurus reads it) does not know (a name, a product, an identifier), or
    knows only as a noun. Without the data no word counts (no change is judged by it)."""
    words = _wordnet()
    if words is None:
        return False
    if not any(words.lemmas(word, pos) for pos in "nvar"):
        return True
    return bool(words.lemmas(word, "n")) and not words.lemmas(word, "v")


@functools.lru_cache(maxsize=65_536)
def _related(a: str, b: str) -> bool:
    """Synonyms, or one the other's broader or narrower sense ("client" and "customer")."""
    words = _wordnet()
    return words is not None and (b in words.related(a) or a in words.related(b))


@functools.lru_cache(maxsize=65_536)
def _term_of(word: str) -> str:
    terms = analyze(word)
    return terms[0] if terms else ""


def _term_words(p: TextProfile, terms: frozenset[str]) -> dict[str, str]:
    """A word of ``p`` for each of ``terms`` (its first occurrence)."""
    out: dict[str, str] = {}
    for w in dict.fromkeys(p.words):
        if w.isalpha() and w not in STOP_WORDS and w not in QUERY_WORDS and w not in _FUNCTION_WORDS:
            t = _term_of(w)
            if t in terms and t not in out:
                out[t] = w
    return out


def _content(words: tuple[str, ...]) -> bool:
    return any(w not in STOP_WORDS and w not in QUERY_WORDS and w not in _FUNCTION_WORDS for w in words)


def _slot_edit(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Same words in the same order but one short span replaced by a different one, or (texts of
    as many words) a few words replaced in place, where the words replaced say something (not
    "a" for "the"): a template filled in with other values, not a restatement."""
    n = min(len(a), len(b))
    prefix = 0
    while prefix < n and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < n - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    gap_a, gap_b = len(a) - prefix - suffix, len(b) - prefix - suffix
    if 0 < gap_a <= _SLOT_MAX and 0 < gap_b <= _SLOT_MAX:
        return _content(a[prefix:len(a) - suffix]) or _content(b[prefix:len(b) - suffix])
    if len(a) != len(b):
        return False
    differ = [i for i in range(len(a)) if a[i] != b[i]]
    return 0 < len(differ) <= max(2, len(a) // 5) and _content(tuple(a[i] for i in differ) + tuple(b[i] for i in differ))


def _subject_changed(a: TextProfile, b: TextProfile) -> bool:
    """The texts name different things: after the words each has that the other lacks are paired
    off where they say the same in other words (one stem, "data" and "database"; synonyms or a
    broader sense, "client" and "customer"), both still name a thing the other does not, or one
    does and the two differ in as many words, two or three ("feature store" for "warehouse
    loader"). A paraphrase changes verbs and order, not what is named."""
    only_a = _term_words(a, a.terms - b.terms)
    only_b = _term_words(b, b.terms - a.terms)
    for ta, wa in list(only_a.items()):
        for tb, wb in list(only_b.items()):
            if tb in only_b and (ta[:4] == tb[:4] or _related(wa, wb)):
                del only_a[ta], only_b[tb]
                break
    named_a = any(_names_a_thing(w) for w in only_a.values())
    named_b = any(_names_a_thing(w) for w in only_b.values())
    if named_a and named_b:
        return True
    return (named_a or named_b) and 2 <= len(only_a) == len(only_b) <= 3


def _flipped(a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...]) -> bool:
    """One negates and the other does not, or one says a word more often whose opposite the other
    says more often (enable vs disable, sync vs async)."""
    ca, cb = Counter(dict(a)), Counter(dict(b))
    if (ca["neg"] > 0) != (cb["neg"] > 0):
        return True
    more_a, more_b = ca - cb, cb - ca
    return any((more_a[x] and more_b[y]) or (more_a[y] and more_b[x]) for x, y in _OPPOSITES)


_CHANGE_WORDS = frozenset("""
instead replaced replaces replacing switched switching migrated migrating moved deprecated retired
anymore superseded supersedes
""".split())


def _updates(cand: TextProfile, other: TextProfile) -> bool:
    """The candidate names something new and says it changed ("DuckDB instead of SQLite", "moved
    to Dagster") where the record does not: an update, not a restatement."""
    return bool(cand.distinct - other.surface) and bool(_CHANGE_WORDS & set(cand.words)) \
        and not _CHANGE_WORDS & set(other.words)


def compare(cand: TextProfile, other: TextProfile) -> dict[str, Any]:
    """The comparison facts of ``cand`` against a current record's ``other`` (see the module)."""
    shared = len(cand.terms & other.terms)
    larger = max(len(cand.terms), len(other.terms))
    return {
        # The share of the larger text's terms that both have: a short text inside a long one
        # (a question and its answer in a conversation, say) is not a restatement of it.
        "lexical": round(shared / larger, 3) if larger else 0.0,
        "same_text": cand.normalized == other.normalized,
        "same_kind": cand.primary_kind == other.primary_kind,
        "same_family": bool(cand.family_refs & other.family_refs),
        # A distinctive token of either text that the other has too (as a name at the start of a
        # sentence, say), or that the other lacks.
        "distinct_shared": len((cand.distinct | other.distinct) & cand.surface & other.surface),
        "distinct_added": len(cand.distinct - other.surface),
        "distinct_missing": len(other.distinct - cand.surface),
        "polarity_differs": _flipped(cand.polarity, other.polarity) or _updates(cand, other),
        "slot_edit": _slot_edit(cand.words, other.words),
        "subject_changed": _subject_changed(cand, other),
    }
