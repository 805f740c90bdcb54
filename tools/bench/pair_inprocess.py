"""Capture + admission pairs in process, the core alone (issue 63): p50, CPU per pair, and with
``--profile SORT`` a cProfile listing.

    .venv/bin/python -m tools.bench.pair_inprocess --data DIR [--pairs 40] [--tree CHECKOUT --runs 4]
                                                   [--profile tottime]

``DIR``: a data directory ``tools.bench.broad_corpus.load`` made; every run writes its pairs into
a fresh copy of it (``DIR`` itself is never written). Each pair signs and verifies a fresh host
context per call, as the servicer receives it, and the admission must accept. Each run is a
process of its own; with ``--tree`` another checkout's core (its stubs built) runs too, the two
alternated run by run, and the report gives the ratio of each alternated pair of runs (the
machine's speed moves between runs, a ratio within a pair of neighbouring runs far less).
``cpu_per_pair_ms`` is the process's CPU over all the pairs and a read after them, divided by the
pairs: a core that answers writes before its database commits them (DuckDB's intent log) commits
them at that read, so their commit is counted, which a per-pair p50 would leave out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def worker(data: Path, *, pairs: int, profile: str | None) -> dict[str, Any]:
    # Run as a script: engram_core from the checkout PYTHONPATH names (imported before this
    # checkout goes first on the path, or --tree would measure this checkout's core twice);
    # these tools from this one.
    import engram_core

    sys.path.insert(0, str(REPO))
    import cProfile
    import pstats

    from engram_core.app.composition import open_core
    from engram_core.services.memory import MemoryService
    from engram_core.trust.hostctx import make_context, verify_context
    from engram_core.trust.hostkeys import load_private_key_file
    from tools.bench.broad_corpus import TENANT, WORKSPACE, BroadCorpus
    from tools.bench.corpus import PURPOSE

    core, host_key_path, _ = open_core(data, semantic=False)
    memory = MemoryService(core)
    key = load_private_key_file(host_key_path)
    corpus = BroadCorpus()

    def ctx(call: str) -> Any:
        signed = make_context(key, call=call, tenant=TENANT, workspace=WORKSPACE, principal="user:bench",
                              agent_id="agent-bench", session="bench", purpose_ref=PURPOSE,
                              now_ms=time.time_ns() // 1_000_000, memory_enabled=True)
        return verify_context(signed, core.trusted, now_ms=core.now_ms())

    salt = f"p{os.getpid()}-{time.time_ns()}"

    def pair(i: int) -> None:
        cap = memory.capture(ctx("engram_memory_capture"), corpus.capture_args(salt, i), None)
        out = memory.request_admission(ctx("engram_memory_request_admission"),
                                       {"candidate_id": cap["candidate_id"], "idempotency_key": f"adm-{salt}-{i}"},
                                       None)
        assert out["outcome"].get("record_id"), out

    lat, cpu = [], []
    prof = cProfile.Profile() if profile else None
    try:
        for i in range(5):  # warm-up
            pair(i)
        with core.store.read():  # the warm-up's writes in the database: the loop starts level
            pass
        if prof:
            prof.enable()
        loop_cpu0 = time.process_time()
        for i in range(5, 5 + pairs):
            started, cpu0 = time.perf_counter(), time.process_time()
            pair(i)
            lat.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu0) * 1000)
        # A reader commits what the pairs left answered but not yet in the database (DuckDB's
        # intent log): part of what they cost, which a per-pair p50 would leave out.
        with core.store.read():
            pass
        loop_cpu = (time.process_time() - loop_cpu0) * 1000
        if prof:
            prof.disable()
    finally:
        core.close()
    if prof:
        pstats.Stats(prof, stream=sys.stderr).sort_stats(profile).print_stats(40)
    return {"code": str(Path(engram_core.__file__).resolve().parents[1]), "pairs": len(lat),
            "p50_ms": round(statistics.median(lat), 3), "cpu_p50_ms": round(statistics.median(cpu), 3),
            "cpu_mean_ms": round(statistics.fmean(cpu), 3), "cpu_per_pair_ms": round(loop_cpu / len(lat), 3),
            "loadavg": os.getloadavg()[0]}


def run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``tree``'s core in a process of its own, on a fresh copy of the data."""
    with tempfile.TemporaryDirectory(prefix="pair-inprocess-") as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(args.data, data)
        env = {**os.environ, "PYTHONPATH": str(tree), "ENGRAM_SEMANTIC": "off"}
        argv = [sys.executable, __file__, "--worker", "--data", str(data), "--pairs", str(args.pairs)]
        if args.profile:
            argv += ["--profile", args.profile]
        out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker for {tree} failed: {out.stderr[-3000:]}")
    if args.profile:
        print(out.stderr, flush=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.pair_inprocess", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--tree", type=Path, help="another checkout, measured alternately with this one")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--profile", default=None, help="a pstats sort key: print the profile")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.data, pairs=args.pairs, profile=args.profile)))
        return 0
    trees = {"before": args.tree.resolve(), "this": REPO} if args.tree else {"this": REPO}
    report: dict[str, Any] = {"data": str(args.data), "pairs": args.pairs, "runs": {name: [] for name in trees}}
    for i in range(args.runs):
        for name, tree in trees.items():
            figures = run(tree, args)
            report["runs"][name].append(figures)
            print(f"run {i + 1} {name:6} pairs {figures['pairs']}  p50 {figures['p50_ms']:.3f} ms  "
                  f"CPU p50 {figures['cpu_p50_ms']:.3f} ms  CPU a pair, all in {figures['cpu_per_pair_ms']:.3f} ms  "
                  f"(load {figures['loadavg']:.2f})", flush=True)
    summary: dict[str, Any] = {name: {k: round(statistics.median(r[k] for r in runs), 3)
                                      for k in ("p50_ms", "cpu_p50_ms", "cpu_mean_ms", "cpu_per_pair_ms")}
                               for name, runs in report["runs"].items()}
    if "before" in summary:
        # A ratio per alternated pair of runs, then their median and range.
        for k in ("p50_ms", "cpu_p50_ms", "cpu_per_pair_ms"):
            ratios = [b[k] / t[k] for b, t in zip(report["runs"]["before"], report["runs"]["this"], strict=True)]
            summary[f"before_over_this_{k}"] = {"median": round(statistics.median(ratios), 2),
                                                "min": round(min(ratios), 2), "max": round(max(ratios), 2)}
    report["summary"] = summary
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
