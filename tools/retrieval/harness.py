"""Retrieval-quality harness: loads tools/retrieval/corpus.json through the real service
(gRPC, start_core: capture, admission, host supersession, confirmed forget) and reports
recall@5, recall@10 and MRR@10 per channel (labelled with the profile the rank receipt names),
beside BM25 baselines over the same eligible documents: ``rank_bm25`` (BM25Okapi, plain Unicode
word tokens) and ``bm25s`` (its English stop words, Snowball stemmer).

Run: ``.venv/bin/python tools/retrieval/harness.py [--json OUT]``. Also checks that no
superseded or forgotten memory is ever returned ("leaks", must be 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import DAY_MS, Agent, now_ms  # noqa: E402

from engram_core.app.composition import start_core  # noqa: E402
from engram_core.services.lexical import tokenize  # noqa: E402

CORPUS = Path(__file__).with_name("corpus.json")
TENANT = "harness"


def metrics(ranked: list[list[str]], relevant: list[list[str]]) -> dict[str, float]:
    """Mean recall@5, recall@10 and MRR@10 over queries with at least one relevant id."""
    r5 = r10 = mrr = 0.0
    n = 0
    for got, rel in zip(ranked, relevant, strict=True):
        if not rel:
            continue
        n += 1
        r5 += len(set(got[:5]) & set(rel)) / len(rel)
        r10 += len(set(got[:10]) & set(rel)) / len(rel)
        mrr += next((1 / (i + 1) for i, g in enumerate(got[:10]) if g in rel), 0.0)
    return {"recall@5": round(r5 / n, 4), "recall@10": round(r10 / n, 4), "mrr@10": round(mrr / n, 4), "queries": n}


def bm25_baseline(corpus: dict[str, Any], excluded: set[str]) -> list[list[str]]:
    from rank_bm25 import BM25Okapi

    by_ws: dict[str, tuple[list[str], Any]] = {}
    for ws in corpus["workspaces"]:
        docs = [m for m in corpus["memories"] if m["workspace"] == ws and m["id"] not in excluded]
        tokens = [tokenize(" ".join((m["text"], m["context"], m["source_ref"]))) for m in docs]
        by_ws[ws] = ([m["id"] for m in docs], BM25Okapi(tokens))
    out = []
    for q in corpus["queries"]:
        ids, model = by_ws[q["workspace"]]
        scores = model.get_scores(tokenize(q["text"]))
        order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
        out.append([ids[i] for i in order[:10] if scores[i] > 0])
    return out


def bm25s_baseline(corpus: dict[str, Any], excluded: set[str]) -> list[list[str]]:
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    by_ws: dict[str, tuple[list[str], Any]] = {}
    for ws in corpus["workspaces"]:
        docs = [m for m in corpus["memories"] if m["workspace"] == ws and m["id"] not in excluded]
        r = bm25s.BM25()
        r.index(bm25s.tokenize([" ".join((m["text"], m["context"], m["source_ref"])) for m in docs],
                               stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
        by_ws[ws] = ([m["id"] for m in docs], r)
    out = []
    for q in corpus["queries"]:
        ids, r = by_ws[q["workspace"]]
        docs_, scores = r.retrieve(bm25s.tokenize([q["text"]], stopwords="en", stemmer=stemmer, show_progress=False),
                                   k=min(10, len(ids)), show_progress=False)
        out.append([ids[d] for d, s in zip(docs_[0], scores[0], strict=True) if s > 0])
    return out


def run(data_dir: Path) -> dict[str, Any]:
    corpus = json.loads(CORPUS.read_text())
    running = start_core(data_dir, semantic=True)
    try:
        agents = {ws: Agent(running, TENANT, ws) for ws in corpus["workspaces"]}
        for a in agents.values():
            a.activate()
        t0 = time.perf_counter()
        ids: dict[str, str] = {}
        base = now_ms()
        for m in corpus["memories"]:
            ids[m["id"]] = agents[m["workspace"]].remember(
                m["id"], m["text"], m["context"], m["source_ref"], t=base - m["days_ago"] * DAY_MS, kind=m["kind"])
        ws_of = {m["id"]: m["workspace"] for m in corpus["memories"]}
        for s in corpus["supersessions"]:
            agents[ws_of[s["old"]]].supersede(ids[s["old"]], ids[s["new"]])
        for f in corpus["forgotten"]:
            agents[ws_of[f]].forget(ids[f])
        load_s = time.perf_counter() - t0
        back = {v: k for k, v in ids.items()}
        relevant = [q["relevant"] for q in corpus["queries"]]
        report: dict[str, Any] = {"memories": len(corpus["memories"]), "queries": len(corpus["queries"]),
                                  "load_seconds": round(load_s, 1), "profiles": {}}
        for channel, semantic in (("lexical", False), ("lexical_and_semantic", True)):
            ranked, leaks, latencies = [], 0, []
            for q in corpus["queries"]:
                t = time.perf_counter()
                res = agents[q["workspace"]].search(q["text"], semantic=semantic)
                latencies.append(time.perf_counter() - t)
                receipt = res["rank_receipt"]
                name = f"{channel} ({receipt['profile']} v{receipt['profile_version']})"
                got = [back[p["record"]["record_id"]] for p in res["records"]]
                leaks += len(set(got) & set(q["must_not"]))
                ranked.append(got)
            latencies.sort()
            report["profiles"][name] = {**metrics(ranked, relevant), "leaks": leaks,
                                        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1)}
        excluded = {s["old"] for s in corpus["supersessions"]} | set(corpus["forgotten"])
        report["profiles"]["rank_bm25 BM25Okapi (baseline)"] = metrics(bm25_baseline(corpus, excluded), relevant)
        report["profiles"]["bm25s, stop words + Snowball (baseline)"] = metrics(bm25s_baseline(corpus, excluded),
                                                                                relevant)
        return report
    finally:
        running.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the report here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="engram-harness-") as tmp:
        report = run(Path(tmp) / "data")
    print(f"{report['memories']} memories, {report['queries']} queries, loaded in {report['load_seconds']} s")
    print(f"{'profile':40} {'recall@5':>9} {'recall@10':>10} {'MRR@10':>8} {'leaks':>6}")
    for name, m in report["profiles"].items():
        print(f"{name:40} {m['recall@5']:>9} {m['recall@10']:>10} {m['mrr@10']:>8} {m.get('leaks', '-'):>6}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
