"""The thesaurus (services/thesaurus.py) against WordNet's files read whole, and the query
expansion it gives offline_lexical_v5."""

from __future__ import annotations

from engram_core.services import lexical, thesaurus
from engram_core.services.ranking import OFFLINE_LEXICAL_V4, OFFLINE_LEXICAL_V5, Expansion
from engram_core.services.reading import expanded_terms, hashed_relatives

_POS = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}


def _index_whole() -> tuple[dict[tuple[str, str], list[int]], set[str]]:
    """Every lemma's offsets, and the lemmas next to a place where the file is not in byte order
    (the files sort a few non-ASCII lemmas, "hawaiʻi…", as characters: a binary search by bytes
    may miss their neighbours)."""
    out, unsorted = {}, set()
    for p, name in _POS.items():
        lines = [line for line in (thesaurus.data_dir() / f"index.{name}").read_text(encoding="utf-8").splitlines()
                 if line.strip() and not line.startswith("  ")]
        keys = [line.split(" ", 1)[0] for line in lines]
        for i, line in enumerate(lines):
            f = line.split()
            out[(f[0], p)] = [int(x) for x in f[6 + int(f[3]):]]
            if i and keys[i - 1].encode() > keys[i].encode():
                unsorted.update(keys[max(0, i - 3): i + 3])
    return out, unsorted


def test_every_ascii_lemma_and_every_synset_is_found_by_the_binary_searches() -> None:
    th = thesaurus.Thesaurus(thesaurus.data_dir(), senses=3, relations=("hyponyms", "hypernyms"))
    index, unsorted = _index_whole()
    wrong = [lemma for (lemma, p), offsets in index.items() if th.offsets(lemma, p) != offsets]
    assert set(wrong) <= unsorted and len(unsorted) < 20
    assert len(index) > 150_000
    # Every synset an index names is found, and names the lemma back.
    for (lemma, p), offsets in list(index.items())[::97]:
        for offset in offsets:
            words, _ = th.synset(offset, p)
            assert lemma in words, (lemma, p, offset)
    assert th.offsets("nosuchwordxyz", "n") == [] and th.offsets("", "n") == [] and th.offsets("a b", "n") == []


def test_related_words_come_from_the_first_senses_and_their_relatives() -> None:
    th = thesaurus.load(3, ("hyponyms", "hypernyms"))
    cook = th.related("cook")
    assert {"make", "made", "bake", "fry", "prepare"} <= cook  # a synonym, its irregular past, hyponyms
    assert "cook" not in cook
    assert {"break", "hurt", "wound"} <= th.related("injured")  # an inflected query word finds its lemma
    assert th.related("zzzz") == frozenset()
    only_synonyms = thesaurus.Thesaurus(thesaurus.data_dir(), senses=3, relations=())
    assert "make" in only_synonyms.related("cook") and "bake" not in only_synonyms.related("cook")


def test_the_expansion_adds_weighted_terms_the_query_does_not_have() -> None:
    hasher = lexical.TermHasher(b"k" * 32)
    query = "What did Caroline cook?"
    own = hasher.query_terms(query)
    related = expanded_terms(Expansion(), hashed_relatives(hasher), query, own)
    assert hasher.term("made") in related and hasher.term("bake") in related
    assert set(related.values()) == {0.3}
    assert not set(own) & set(related)
    # Names, numbers and question words are not expanded.
    assert expanded_terms(Expansion(), hashed_relatives(hasher), "what 2024", hasher.query_terms("what 2024")) == {}


def test_the_expansion_is_pinned_in_the_profile_config_digest() -> None:
    config = OFFLINE_LEXICAL_V5.config()["query_expansion"]
    assert config["source"] == thesaurus.SOURCE and config["weight"] == "0.3" and config["senses"] == 3
    assert config["max_share"] == "0.35"
    assert OFFLINE_LEXICAL_V5.config_digest() != OFFLINE_LEXICAL_V4.config_digest()
    assert "query_expansion" not in OFFLINE_LEXICAL_V4.config()


def test_files_other_than_the_pinned_ones_are_refused(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Other files would rank other records first: the thesaurus refuses them, and the read
    service then serves version 4 (docs/security.md, "A swapped thesaurus")."""
    import shutil

    assert thesaurus.files_digest(thesaurus.data_dir()) == thesaurus.DATA_SHA256
    copy = tmp_path / "wordnet"
    shutil.copytree(thesaurus.data_dir(), copy)
    with (copy / "data.verb").open("r+b") as f:  # one byte of one synset's gloss changed
        f.seek(-20, 2)
        byte = f.read(1)
        f.seek(-20, 2)
        f.write(b"x" if byte != b"x" else b"y")
    monkeypatch.setattr(thesaurus, "data_dir", lambda: copy)
    thesaurus.load.cache_clear()
    try:
        try:
            thesaurus.load(3, ("hyponyms", "hypernyms"))
        except thesaurus.ThesaurusUnavailable as exc:
            assert "not the pinned ones" in str(exc)
        else:
            raise AssertionError("a changed file was used")
        from engram_core.services.reading import _thesaurus_installed

        assert _thesaurus_installed(OFFLINE_LEXICAL_V5.expansion) is False  # type: ignore[arg-type]
    finally:
        thesaurus.load.cache_clear()
