"""The core alone on the shapes of issue 63 (broad, long, narrow searches), in process.

    .venv/bin/python -m tools.bench.broad_inprocess --data DIR [--tree CHECKOUT] [--runs 4] [--profile] [--clients N]

``DIR`` is a data directory ``tools.bench.broad`` loaded (``--keep-data``, or
``tools.bench.broad_corpus.load``). Each run is a fresh process doing the servicer's per-call
steps (verify the signed context, request proto -> JSON, the read service's search, the response
JSON -> proto) for every shape; with ``--tree`` another checkout's core is measured too, each
run alternated with this one's, so a before/after is a ratio within one run. ``--profile`` adds
a cProfile breakdown per shape (tools.bench.profiling's categories) and the ranking's own share.
``--clients N`` searches from N threads at once (the reads' audit rows group-commit): each
shape's throughput (``per_s``) beside the latencies.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def worker(data: Path, *, rounds: int, shapes: list[str], profile: bool, records: int,
           clients: int = 1, queries_per_shape: int = 40) -> dict[str, Any]:
    # Run as a script: engram_core from the checkout PYTHONPATH names (imported before this
    # checkout goes first on the path, or --tree would measure this checkout's core twice); these
    # tools from this one.
    import engram_core

    sys.path.insert(0, str(REPO))
    import cProfile
    import pstats

    from engram_core.api import memory_pb2
    from engram_core.app.composition import open_core
    from engram_core.rpc.convert import message_of, message_to_value, value_to_message
    from engram_core.services.memory import MemoryService
    from engram_core.trust.hostctx import make_context, verify_context
    from engram_core.trust.hostkeys import load_private_key_file
    from tools.bench.broad_corpus import TENANT, WORKSPACE, BroadCorpus
    from tools.bench.corpus import PURPOSE
    from tools.bench.stats import percentile

    core, host_key_path, _ = open_core(data, semantic=False)
    memory = MemoryService(core)
    key = load_private_key_file(host_key_path)
    corpus = BroadCorpus()

    def search(query: str) -> dict[str, Any]:
        signed = make_context(key, call="engram_memory_search", tenant=TENANT, workspace=WORKSPACE,
                              principal="user:bench", agent_id="agent-bench", session="bench", purpose_ref=PURPOSE,
                              now_ms=time.time_ns() // 1_000_000, memory_enabled=True)
        ctx = verify_context(signed, core.trusted, now_ms=core.now_ms())
        request = value_to_message({"query": query, "purpose_ref": PURPOSE, "limit": 10}, memory_pb2.SearchRequest())
        result = memory.search(ctx, message_to_value(request))
        message_of(result, memory_pb2.SearchResponse)  # the servicer's reply
        return result

    out: dict[str, Any] = {"code": str(Path(engram_core.__file__).resolve().parents[1]), "shapes": {}}
    try:
        for shape in shapes:
            queries = corpus.shape_queries(shape, queries_per_shape, records)
            first = None
            for q in queries[:8]:  # warm-up: the thesaurus's and the index's first touches
                first = first or search(q)
            lat: list[float] = []
            started = time.perf_counter()
            if clients == 1:
                for _ in range(rounds):
                    for q in queries:
                        t = time.perf_counter()
                        search(q)
                        lat.append((time.perf_counter() - t) * 1000)
            else:  # concurrent searchers, as a server's threads serve several agents
                def timed(q: str) -> float:
                    t = time.perf_counter()
                    search(q)
                    return (time.perf_counter() - t) * 1000

                with ThreadPoolExecutor(clients) as pool:
                    lat = list(pool.map(timed, [q for _ in range(rounds) for q in queries]))
            wall = time.perf_counter() - started
            lat.sort()
            fig: dict[str, Any] = {"p50_ms": round(percentile(lat, 50), 3), "p90_ms": round(percentile(lat, 90), 3),
                                   "mean_ms": round(sum(lat) / len(lat), 3), "searches": len(lat),
                                   "per_s": round(len(lat) / wall, 1), "clients": clients,
                                   "candidates_first_query": (first or {}).get("rank_receipt", {}).get(
                                       "candidate_count")}
            if profile:
                from tools.bench.profiling import breakdown

                prof = cProfile.Profile()
                prof.enable()
                for q in queries:
                    search(q)
                prof.disable()
                fig["profile"] = breakdown(pstats.Stats(prof), len(queries))
            out["shapes"][shape] = fig
    finally:
        core.close()
    out["loadavg"] = os.getloadavg()[0]
    return out


def run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "ENGRAM_SEMANTIC": "off"}
    argv = [sys.executable, __file__, "--worker", "--data", str(args.data), "--rounds", str(args.rounds),
            "--shapes", args.shapes, "--records", str(args.records), "--clients", str(args.clients),
            "--queries", str(args.queries)]
    argv += ["--profile"] if args.profile else []
    out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker for {tree} failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.broad_inprocess", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--records", type=int, default=None, help="records loaded (default: the scope's count)")
    ap.add_argument("--tree", type=Path, help="another checkout, measured alternately with this one")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="passes over each shape's queries")
    ap.add_argument("--queries", type=int, default=40,
                    help="queries per shape (default 40; fewer only for a smoke, the figures get noisy)")
    ap.add_argument("--shapes", default=",".join(("broad", "long", "narrow")))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--clients", type=int, default=1, help="concurrent searchers (threads of one core)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.records is None:
        args.records = _records_of(args.data)
    if args.worker:
        print(json.dumps(worker(args.data, rounds=args.rounds, shapes=args.shapes.split(","), profile=args.profile,
                                records=args.records, clients=args.clients, queries_per_shape=args.queries)))
        return 0
    trees = {"before": args.tree.resolve(), "this": REPO} if args.tree else {"this": REPO}
    report: dict[str, Any] = {"data": str(args.data), "records": args.records, "rounds": args.rounds,
                              "queries": args.queries, "runs": {name: [] for name in trees}}
    for i in range(args.runs):
        for name, tree in trees.items():
            figures = run(tree, args)
            report["runs"][name].append(figures)
            print(f"run {i + 1} {name:6} " + "  ".join(f"{s} p50 {f['p50_ms']:7.3f} ms {f['per_s']:6.1f}/s"
                                                       for s, f in figures["shapes"].items())
                  + f"  (load {figures['loadavg']:.2f})", flush=True)
    summary: dict[str, Any] = {}
    for name, runs in report["runs"].items():
        summary[name] = {s: round(statistics.median(r["shapes"][s]["p50_ms"] for r in runs), 3)
                         for s in runs[0]["shapes"]}
    if "before" in summary:
        # A ratio per run (the runs alternate: each pair shares the machine's state), then their median.
        summary["before_over_this"] = {
            s: round(statistics.median(b["shapes"][s]["p50_ms"] / t["shapes"][s]["p50_ms"] for b, t in
                                       zip(report["runs"]["before"], report["runs"]["this"], strict=True)), 2)
            for s in summary["this"]}
        summary["this_over_before_per_s"] = {
            s: round(statistics.median(t["shapes"][s]["per_s"] / b["shapes"][s]["per_s"] for b, t in
                                       zip(report["runs"]["before"], report["runs"]["this"], strict=True)), 2)
            for s in summary["this"]}
    report["median_p50_ms"] = summary
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _records_of(data: Path) -> int:
    """The measured scope's record count (long queries are texts of records 0..N-1)."""
    marker = data / "broad-records"
    if marker.exists():
        return int(marker.read_text())
    raise SystemExit(f"{data}: no broad-records marker; pass --records N")


if __name__ == "__main__":
    raise SystemExit(main())
