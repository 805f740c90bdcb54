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
  disable, allow vs deny, sync vs async ...).
* ``slot_edit``: the two texts are the same words in the same order except one short span
  replaced by another (a template with one slot changed), or the same terms but one or two
  replaced by as many others, one of them a word the dictionary (WordNet, as the thesaurus reads
  it) does not know: a different value, not a restatement.
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

import re2

from engram_core.services import thesaurus
from engram_core.services.lexical import STOP_WORDS, analyze, tokenize

_NUMBER_WORDS = frozenset("""
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen
eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion
first second third fourth fifth sixth seventh eighth ninth tenth half quarter double triple single once twice
monday tuesday wednesday thursday friday saturday sunday january february march april june july august
september october november december daily weekly monthly yearly hourly nightly quarterly annually
""".split())
# Words that flip a statement: a text with one and its counterpart without is a different decision.
_POLARITY = {
    "not": "neg", "no": "neg", "never": "neg", "nor": "neg", "without": "neg", "cannot": "neg", "don": "neg",
    "doesn": "neg", "didn": "neg", "isn": "neg", "aren": "neg", "won": "neg", "shouldn": "neg", "mustn": "neg",
    "enable": "on", "enabled": "on", "enables": "on", "disable": "off", "disabled": "off", "disables": "off",
    "allow": "allow", "allowed": "allow", "allows": "allow", "permit": "allow", "permitted": "allow",
    "deny": "deny", "denied": "deny", "denies": "deny", "block": "deny", "blocked": "deny", "forbid": "deny",
    "forbidden": "deny", "prohibit": "deny", "prohibited": "deny", "reject": "deny", "rejected": "deny",
    "accept": "allow", "accepted": "allow", "on": "on", "off": "off", "true": "on", "false": "off",
    "yes": "on", "sync": "sync", "synchronous": "sync", "async": "async",
    "asynchronous": "async", "increase": "up", "increased": "up", "raise": "up", "raised": "up",
    "decrease": "down", "decreased": "down", "lower": "down", "lowered": "down", "reduce": "down",
    "reduced": "down", "add": "add", "added": "add", "remove": "remove", "removed": "remove", "drop": "remove",
    "dropped": "remove", "include": "add", "included": "add", "exclude": "remove", "excluded": "remove",
    "before": "before", "after": "after", "min": "min", "minimum": "min", "max": "max", "maximum": "max",
    "public": "public", "private": "private", "required": "required", "optional": "optional",
    "mandatory": "required", "keep": "keep", "kept": "keep", "delete": "remove", "deleted": "remove",
    "start": "start", "stop": "stop", "stopped": "stop", "open": "open", "close": "close", "closed": "close",
    "upper": "up", "higher": "up", "more": "up", "less": "down", "fewer": "down", "above": "up", "below": "down",
}
_OPPOSITES = (("on", "off"), ("allow", "deny"), ("sync", "async"), ("up", "down"), ("add", "remove"),
              ("before", "after"), ("min", "max"), ("public", "private"), ("required", "optional"),
              ("start", "stop"), ("open", "close"), ("keep", "remove"))
_DISTINCT_SHAPE = re2.compile(r"[0-9]|[A-Za-z][._/:-]+[A-Za-z0-9]|_|^--?[a-z]")
_WORD = re2.compile(r"[\w./:+#@-]+")
_SENTENCE_END = frozenset(".!?:;\n")
_SLOT_MAX = 3  # the longest span (in words) a template edit replaces
_SUBSTITUTED_MAX = 2  # the most terms a substitution replaces


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
    unknown: frozenset[str]  # terms of words WordNet does not know (names, products, identifiers)


def _surface(text: str) -> set[str]:
    return {unicodedata.normalize("NFKC", m.group(0).strip(".:/-")).casefold() for m in _WORD.finditer(text)}


def _distinct(text: str) -> set[str]:
    out: set[str] = set()
    sentence_start = True
    for m in _WORD.finditer(text):
        raw = m.group(0).strip(".:/-")
        if not raw:
            continue
        folded = unicodedata.normalize("NFKC", raw).casefold()
        if (_DISTINCT_SHAPE.search(raw) or folded in _NUMBER_WORDS
                or (raw[0].isupper() and not sentence_start and raw != "I")
                or (len(raw) > 1 and raw.isupper() and raw.isalpha())
                or any(c.isupper() for c in raw[1:])):
            out.add(folded)
        # The next word starts a sentence when this one ended one.
        end_char = text[m.end() - 1] if m.end() > 0 else ""
        nxt = text[m.end()] if m.end() < len(text) else ""
        sentence_start = end_char in _SENTENCE_END or nxt in _SENTENCE_END
    return out


def profile(effective: dict[str, Any]) -> TextProfile:
    """A payload's text profile: its components' texts together."""
    texts = [c["text"] for c in effective["components"]]
    joined = "\n".join(texts)
    words = tuple(tokenize(joined))
    primary = next((c for c in effective["components"] if c["component_id"] == effective.get("primary_component_id")), {})
    return TextProfile(
        terms=frozenset(analyze(joined)),
        distinct=frozenset(_distinct(joined)),
        surface=frozenset(_surface(joined)),
        polarity=tuple(sorted(Counter(_POLARITY[w] for w in words if w in _POLARITY).items())),
        words=words,
        normalized=tuple(sorted(" ".join(tokenize(t)) for t in texts)),
        primary_kind=str(primary.get("kind", "")),
        family_refs=frozenset(effective.get("reconciliation", {}).get("family_refs", [])),
        unknown=frozenset(_unknown_terms(words)),
    )


@functools.lru_cache(maxsize=65_536)
def _known(word: str) -> bool:
    """Whether WordNet knows ``word`` (any part of speech, any inflection). Without the data
    (``thesaurus.ThesaurusUnavailable``) every word counts as known: no substitution is then
    judged by it."""
    try:
        words = thesaurus.load(1, ())
    except (thesaurus.ThesaurusUnavailable, OSError):
        return True
    return any(words.lemmas(word, pos) for pos in "nvar")


def _unknown_terms(words: tuple[str, ...]) -> set[str]:
    content = [w for w in words if w.isalpha() and w not in STOP_WORDS]
    unknown = [w for w in dict.fromkeys(content) if not _known(w)]
    return set(analyze(" ".join(unknown))) if unknown else set()


def _slot_edit(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Same words in the same order but one short span replaced by a different one."""
    n = min(len(a), len(b))
    prefix = 0
    while prefix < n and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < n - prefix and a[len(a) - 1 - suffix] == b[len(b) - 1 - suffix]:
        suffix += 1
    gap_a, gap_b = len(a) - prefix - suffix, len(b) - prefix - suffix
    return 0 < gap_a <= _SLOT_MAX and 0 < gap_b <= _SLOT_MAX


def _substitution(a: TextProfile, b: TextProfile) -> bool:
    """One or two terms of each text replaced by as many others, the rest the same (wherever they
    stand), and a replaced one is a word no dictionary knows (a name, a product): "the heronry
    job" and "the grebeline job", "use postgres for the queue" and "... rabbitmq ...". Replaced
    dictionary words are what paraphrases do ("uses" for "stores")."""
    only_a, only_b = a.terms - b.terms, b.terms - a.terms
    return (0 < len(only_a) == len(only_b) <= _SUBSTITUTED_MAX and len(a.terms & b.terms) >= 2 * len(only_a)
            and bool((only_a & a.unknown) | (only_b & b.unknown)))


def _flipped(a: tuple[tuple[str, int], ...], b: tuple[tuple[str, int], ...]) -> bool:
    """One negates and the other does not, or one says a word more often whose opposite the other
    says more often (enable vs disable, sync vs async)."""
    ca, cb = Counter(dict(a)), Counter(dict(b))
    if (ca["neg"] > 0) != (cb["neg"] > 0):
        return True
    more_a, more_b = ca - cb, cb - ca
    return any((more_a[x] and more_b[y]) or (more_a[y] and more_b[x]) for x, y in _OPPOSITES)


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
        "polarity_differs": _flipped(cand.polarity, other.polarity),
        "slot_edit": _slot_edit(cand.words, other.words) or _substitution(cand, other),
    }
