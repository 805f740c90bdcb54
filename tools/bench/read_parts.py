"""Issue 63: a search's per-call parts around the ranking, the construction before against this
checkout's, alternated in one process (a ratio per pass; no data directory needed).

    .venv/bin/python -m tools.bench.read_parts [--passes 15] [--records 10000]

Parts: the related-word expansion of a query (``reading.expanded_terms`` with a warm server's
caches, against the one-step-per-term loop it replaced) on issue 63's long and broad queries,
and the redaction receipts of a 10-record page (``Redaction.receipt`` against the plain
``with_receipt_digest``). Both pairs are checked equal before they are timed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from engram_core.contract.canonical import canonical, with_receipt_digest
from engram_core.services import lexical
from engram_core.services.ranking import OFFLINE_LEXICAL_V5, Expansion
from engram_core.services.reading import Redaction, expanded_terms, hashed_relatives, related_others
from tools.bench.broad_corpus import BroadCorpus


def plain_expansion(expansion: Expansion, relatives: Callable[..., Any], text: str, terms: list[int]) -> dict[int, float]:
    """The construction before: one Python step per related term."""
    own = set(terms)
    out: dict[int, float] = {}
    for word, term in lexical.query_words(text):
        if term is None or not word.isalpha():
            continue
        for related, hashed in relatives(expansion, word):
            if related != term and hashed not in own:
                out[hashed] = expansion.weight
    return out


def plain_receipt(red: Redaction, allow: set[str], record_id: str) -> str:
    return with_receipt_digest({
        "kind": "redaction", "record_id": record_id, "allow_fields": canonical(sorted(allow)),
        "redacted_fields": red.omitted_c, "policy_receipt_digest": red.decision_receipt,
    })["receipt_digest"]


def _time(fn: Callable[[], Any], reps: int) -> float:
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - started) / reps * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.read_parts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    expansion = OFFLINE_LEXICAL_V5.expansion
    assert expansion is not None
    hasher = lexical.TermHasher(os.urandom(32))
    relatives = functools.lru_cache(maxsize=65_536)(hashed_relatives(hasher))  # as ReadService caches
    others = functools.lru_cache(maxsize=65_536)(
        lambda e, word, term: related_others(relatives, e, word, term))
    corpus = BroadCorpus()
    report: dict[str, Any] = {"passes": args.passes, "loadavg": os.getloadavg()[0], "parts": {}}
    for shape in ("long", "broad"):
        queries = [(q, hasher.query_terms(q)) for q in corpus.shape_queries(shape, 40, args.records)]
        for q, terms in queries:  # warm both caches; the two agree exactly, order included
            want = plain_expansion(expansion, relatives, q, terms)
            assert list(expanded_terms(expansion, relatives, q, terms, others=others).items()) == list(want.items())
        before = lambda qs=queries: [plain_expansion(expansion, relatives, q, t) for q, t in qs]  # noqa: E731
        after = lambda qs=queries: [expanded_terms(expansion, relatives, q, t, others=others)  # noqa: E731
                                    for q, t in qs]
        report["parts"][f"expansion/{shape}"] = _pairs(before, after, args.passes, len(queries))
    allow = {"/record_id", "/payload", "/record_digest", "/state", "/accepted_at", "/cursor"}
    red = Redaction(allow, "sha256:" + "ab" * 32)
    ids = [f"rec_{i:052d}" for i in range(10)]
    assert [red.receipt(r) for r in ids] == [plain_receipt(red, allow, r) for r in ids]
    report["parts"]["redaction-receipts/10"] = _pairs(lambda: [plain_receipt(red, allow, r) for r in ids],
                                                      lambda: [red.receipt(r) for r in ids], args.passes * 20, 1)
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(report, indent=1) + "\n")
    return 0


def _pairs(before: Callable[[], Any], after: Callable[[], Any], passes: int, per: int) -> dict[str, Any]:
    """Per pass: before then after (order alternated), ms per item, and the pass's ratio."""
    b_ms, a_ms, ratios = [], [], []
    for i in range(passes):
        if i % 2:
            a, b = _time(after, 5) / per, _time(before, 5) / per
        else:
            b, a = _time(before, 5) / per, _time(after, 5) / per
        b_ms.append(b)
        a_ms.append(a)
        ratios.append(b / a)
    ratios.sort()
    return {"before_ms": round(statistics.median(b_ms), 4), "after_ms": round(statistics.median(a_ms), 4),
            "ratio_median": round(statistics.median(ratios), 2),
            "ratio_quartiles": [round(ratios[len(ratios) // 4], 2), round(ratios[3 * len(ratios) // 4], 2)]}


if __name__ == "__main__":
    raise SystemExit(main())
