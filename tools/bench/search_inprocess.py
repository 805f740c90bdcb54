"""Search latency in process: what a search costs the core without gRPC, the client or scheduling.

The servicer's per-call steps (verify the signed context, the request proto -> JSON, the read
service's search, the response JSON -> proto) on a data directory that ``tools/bench_search.py``
loaded, 16 queries per round, in a fresh process per run. Through gRPC on this shared 2-core VM
the same code's p50 moves by 2-3 ms from one served process to the next; in process it moves by
a few tenths, so a change costing 0.2 ms is visible here and not there.

``--tree CHECKOUT`` measures another checkout's core too (its stubs built), alternated with this
one's, each run in its own process: a before/after in one run::

    .venv/bin/python -m tools.bench.search_inprocess --data DIR --tree ../before --runs 4

Only lexical searches by default (``--semantic``: the fused profile, the served model loaded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def worker(data: Path, *, rounds: int, semantic: bool) -> dict[str, Any]:
    # Run as a script (``run``): its siblings come from this directory, engram_core from the
    # checkout PYTHONPATH names, which may predate these tools.
    from corpus import PURPOSE  # type: ignore[import-not-found]
    from search_queries import QUERIES, TENANT, WORKSPACE  # type: ignore[import-not-found]
    from stats import percentile  # type: ignore[import-not-found]

    import engram_core
    from engram_core.api import memory_pb2
    from engram_core.app.composition import open_core
    from engram_core.rpc.convert import message_of, message_to_value, value_to_message
    from engram_core.services.memory import MemoryService
    from engram_core.trust.hostctx import make_context, verify_context
    from engram_core.trust.hostkeys import load_private_key_file

    core, host_key_path, _ = open_core(data)
    memory = MemoryService(core)
    key = load_private_key_file(host_key_path)
    extra: dict[str, Any] = {}
    if semantic:
        extra["capability_policy"] = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}

    def search(query: str) -> dict[str, Any]:
        signed = make_context(key, call="engram_memory_search", tenant=TENANT, workspace=WORKSPACE,
                              principal="user:bench", agent_id="agent-bench", session="bench", purpose_ref=PURPOSE,
                              now_ms=time.time_ns() // 1_000_000, memory_enabled=True)
        ctx = verify_context(signed, core.trusted, now_ms=core.now_ms())
        request = value_to_message({"query": query, "purpose_ref": PURPOSE, "limit": 10, **extra},
                                   memory_pb2.SearchRequest())
        return memory.search(ctx, message_to_value(request))

    try:
        profile = ""
        for q in QUERIES:  # warm-up: the thesaurus's and the index's first touches
            profile = search(q)["rank_receipt"]["profile"]
        lat = []
        for _ in range(rounds):
            for q in QUERIES:
                t = time.perf_counter()
                result = search(q)
                message_of(result, memory_pb2.SearchResponse)  # the servicer's reply, not the client's read
                lat.append((time.perf_counter() - t) * 1000)
    finally:
        core.close()
    lat.sort()
    return {"code": str(Path(engram_core.__file__).resolve().parents[1]), "profile": profile,
            "p50_ms": round(percentile(lat, 50), 3), "p90_ms": round(percentile(lat, 90), 3),
            "mean_ms": round(sum(lat) / len(lat), 3), "searches": len(lat), "loadavg": os.getloadavg()[0]}


def run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "ENGRAM_SEMANTIC": "on" if args.semantic else "off"}
    argv = [sys.executable, __file__, "--worker", "--data", str(args.data),
            "--rounds", str(args.rounds)] + (["--semantic"] if args.semantic else [])
    out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker for {tree} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a data directory tools/bench_search.py loaded")
    ap.add_argument("--tree", type=Path, help="another checkout, measured alternately with this one")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--semantic", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.data, rounds=args.rounds, semantic=args.semantic)))
        return 0
    from tools.bench.search_queries import QUERIES

    trees = {"tree": args.tree.resolve(), "this": REPO} if args.tree else {"this": REPO}
    report: dict[str, Any] = {"data": str(args.data), "rounds": args.rounds, "queries": len(QUERIES),
                              "cpus": os.cpu_count(),
                              "semantic": args.semantic, "runs": {name: [] for name in trees}}
    for i in range(args.runs):
        for name, tree in trees.items():
            figures = run(tree, args)
            report["runs"][name].append(figures)
            print(f"run {i + 1} {name:4} {figures['profile']:20} p50 {figures['p50_ms']:6.3f} ms "
                  f"mean {figures['mean_ms']:6.3f} ms (load {figures['loadavg']:.2f})", flush=True)
    for name, runs in report["runs"].items():
        report[f"{name}_median_p50_ms"] = median = round(statistics.median(r["p50_ms"] for r in runs), 3)
        print(f"{name}: median p50 {median:.3f} ms over {len(runs)} runs")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
