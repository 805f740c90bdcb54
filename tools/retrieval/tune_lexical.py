"""Offline sweep of the lexical channel's choices on both retrieval corpora, without the core.

Re-implements the core's lexical scoring (engram_core/store/search_index/: per-field BM25 with
field weights, IDF ``ln(1 + (N - df + 0.5)/(df + 0.5))``, normalized to the best hit, then
``lexical_weight * bm25 + (1 - lexical_weight) * recency``) over the same fields the core indexes,
so that analyzers (stop words, stemming, question words), k1/b, field weights and the recency
weight can be compared in seconds. The chosen configuration is then measured through the real
core by harness.py and harness_conversations.py (the numbers that count).

Run: ``.venv/bin/python tools/retrieval/tune_lexical.py``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CORPUS as SYNTHETIC  # noqa: E402
from harness import metrics  # noqa: E402
from harness_conversations import CORPUS as CONVERSATIONS  # noqa: E402
from harness_conversations import render, turns_of  # noqa: E402

from engram_core.services import lexical  # noqa: E402

Doc = tuple[str, dict[str, Counter[str]], int]  # id, field -> term counts, days ago


def synthetic(analyze: Callable[[str], list[str]]) -> tuple[dict[str, list[Doc]], list[dict[str, Any]]]:
    corpus = json.loads(SYNTHETIC.read_text())
    excluded = {s["old"] for s in corpus["supersessions"]} | set(corpus["forgotten"])
    docs: dict[str, list[Doc]] = defaultdict(list)
    for m in corpus["memories"]:
        if m["id"] in excluded:
            continue
        kind = m["kind"] if m["kind"] in ("context", "decision", "evidence") else "decision"
        fields = {"primary": Counter(analyze(m["text"])), "context": Counter(analyze(m["context"])),
                  "citations": Counter(analyze(m["source_ref"]))}
        del kind  # the primary component is field "primary" whatever its kind
        docs[m["workspace"]].append((m["id"], fields, m["days_ago"]))
    queries = [{"workspace": q["workspace"], "text": q["text"], "relevant": q["relevant"], "type": "synthetic"}
               for q in corpus["queries"] if q["relevant"]]
    return docs, queries


def conversations(analyze: Callable[[str], list[str]]) -> tuple[dict[str, list[Doc]], list[dict[str, Any]]]:
    corpus = json.loads(CONVERSATIONS.read_text())
    docs: dict[str, list[Doc]] = defaultdict(list)
    for ws, tid, text, days in turns_of(corpus):
        docs[ws].append((tid, {"primary": Counter(analyze(text)), "citations": Counter(analyze(tid))}, days))
    now = dt.datetime.now(dt.UTC)
    queries = [{"workspace": q["workspace"], "text": render(q["text"], now),
                "relevant": q["evidence"], "type": q["type"]} for q in corpus["questions"]]
    return docs, queries


WEIGHTS = {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}


def rank_all(docs: list[Doc], terms: list[str], *, k1: float, b: float,
             weights: dict[str, float]) -> list[tuple[str, float]]:
    """Every matching document with its raw BM25 score, best first (the semantic profile's lexical list)."""
    ranked = rank(docs, terms, k1=k1, b=b, weights=weights, lexical_weight=1.0, limit=None, with_scores=True)
    return ranked  # type: ignore[return-value]


def rank(docs: list[Doc], terms: list[str], *, k1: float, b: float, weights: dict[str, float],
         lexical_weight: float, half_life_days: float = 30.0, limit: int | None = 10,
         with_scores: bool = False) -> list[Any]:
    n = len(docs)
    avg: dict[str, float] = defaultdict(float)
    present: dict[str, int] = defaultdict(int)
    for _, fields, _ in docs:
        for f, c in fields.items():
            avg[f] += sum(c.values())
            present[f] += 1
    avg = {f: avg[f] / present[f] for f in avg}
    uniq = sorted(set(terms))
    df = {t: sum(1 for _, fields, _ in docs if any(t in c for c in fields.values())) for t in uniq}
    idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items() if d}
    scores = []
    for rid, fields, days in docs:
        s = 0.0
        for t, w_idf in idf.items():
            for f, c in fields.items():
                tf = c.get(t, 0)
                if tf:
                    norm = k1 * (1 - b + b * sum(c.values()) / avg[f])
                    s += weights.get(f, 0.0) * (k1 + 1) * tf / (tf + norm) * w_idf
        if s > 0:
            scores.append((rid, s, days))
    if not scores:
        return []
    best = max(s for _, s, _ in scores)
    ranked = [(rid, lexical_weight * s / best + (1 - lexical_weight) * 0.5 ** (days / half_life_days), -days, s)
              for rid, s, days in scores]
    ranked.sort(key=lambda r: (-round(r[1], 9), -r[2], r[0]))
    if with_scores:  # raw BM25
        return [(r[0], r[3]) for r in ranked[:limit]]
    return [r[0] for r in ranked[:limit]]


def evaluate(which: str, index_analyzer: Callable[[str], list[str]], query_analyzer: Callable[[str], list[str]],
             **params: Any) -> dict[str, Any]:
    docs, queries = (synthetic if which == "synthetic" else conversations)(index_analyzer)
    ranked = [rank(docs[q["workspace"]], query_analyzer(q["text"]), **params) for q in queries]
    out = {"all": metrics(ranked, [q["relevant"] for q in queries])}
    for t in sorted({q["type"] for q in queries}):
        idx = [i for i, q in enumerate(queries) if q["type"] == t]
        out[t] = metrics([ranked[i] for i in idx], [queries[i]["relevant"] for i in idx])["recall@10"]
    return out


def summary(which: str, m: dict[str, Any]) -> str:
    """One harness's figures on one line: recall@10 and MRR, and per question type for the
    conversations (what every tuning script prints)."""
    return (f"{which[:5]} R@10 {m['all']['recall@10']:.3f} MRR {m['all']['mrr@10']:.3f}"
            + ("" if which == "synthetic" else " " + " ".join(
                f"{t[:6]} {v:.2f}" for t, v in m.items() if t != "all")))


def main() -> int:
    analyzers: dict[str, tuple[Callable[[str], list[str]], Callable[[str], list[str]]]] = {
        "v1 tokens": (lexical.tokenize, lexical.tokenize),
    }
    import Stemmer

    stem = Stemmer.Stemmer("english").stemWords
    stop, qwords = lexical.STOP_WORDS, lexical.STOP_WORDS | lexical.QUERY_WORDS

    def drop(words: frozenset[str]) -> Callable[[str], list[str]]:
        return lambda s: [t for t in lexical.tokenize(s) if t not in words]

    def stemmed(f: Callable[[str], list[str]]) -> Callable[[str], list[str]]:
        return lambda s: stem(f(s))

    analyzers.update({
        "stop (index+query)": (drop(stop), drop(stop)),
        "stop (query only)": (lexical.tokenize, drop(stop)),
        "stem": (stemmed(lexical.tokenize), stemmed(lexical.tokenize)),
        "stem+stop (index+query)": (stemmed(drop(stop)), stemmed(drop(stop))),
        "stem+stop (query only)": (stemmed(lexical.tokenize), stemmed(drop(stop))),
        "stem+stop+qwords (index+query)": (stemmed(drop(stop)), stemmed(drop(qwords))),
    })
    if hasattr(lexical, "analyze"):
        analyzers["engram v2 (lexical.analyze)"] = (lexical.analyze, lexical.query_terms)
    grid = list(itertools.product((1.2,), (0.75,), (0.85,)))
    if "--grid" in sys.argv:
        grid = list(itertools.product((0.9, 1.2, 1.5), (0.5, 0.75, 0.9), (0.85, 0.95, 1.0)))
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name, (ia, qa) in analyzers.items():
        if only and not any(o in name for o in only):
            continue
        for k1, b, lw in grid:
            row = []
            for which in ("synthetic", "conversations"):
                m = evaluate(which, ia, qa, k1=k1, b=b, weights=WEIGHTS, lexical_weight=lw)
                row.append(summary(which, m))
            print(f"{name:34} k1 {k1} b {b} lw {lw}: " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
