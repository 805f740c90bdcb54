"""Offline sweep of the semantic profile's fusion on both retrieval corpora, without the core.

The lexical list is the core's v2 lexical ranking (tune_lexical.rank_all: same analyzer, BM25
parameters and field weights); the vector list is cosine similarity of the core's own embedding
model (what admission embeds: the components' texts joined by newlines). Fusion is the core's
(engram_core/services/reading.fuse): weighted reciprocal rank, normalized to the best, 0.85 fused +
0.15 recency. Vectors are cached in a temporary directory between runs.

Run: ``.venv/bin/python tools/retrieval/tune_fusion.py [--model NAME]``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CORPUS as SYNTHETIC  # noqa: E402
from harness import metrics  # noqa: E402
from harness_conversations import CORPUS as CONVERSATIONS  # noqa: E402
from harness_conversations import turns_of  # noqa: E402
from tune_lexical import WEIGHTS, conversations, rank_all, synthetic  # noqa: E402

from engram_core.services import lexical  # noqa: E402
from engram_core.services.ranking import OFFLINE_LEXICAL_V2  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / "engram-tune-fusion"


def embed_texts(embedder: Any, texts: list[str], tag: str) -> np.ndarray:
    key = hashlib.sha256((tag + "\0" + "\0".join(texts)).encode()).hexdigest()[:24]
    path = CACHE / f"{key}.npy"
    if path.exists():
        return np.load(path)
    CACHE.mkdir(exist_ok=True)
    out = np.asarray([v for i in range(0, len(texts), 32) for v in embedder.embed_batch(texts[i:i + 32])])
    np.save(path, out)
    return out


def doc_texts(which: str) -> dict[str, str]:
    if which == "synthetic":
        corpus = json.loads(SYNTHETIC.read_text())
        return {m["id"]: m["text"] + "\n" + m["context"] for m in corpus["memories"]}
    return {tid: text for _ws, tid, text, _d in turns_of(json.loads(CONVERSATIONS.read_text()))}


def fuse(lex: list[tuple[str, float]], vec: list[tuple[str, float]], days: dict[str, int], *, k: int, wl: float,
         wv: float, depth: int, min_sim: float, lw: float = 0.85, mode: str = "rrf") -> list[str]:
    fused: dict[str, float] = {}
    vec = [v for v in vec if v[1] >= min_sim][:depth]
    if mode == "rrf":
        for w, ranked in ((wl, lex[:depth]), (wv, vec)):
            for r, (rid, _s) in enumerate(ranked, start=1):
                fused[rid] = fused.get(rid, 0.0) + w / (k + r)
    else:  # convex combination of the lexical score (over its best) and the cosine similarity
        top = lex[0][1] if lex else 1.0
        for rid, s in lex[:depth]:
            fused[rid] = wl * s / top
        for rid, s in vec:
            fused[rid] = fused.get(rid, 0.0) + wv * s
    if not fused:
        return []
    best = max(fused.values())
    scored = sorted(fused, key=lambda rid: (-round(lw * fused[rid] / best + (1 - lw) * 0.5 ** (days[rid] / 30), 9),
                                            days[rid], rid))
    return scored[:10]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm", help="minilm (the core's) or another local embedder name")
    ap.add_argument("--quick", action="store_true", help="only small k, equal weights, the profile's recency")
    args = ap.parse_args()
    from engram_core.embedding.onnx_minilm import load_local_embedder

    embedder = load_local_embedder()
    p = OFFLINE_LEXICAL_V2
    for which in ("synthetic", "conversations"):
        docs, queries = (synthetic if which == "synthetic" else conversations)(lexical.analyze)
        texts = doc_texts(which)
        t0 = time.perf_counter()
        ids = sorted(texts)
        matrix = embed_texts(embedder, [texts[i] for i in ids], f"{args.model}-docs")
        qmat = embed_texts(embedder, [q["text"] for q in queries], f"{args.model}-queries")
        row = {rid: n for n, rid in enumerate(ids)}
        print(f"{which}: embedded in {time.perf_counter() - t0:.1f} s", flush=True)
        days = {d[0]: d[2] for ws in docs.values() for d in ws}
        lex_lists, vec_lists = [], []
        for qi, q in enumerate(queries):
            ws_docs = docs[q["workspace"]]
            lex_lists.append(rank_all(ws_docs, lexical.query_terms(q["text"]), k1=p.k1, b=p.b, weights=WEIGHTS))
            sims = matrix[[row[d[0]] for d in ws_docs]] @ qmat[qi]
            order = np.argsort(-sims, kind="stable")
            vec_lists.append([(ws_docs[i][0], float(sims[i])) for i in order[:200]])
        relevant = [q["relevant"] for q in queries]
        lex_only = [[rid for rid, _ in lst][:10] for lst in lex_lists]
        vec_only = [[rid for rid, _ in lst][:10] for lst in vec_lists]
        print(f"  lexical alone (raw BM25 order) {metrics(lex_only, relevant)}")
        print(f"  vector alone                   {metrics(vec_only, relevant)}")
        grid = [("rrf", k, w, d, ms, lw) for k, w, d, ms, lw in itertools.product(
            (1, 2, 3, 5, 10, 20, 60), ((1, 1), (1, 1.5), (1.5, 1)), (50, 100), (0.1, 0.2, 0.3), (0.85, 1.0))]
        grid += [("score", 0, w, 100, ms, lw) for w, ms, lw in itertools.product(
            ((1, 1), (1, 2), (2, 1)), (0.0, 0.2, 0.3), (0.85, 1.0))]
        if "--quick" in sys.argv:
            grid = [g for g in grid if g[0] == "rrf" and g[1] <= 10 and g[2] == (1, 1) and g[5] == 0.85]
        for mode, k, (wl, wv), depth, min_sim, lw in grid:
            ranked = [fuse(lex, vec, days, k=k, wl=wl, wv=wv, depth=depth, min_sim=min_sim, lw=lw, mode=mode)
                      for lex, vec in zip(lex_lists, vec_lists, strict=True)]
            m = metrics(ranked, relevant)
            print(f"  {mode:5} k {k:>2} wl {wl} wv {wv} depth {depth:>3} min_sim {min_sim} lw {lw}: "
                  f"R@5 {m['recall@5']:.3f} R@10 {m['recall@10']:.3f} MRR {m['mrr@10']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
