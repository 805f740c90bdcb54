"""The secret scanner (SPEC §13): which credential shapes occur in a request's strings.

It reports findings as ``[{"kind", "rule", "count"}]`` (never the matched text); the
policy decides what a finding means (``policies/engram/capture`` for memory content,
``policies/engram/authz`` for the other stored strings of a request). Three properties:

* **Linear time.** Every rule is an RE2 pattern (``google-re2``): RE2 never backtracks,
  so a scan is linear in the input whatever the input is. The one check that is not a
  pattern (a bare 40-character AWS secret key) is vectorised over the text with numpy.
  Counting stops at ``MAX_COUNT`` matches per rule, so no text makes Python loop per match.
  Linear is not enough: RE2's NFA is 50-100 times slower than its DFA, so nothing here may
  send a long text to it (``engram_core.secret_scan.spans``, issue 57.8): a slot's content is
  located in its match with byte methods rather than a submatch, and the rules whose DFA
  states multiply on a crafted soup of their words find their starts with numpy first.
* **Normalised input.** Text is scanned after NFKC folding onto ASCII, after folding
  look-alike letters of other scripts onto the ASCII they imitate (Unicode's confusables
  skeleton, UTS #39: ``engram_core.secret_scan.confusables``), and after removing invisible characters
  (Unicode format characters, category Cf, the other default ignorable code points, the
  line and paragraph separators U+2028/U+2029 and the control characters that are not
  whitespace), so a token split by a zero-width space or a line separator, written in
  full-width letters, or with a Cyrillic ``р`` in ``ghр_`` is still found. Only mappings
  whose result is ASCII are applied (credentials are ASCII), which bounds the folded text at
  4/3 of the input's UTF-8 size; a full NFKC can expand 18-fold (U+FDFA).
* **Rules from a maintained set.** ``engram_core.secret_scan.rules`` (derived from gitleaks and
  detect-secrets, with their licences). A rule that finds a credential by its slot (a name
  and an assignment) does not count a slot that holds no secret (``engram_core.secret_scan.slots``:
  a placeholder, or unquoted code); judging a slot is the one per-match step in Python, and
  it stops at ``SLOT_BUDGET`` candidates per rule (past that at least one finding is
  reported: fail closed).
"""

from __future__ import annotations

import functools
import itertools
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np
import re2

from engram_core.secret_scan import spans as secret_spans
from engram_core.secret_scan.confusables import ascii_lookalike
from engram_core.secret_scan.rules import RULES, Rule
from engram_core.secret_scan.slots import holds_no_secret

# Matches counted per rule and scan; the count saturates there (one is enough to refuse).
MAX_COUNT = 32
# Slot candidates (named-credential matches) judged one by one per rule and scan. A text with
# more than this many, all placeholders or code, is refused anyway: it bounds the Python work
# per scan (a few µs a candidate: two RE2 calls and some byte tests) whatever the text.
SLOT_BUDGET = 64

# Default ignorable code points that are not category Cf (Unicode's DerivedCoreProperties):
# the combining grapheme joiner, Hangul fillers, Khmer inherent vowels, variation selectors.
_IGNORABLE_NOT_CF = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0]
    + list(range(0x180B, 0x1810))
    + list(range(0xFE00, 0xFE10))
)
# Also deleted: characters that split a token without showing as a space. The line and
# paragraph separators (categories Zl, Zp: many renderers draw nothing, JSON passes them raw)
# and the control characters (Cc) that are not whitespace: C0 but tab, LF, VT, FF and CR; DEL;
# C1 (NEL among them).
_DELETED_CATEGORIES = frozenset({"Cf", "Zl", "Zp"})
_ASCII_DELETED = bytes([*range(0x00, 0x09), *range(0x0E, 0x20), 0x7F])
# The fold table covers the BMP and the SMP, which hold every format character and every
# compatibility mapping onto ASCII except plane 14 (tags, variation selectors supplement:
# all invisible, all deleted). Other planes hold ideographs and private use only.
_TABLE_END = 0x20000
_PLANE14 = (0xE0000, 0xE1000)
_MAX_FOLD = 4  # the longest ASCII fold is 4 characters (U+33D8 -> "p.m."); checked on build
_OTHER = 0x80  # any other non-ASCII character: one byte no rule's character classes contain


def _ascii_fold(ch: str) -> str | None:
    """What a non-ASCII character reads as in ASCII, "" when invisible, None when it has no
    ASCII form.

    NFKC first (full-width and mathematical letters, ligatures, circled digits); then the
    NFKD base without combining marks, so an accent over a token character does not hide it;
    then the confusables skeleton (Cyrillic ``р``, Greek ``ο``: ``confusables.ascii_lookalike``)."""
    cp = ord(ch)
    category = unicodedata.category(ch)
    if cp in _IGNORABLE_NOT_CF or category in _DELETED_CATEGORIES or (category == "Cc" and cp >= 0x7F):
        return ""
    folded = unicodedata.normalize("NFKC", ch)
    if folded != ch and folded.isascii():
        return folded
    base = "".join(c for c in unicodedata.normalize("NFKD", ch) if not unicodedata.combining(c))
    if base.isascii():
        return base  # "" for a lone combining mark
    return ascii_lookalike(ch)


@functools.cache
def _fold_table() -> tuple[np.ndarray, np.ndarray]:
    """Per code point below _TABLE_END: its ASCII bytes packed little-endian in a uint32 and
    their count; then one entry for "any other character" and one for "deleted".
    Built on first use (about half a second); ``module_ready`` builds it at start-up."""
    packed = np.zeros(_TABLE_END + 2, "<u4")
    length = np.ones(_TABLE_END + 2, np.uint8)
    packed[:0x80] = np.arange(0x80)
    packed[0x80:] = _OTHER
    length[_DELETED] = 0
    length[list(_ASCII_DELETED)] = 0
    for cp in range(0x80, _TABLE_END):
        if 0xD800 <= cp < 0xE000:
            continue  # surrogates: no character
        folded = _ascii_fold(chr(cp))
        if folded is None:
            continue
        # The 4/3 bound on the folded text holds per character: at most 4 ASCII bytes for a
        # character of 3 UTF-8 bytes, 2 for one of 2.
        if len(folded) > _MAX_FOLD or 3 * len(folded) > 4 * len(chr(cp).encode()):
            raise AssertionError(f"U+{cp:04X} folds to {len(folded)} characters")
        packed[cp] = int.from_bytes(folded.encode(), "little")
        length[cp] = len(folded)
    return packed, length


_DELETED = _TABLE_END + 1
# Per fold length, which of the 4 packed bytes are kept (little-endian, as a uint32).
_KEEP = np.array([0, 0x01, 0x0101, 0x010101, 0x01010101], "<u4")


def normalize(text: str) -> bytes:
    """The text as the rules see it, as bytes: printable ASCII and whitespace as is; every
    other character folded onto ASCII (NFKC, then accents dropped, then the confusables
    skeleton), deleted when invisible (Unicode format characters, category Cf, the other
    default ignorables, combining marks, U+2028/U+2029, control characters that are not
    whitespace), or else one byte outside every rule's character classes. Vectorised with
    numpy: linear, a few ms per MiB, and never more than 4/3 of the input's UTF-8 size (a
    full NFKC can grow it 18-fold: U+FDFA)."""
    if text.isascii():
        return text.encode().translate(None, _ASCII_DELETED)
    packed, length = _fold_table()
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), "<u4")
    if cps.max() >= _TABLE_END:
        index = np.minimum(cps, _TABLE_END)  # _TABLE_END: any other character
        index[(cps >= _PLANE14[0]) & (cps < _PLANE14[1])] = _DELETED
    else:
        index = cps
    lengths = length[index]
    if lengths.max() <= 1:  # no fold longer than one character: one byte per kept character
        kept = packed[index] if lengths.min() == 1 else packed[index][lengths == 1]
        return kept.astype(np.uint8).tobytes()
    return packed[index].view(np.uint8)[_KEEP[lengths].view(np.bool_)].tobytes()


_Locate = Callable[[bytes], "tuple[int, bytes] | None"]


class _Compiled(NamedTuple):
    rule: Rule
    regex: re2._Regexp
    keywords: tuple[bytes, ...]
    slot: re2._Regexp | None  # the rule's pattern with groups around the slot's content
    # Where the slot's content lies in a match, by byte methods (secret_spans); None: ``slot``
    # runs (RE2's submatch engines: the NFA past a few KiB, 50 ns a byte).
    locate: _Locate | None = None
    # The rule's matches found without an unanchored RE2 search whose DFA states multiply.
    spans: Callable[[re2._Regexp, bytes, int], Iterator[tuple[int, int]]] | None = None


def _compile(rule: Rule) -> _Compiled:
    options = re2.Options()
    # Patterns are ASCII and the text is scanned as bytes: Latin-1 needs no UTF-8 decoding
    # in the automaton and accepts any byte (lone surrogates are passed through as bytes).
    options.encoding = re2.Options.Encoding.LATIN1
    regex = re2.compile(rule.pattern.encode(), options)
    if regex.groups:  # a capturing group makes RE2 run its slower submatch engines per match
        raise ValueError(f"rule {rule.rule} has a capturing group")
    slot = None
    if rule.slot is not None:  # run on one match's bytes at a time (at most SLOT_BUDGET per scan)
        slot = re2.compile(rule.slot.pattern.encode(), options)
        if not slot.groups or rule.slot.bare_group > slot.groups:
            raise ValueError(f"rule {rule.rule}'s slot pattern does not have the groups it names")
    locate = secret_spans.locator(rule.rule, rule.slot.pattern) if rule.slot is not None else None
    spans = secret_spans.SPANS.get(rule.pattern)
    return _Compiled(rule, regex, tuple(k.encode() for k in rule.keywords), slot, locate, spans)


_COMPILED: tuple[_Compiled, ...] = tuple(_compile(r) for r in RULES)


def _keyword_set() -> tuple[re2.Set, tuple[bytes, ...]]:
    keywords = tuple(sorted({k for c in _COMPILED for k in c.keywords}))
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    keyword_set = re2.Set.SearchSet(options)
    keyword_set.Add(b"")  # index 0 matches every text: its absence means the set failed
    for k in keywords:
        keyword_set.Add(re2.escape(k))
    keyword_set.Compile()
    return keyword_set, keywords


_KEYWORD_SET, _KEYWORDS = _keyword_set()


def _keywords_present(lowered: bytes) -> frozenset[bytes] | None:
    """The rules' keywords that occur in the lower-cased text, in one pass (an RE2 set of
    literals, as gitleaks' keyword prefilter). None if the set could not answer (RE2 reports
    a set whose automaton ran out of memory as "no match"): then every rule runs."""
    matched = _KEYWORD_SET.Match(lowered) or []
    if 0 not in matched:
        return None
    return frozenset(_KEYWORDS[i - 1] for i in matched if i)


def _count(regex: re2._Regexp, data: bytes) -> int:
    return sum(1 for _ in itertools.islice(regex.finditer(data), MAX_COUNT))


def _count_rule(compiled: _Compiled, data: bytes) -> int:
    if compiled.slot is not None:
        return _count_slots(compiled, data)
    if compiled.spans is not None:
        return sum(1 for _ in compiled.spans(compiled.regex, data, MAX_COUNT))
    return _count(compiled.regex, data)


def _slot_content(compiled: _Compiled, match: bytes) -> tuple[int, bytes] | None:
    """Which group holds the slot's content and its bytes; None if none does (the match counts)."""
    if compiled.locate is not None:
        return compiled.locate(match)
    assert compiled.slot is not None
    # The slot pattern is the counted pattern with groups added: it matches the same bytes,
    # and one of its groups holds the content. Should it not, the match counts.
    parts = compiled.slot.fullmatch(match)
    index = next((i for i in range(1, compiled.slot.groups + 1) if parts.span(i)[0] >= 0), 0) if parts else 0
    return (index, parts.group(index)) if index and parts else None


def _count_slots(compiled: _Compiled, data: bytes) -> int:
    """Matches of a slot rule whose slot holds a credential. Past SLOT_BUDGET candidates the
    rest are not judged and at least one finding is reported (fail closed)."""
    assert compiled.slot is not None and compiled.rule.slot is not None
    bare_group, code = compiled.rule.slot.bare_group, compiled.rule.slot.code
    found = 0
    for judged, match in enumerate(compiled.regex.finditer(data)):
        if judged == SLOT_BUDGET:
            return max(found, 1)
        content = _slot_content(compiled, match.group())
        if content is None or not holds_no_secret(content[1], bare=content[0] == bare_group, code=code):
            found += 1
            if found == MAX_COUNT:
                break
    return found


# -- the bare AWS secret access key -------------------------------------------------------
# 40 characters of [A-Za-z0-9/+] standing alone. Nothing in the shape names it, so a run
# of exactly 40 counts only if it mixes upper case, lower case and digits or '/+', changes
# character class at least _MIN_CLASS_CHANGES times in 39 steps (a random key: 25 on
# average, sd 3; camelCase words and paths: far fewer), and does not decode (as base64)
# to printable text. Git SHAs and Engram's ids and digests are lower case: never a key.
_AWS_LEN = 40
_MIN_CLASS_CHANGES = 14
_CLASS = np.zeros(256, np.int8)  # 0 outside the alphabet; 1 upper, 2 lower, 3 digit, 4 '/' or '+'
_B64_VALUE = np.zeros(256, np.uint8)
for _i, _c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"):
    _CLASS[_c] = 1 if _i < 26 else 2 if _i < 52 else 3 if _i < 62 else 4
    _B64_VALUE[_c] = _i
_TEXT_BYTE = np.zeros(256, np.bool_)
_TEXT_BYTE[0x20:0x7F] = True
_TEXT_BYTE[[0x09, 0x0A, 0x0D]] = True


def _bare_aws_secret_keys(data: bytes) -> int:
    if len(data) < _AWS_LEN:
        return 0
    raw = np.frombuffer(data, np.uint8)
    codes = _CLASS[raw]
    edges = np.diff((codes != 0).astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    exact = (ends - starts) == _AWS_LEN
    starts, ends = starts[exact], ends[exact]
    # A run followed by '=' is base64 padding: encoded data of another length, not a key.
    padded = ends < len(raw)
    padded[padded] = raw[ends[padded]] == ord("=")
    starts = starts[~padded]
    if not starts.size:
        return 0
    window = starts[:, None].astype(np.int64) + np.arange(_AWS_LEN)
    cls = codes[window]
    mixed = (cls == 1).any(1) & (cls == 2).any(1) & ((cls == 3).any(1) | (cls == 4).any(1))
    changes = (np.diff(cls, axis=1) != 0).sum(1) >= _MIN_CLASS_CHANGES
    v = _B64_VALUE[raw[window]].reshape(-1, _AWS_LEN // 4, 4)
    decoded = np.stack(
        [(v[..., 0] << 2) | (v[..., 1] >> 4), ((v[..., 1] & 15) << 4) | (v[..., 2] >> 2),
         ((v[..., 2] & 3) << 6) | v[..., 3]], axis=2,
    ).astype(np.uint8)
    text_like = _TEXT_BYTE[decoded.reshape(len(starts), -1)].all(1)
    return min(int((mixed & changes & ~text_like).sum()), MAX_COUNT)


_BARE_AWS = Rule("aws-secret-access-key", "aws_secret_key", (), "")


def scan(texts: Iterable[str]) -> list[dict[str, int | str]]:
    """Findings as ``[{"kind", "rule", "count"}]`` sorted by kind then rule; never the text.

    The texts are scanned as one, separated by newlines: no rule matches across a newline
    except where a pattern allows whitespace between a name and its value."""
    data = b"\n".join(normalize(t) for t in texts)
    if not data:
        return []
    present = _keywords_present(data.lower())
    counts: Counter[Rule] = Counter()
    for compiled in _COMPILED:
        if compiled.keywords and present is not None and present.isdisjoint(compiled.keywords):
            continue
        n = _count_rule(compiled, data)
        if n:
            counts[compiled.rule] += n
    bare = _bare_aws_secret_keys(data)
    if bare:
        counts[_BARE_AWS] += bare
    return [{"kind": r.kind, "rule": r.rule, "count": counts[r]}
            for r in sorted(counts, key=lambda r: (r.kind, r.rule))]


def module_ready() -> None:
    """Build the lazy table now (start-up), so the first non-ASCII capture does not pay."""
    _fold_table()

