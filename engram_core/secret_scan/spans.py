"""Where two kinds of secret-scanner match lie, found without RE2's slow engines (issue 57.8).

RE2 is linear in its input whatever the engine, but its engines differ 50-fold in speed. The
lazy DFA (about 1.5 ns a byte) serves a search that only wants a match's span; two things
fall back to the NFA (50-150 ns a byte):

* **Submatches of a long match.** A slot rule's content (``secret_slots``) was taken from
  ``slot.fullmatch(match)``, the pattern with capturing groups; past a few KiB RE2 runs that on
  its NFA. A 1 MiB value with nothing to end it (``password=`` then 1 MiB of letters) cost
  55 ms per slot rule, and a text can be that match for three rules at once. ``slot_content``
  finds the same group with byte methods: each slot pattern's head ends at a byte that the
  pattern makes unambiguous (an assignment's operator, a DSN's second colon, the colon after
  ``curl``'s last whitespace), and only an assignment's ``=>`` or ``:=`` leaves a choice,
  which is tried in the pattern's order.
* **A DFA whose states multiply.** ``(?i)aws.{0,20}(?:secret|key).{0,5}[:=]…{40}`` opens a
  thread at every ``aws``, ``secret``, ``key``, ``:`` and ``=``; on a soup of those words RE2's
  DFA ran out of memory and the search ran on the NFA: 340-410 ms per MiB; so did
  ``-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY…`` on ``-----BEGIN`` and blanks (210 ms).
  ``aws_secret_starts`` and ``private_key_starts`` find the positions where such a pattern can
  start with numpy over the whole text (each part of the pattern is a fixed word, a bounded gap
  of some class, or a run length), then ``anchored_spans`` asks RE2 for the match from each
  start anchored there, where the automaton stays small; RE2's own leftmost-first search
  returns the same spans, because the leftmost match starts at the first position an anchored
  match can start from.

Both are exact: the scanner's findings are those of the RE2 calls they replace
(``tests/unit/test_secret_spans.py`` compares them on generated texts). Each is keyed by the
pattern text it was derived from, so a rule whose pattern changes falls back to RE2 until its
locator is rewritten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import numpy as np
import re2

# RE2's \s (Latin-1 too): tab, LF, FF, CR, space; not VT.
_WS = b"\t\n\f\r "
_ALL = bytes(range(256))


def _complement(allowed: bytes) -> bytes:
    return bytes(b for b in _ALL if b not in allowed)


# The content classes of the slot patterns: the bytes they exclude, and those they hold.
_BARE_EXCLUDED = _WS + b"'\"()"  # [^\s'"()]
_BARE = _complement(_BARE_EXCLUDED)
_DQ = _complement(b"\"\r\n")  # [^"\r\n]
_SQ = _complement(b"'\r\n")  # [^'\r\n]
_VALUE_END = frozenset(_WS + b"'\";,#)")  # (?:[\s'";,#)]|$)
_KEY_END_START = b"'\"] \t=:"


def _within(content: bytes, allowed: bytes) -> bool:
    """Every byte of ``content`` in the class: deleting the class's bytes leaves nothing (one
    pass in C)."""
    return not content.translate(None, allowed)


def _strip_blanks(m: bytes, i: int) -> int:
    """The index after a run of spaces and tabs starting at ``i``."""
    return len(m) - len(m[i:].lstrip(b" \t")) if i < len(m) else i


def _bare(m: bytes, v: int, minimum: int, group: int) -> tuple[int, bytes] | None:
    """``([^\\s'"()]{minimum,})(?:[\\s'";,#)]|$)`` fullmatching ``m[v:]``: greedy, so the last
    byte is the content's whenever the class holds it (``$`` then ends the match)."""
    end = len(m) if m[-1] not in _BARE_EXCLUDED else len(m) - 1
    if end < len(m) and m[-1] not in _VALUE_END:
        return None
    content = m[v:end]
    if len(content) < minimum or not _within(content, _BARE):
        return None
    return group, content


def _named_value(quoted: int, bare: int) -> Callable[[bytes], tuple[int, bytes] | None]:
    """``secret_rules._named_value``: KEY KEY_END then ``"…"`` (group 1), ``'…'`` (2) or a bare
    value (3). The key is letters and ``[_.-]``, so KEY_END starts at the first byte that can
    start it; its optional quote, bracket and blanks are then forced (nothing after them may
    start with one), and so are the blanks after the operator. The operator is the one choice:
    ``=>`` before ``=`` (a value starting ``>``), ``:=`` before ``:`` (one starting ``=``)."""

    def locate(m: bytes) -> tuple[int, bytes] | None:
        k = next((i for i, b in enumerate(m[:32]) if b in _KEY_END_START), None)
        if k is None:  # the longest key is 22 bytes: a match has one in its first 32
            return None
        p = k
        if m[p:p + 1] in (b"'", b'"'):
            p += 1
        if m[p:p + 1] == b"]":
            p += 1
        p = _strip_blanks(m, p)
        for op in (b"=>", b":=", b"=", b":"):
            if not m.startswith(op, p):
                continue
            v = _strip_blanks(m, p + len(op))
            found = _value(m, v, quoted, bare)
            if found is not None:
                return found
        return None

    return locate


def _value(m: bytes, v: int, quoted: int, bare: int) -> tuple[int, bytes] | None:
    if v >= len(m):
        return None
    first = m[v]
    if first in (0x22, 0x27):  # " or '
        content = m[v + 1:-1]
        allowed = _DQ if first == 0x22 else _SQ
        if len(m) - v < 2 or m[-1] != first or len(content) < quoted or not _within(content, allowed):
            return None
        return (1 if first == 0x22 else 2), content
    return _bare(m, v, bare, 3)


def _dotenv(m: bytes) -> tuple[int, bytes] | None:
    """The name before ``=`` holds no ``=``: the first one is the assignment; blanks and one
    quote after it are forced (the value holds neither)."""
    e = m.find(b"=")
    if e < 0:
        return None
    v = _strip_blanks(m, e + 1)
    if m[v:v + 1] in (b"'", b'"'):
        v += 1
    return _bare(m, v, 8, 1) if v < len(m) else None


def _url_userinfo(m: bytes) -> tuple[int, bytes] | None:
    """``scheme://user:PASSWORD@h``: the scheme and the user hold no ``:``, the password no ``@``,
    and the match ends two bytes after it."""
    scheme_end = m.find(b"://")
    s = m.find(b":", scheme_end + 3) + 1 if scheme_end >= 0 else 0
    return (1, m[s:-2]) if s > 0 else None


def _go_dsn(m: bytes) -> tuple[int, bytes] | None:
    """``user:PASSWORD@tcp(…``: the user holds no ``:``, the password no ``@``."""
    s = m.find(b":") + 1
    at = m.find(b"@", s)
    return (1, m[s:at]) if s > 0 and at >= 0 else None


def _curl(m: bytes) -> tuple[int, bytes] | None:
    """``curl … -u user:PASSWORD``: the password holds no whitespace and runs to the match's
    end; between the last whitespace (the one before the flag, or the blanks after it) and the
    password come only the flag, ``=``, a quote and the user, none of them a ``:``."""
    w = max(m.rfind(bytes([b])) for b in _WS)
    s = m.find(b":", w + 1) + 1
    return (1, m[s:]) if w >= 0 and s > 0 else None


# Each locator with the SHA-256 of the slot pattern it was derived from: a rule whose pattern
# changes gets none (RE2's fullmatch then) until its locator is checked against the new text.
_DERIVED_FROM: dict[str, tuple[str, Callable[[bytes], tuple[int, bytes] | None]]] = {
    "password-assignment": ("8c5fb6e944d2977babe6a055863fef284fa66ef037de1cd8eb1e399a58212a56", _named_value(6, 6)),
    "generic-api-key": ("102a03183ec8572aa3c3bcda50412064ce425207c9340cb3feff6f6b797d81cc", _named_value(8, 16)),
    "dotenv-secret": ("e8b20a9ee5658b79e7c36acc8fd93b6062bdfef9cead5fa31f284f7152d0c21b", _dotenv),
    "connection-string": ("205d722dc4be8779b3bf3191aece00c0461411c3dc626d481b31f87b8a2ee63a", _url_userinfo),
    "mysql-go-dsn": ("19437e6bfdeb4747cd8b34e8fd0fbee9cc141489dcacbbd7b39d5c973459391a", _go_dsn),
    "curl-user-password": ("0853f6be7eb575577ca9f5082d2f878c2fc2ed11d4f85b5391300f490d1ce482", _curl),
}


def _digest(pattern: str) -> str:
    return hashlib.sha256(pattern.encode()).hexdigest()


def locator(rule: str, slot_pattern: str) -> Callable[[bytes], tuple[int, bytes] | None] | None:
    """The byte-method locator of a slot rule, None if it has none or its pattern is not the
    one the locator was derived from: then the caller runs ``fullmatch`` with groups."""
    derived = _DERIVED_FROM.get(rule)
    return derived[1] if derived is not None and derived[0] == _digest(slot_pattern) else None


# -- aws-secret-access-key-assignment --------------------------------------------------------

AWS_SECRET_PATTERN = r"(?i)aws.{0,20}(?:secret|key).{0,5}[:=][ \t]*['\"]?[A-Za-z0-9/+=]{40}"
_PAD = 64  # bytes past the end, all newlines: every part refuses them


def _word_at(lowered: np.ndarray, word: bytes) -> np.ndarray:
    """Where ``word`` starts in the padded text (lower-cased for a case-insensitive word)."""
    hits = lowered == word[0]
    for i, b in enumerate(word[1:], 1):
        hits[:-i] &= lowered[i:] == b
        hits[-i:] = False
    return hits


def _reach(flags: np.ndarray, passable: np.ndarray, steps: int) -> np.ndarray:
    """Where a ``flags`` position is at most ``steps`` bytes ahead across ``passable`` bytes:
    out[i] = any flags[i + a] with a <= steps and passable[i:i + a] all true. By doubling
    (``reach[k]`` covers a < k, ``across[k]`` says passable[i:i + k]), then composing the
    powers of two that sum to steps + 1: O(log steps) passes."""
    reach, across, k = {1: flags}, {1: passable}, 1
    while 2 * k <= steps + 1:
        reach[2 * k] = reach[k] | (across[k] & _shifted(reach[k], k))
        across[2 * k] = across[k] & _shifted(across[k], k)
        k *= 2
    out, through, covered = reach[k], across[k], k
    while covered < steps + 1:
        k //= 2
        if covered + k <= steps + 1:
            out = out | (through & _shifted(reach[k], covered))
            through = through & _shifted(across[k], covered)
            covered += k
    return out


def _shifted(flags: np.ndarray, by: int) -> np.ndarray:
    """out[i] = flags[i + by] (False past the end)."""
    out = np.zeros_like(flags)
    out[:-by] = flags[by:]
    return out


def _across_all(flags: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """out[i] = flags at the first position at or after i that is not ``skipped`` (runs of
    skipped bytes of any length): doubling until no run is as long as the step."""
    reach, across, k = flags & ~skipped, skipped, 1
    while across.any():
        reach = reach | (across & _shifted(reach, k))
        across = across & _shifted(across, k)
        k *= 2
    return reach


def aws_secret_starts(data: bytes) -> np.ndarray:
    """Every position where ``AWS_SECRET_PATTERN`` matches anchored, ascending. Per part, with
    boolean arrays over the text (a few dozen numpy passes, no per-byte Python): ``aws`` at s;
    ``secret`` or ``key`` at j, s+3 <= j <= s+23 with no newline between (``.``); ``[:=]`` at q
    within 5 bytes after the word, no newline between; after q all the blanks (the value holds
    none, so ``[ \t]*`` must take them), one quote if there is one (likewise), then 40 value
    bytes."""
    n = len(data)
    raw = np.full(n + _PAD, ord("\n"), np.uint8)
    raw[:n] = np.frombuffer(data, np.uint8)
    upper = (raw >= 0x41) & (raw <= 0x5A)
    lowered = raw | (upper.view(np.uint8) << 5)
    passable = raw != ord("\n")
    value = (((lowered >= 0x61) & (lowered <= 0x7A)) | ((raw >= 0x30) & (raw <= 0x39))
             | (raw == ord("/")) | (raw == ord("+")) | (raw == ord("=")))
    run = value  # run[t]: value bytes at t .. t+k-1, k doubling to 32, then 40
    for k in (1, 2, 4, 8, 16):
        run = run & _shifted(run, k)
    run40 = run & _shifted(run, 8)
    quote = (raw == ord("'")) | (raw == ord('"'))
    after_blanks = run40 | (quote & _shifted(run40, 1))
    blank = (raw == ord(" ")) | (raw == ord("\t"))
    value_follows = _across_all(after_blanks, blank)
    separator = ((raw == ord(":")) | (raw == ord("="))) & _shifted(value_follows, 1)
    near_separator = _reach(separator, passable, 5)
    word = ((_word_at(lowered, b"secret") & _shifted(near_separator, 6))
            | (_word_at(lowered, b"key") & _shifted(near_separator, 3)))
    start = _word_at(lowered, b"aws") & _shifted(_reach(word, passable, 20), 3)
    return np.flatnonzero(start[:n])


def anchored_spans(regex: re2._Regexp, data: bytes, starts: np.ndarray, limit: int) -> Iterator[tuple[int, int]]:
    """The spans ``regex.finditer(data)`` yields (at most ``limit``), given positions ascending
    that include every one where ``regex`` matches anchored: the leftmost of them at or after
    the last match's end where RE2's anchored leftmost-first match succeeds, and that match."""
    pos, found, n, i = 0, 0, len(data), 0
    while found < limit:
        if i < len(starts) and starts[i] < pos:
            i = int(np.searchsorted(starts, pos, "left"))
        if i >= len(starts):
            return
        span = regex._regexp.Match(re2._Anchor.ANCHOR_START, data, int(starts[i]), n)[0]
        i += 1
        if span[0] < 0:
            continue  # a candidate only (or, for the numpy starts, never seen): RE2 judges
        yield span
        found += 1
        pos = span[1]


# Up to this many occurrences of a rule's first word per byte of text, each is tried as a start
# (an anchored RE2 call, a few µs); past it the numpy pass (10-20 ms per MiB) finds the starts.
_CANDIDATES_PER_BYTE = 1 / 256


def _occurrences(text: bytes, word: bytes) -> np.ndarray | None:
    """Where ``word`` occurs in ``text`` (it overlaps itself nowhere), None if too often."""
    if text.count(word) > len(text) * _CANDIDATES_PER_BYTE + 16:
        return None
    found, i = [], text.find(word)
    while i >= 0:
        found.append(i)
        i = text.find(word, i + 1)
    return np.array(found, np.int64)


def aws_secret_spans(regex: re2._Regexp, data: bytes, limit: int) -> Iterator[tuple[int, int]]:
    """``regex.finditer(data)``'s spans for ``regex`` compiled from ``AWS_SECRET_PATTERN``."""
    starts = _occurrences(data.lower(), b"aws")
    return anchored_spans(regex, data, aws_secret_starts(data) if starts is None else starts, limit)


# -- private-key -----------------------------------------------------------------------------

PRIVATE_KEY_PATTERN = r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"


def private_key_starts(data: bytes) -> np.ndarray:
    """Every position where ``PRIVATE_KEY_PATTERN`` matches anchored: ``-----BEGIN`` at s, then
    at most 100 bytes of ``[ A-Z0-9_-]`` up to a ``PRIVATE KEY-----`` or ``PRIVATE KEY
    BLOCK-----``. On ``-----BEGIN`` and blanks RE2's DFA kept a thread per ``BEGIN`` in the
    last 100 bytes and ran out of memory: 210 ms per MiB."""
    n = len(data)
    raw = np.full(n + _PAD, ord("\n"), np.uint8)
    raw[:n] = np.frombuffer(data, np.uint8)
    gap = (((raw >= 0x41) & (raw <= 0x5A)) | ((raw >= 0x30) & (raw <= 0x39))
           | (raw == ord(" ")) | (raw == ord("_")) | (raw == ord("-")))
    label = _word_at(raw, b"PRIVATE KEY")
    end = _word_at(raw, b"-----") | _word_at(raw, b" BLOCK-----")
    start = _word_at(raw, b"-----BEGIN") & _shifted(_reach(label & _shifted(end, 11), gap, 100), 10)
    return np.flatnonzero(start[:n])


def private_key_spans(regex: re2._Regexp, data: bytes, limit: int) -> Iterator[tuple[int, int]]:
    """``regex.finditer(data)``'s spans for ``regex`` compiled from ``PRIVATE_KEY_PATTERN``."""
    starts = _occurrences(data, b"-----BEGIN")
    return anchored_spans(regex, data, private_key_starts(data) if starts is None else starts, limit)


# Rules whose unanchored search multiplies DFA states, by the pattern text the search was
# derived from (a changed pattern runs on RE2's own search again).
SPANS = {AWS_SECRET_PATTERN: aws_secret_spans, PRIVATE_KEY_PATTERN: private_key_spans}
