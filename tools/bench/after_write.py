"""What a write costs the next search on the same core: one gRPC client alternates a search right
after a capture + admission it had acknowledged with a search when nothing was written since,
against ``engram serve`` over a copy of a loaded store (DuckDB).

    .venv/bin/python -m tools.bench.after_write --data DIR [--records 100000] [--baseline CHECKOUT]
                                                [--rounds 2] [--writes 40] [--out FILE]

``DIR`` is a store ``tools/bench_search.py`` loaded (scope bench/main, its queries); when it does
not exist yet, ``--records`` are loaded into it first the way that tool loads them. With ``--baseline``, that checkout's core (its stubs generated) runs on a copy of its own, and
the two alternate round by round, so drift of the machine falls on both alike. Reported per run:
p50/p90 of both kinds of search; their difference is what the write added (index maintenance,
statistics, caches the write invalidated).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench.corpus import PURPOSE, Corpus
from tools.bench.grpc_client import GrpcAgent
from tools.bench.machine import facts, loadavg
from tools.bench.report import print_and_save
from tools.bench.serving import Served

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: bench_search's loader and queries
from bench_search import QUERIES, bulk_load  # noqa: E402

from tools.bench.search_queries import TENANT, WORKSPACE  # noqa: E402


def load_store(data: Path, records: int) -> None:
    """``records`` accepted records in the bench scope of a new data directory, semantic channel off."""
    from agent import Agent

    from engram_core.app.composition import start_core

    running = start_core(data, semantic=False)
    try:
        Agent(running, TENANT, WORKSPACE).activate()
        bulk_load(running, records, distinct=min(2_000, records), batch=5_000, seed=7)
    finally:
        running.stop()


def _ready(agent: GrpcAgent, timeout_s: float = 120.0) -> None:
    """Until the core answers searches (it builds its index after it listens)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            agent.call("search", {"query": QUERIES[0], "purpose_ref": PURPOSE})
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _run(data: Path, tree: Path | None, writes: int, salt: str) -> dict[str, Any]:
    served = Served(data, semantic=False, tree=tree)
    corpus = Corpus()
    try:
        agent = GrpcAgent(served.address, data / "host.key", tenant=TENANT, workspace=WORKSPACE)
        try:
            _ready(agent)
            for q in QUERIES:  # warm every query's path
                agent.call("search", {"query": q, "purpose_ref": PURPOSE})
            after, quiet = [], []
            for i in range(2 * writes):
                if i % 2 == 0:
                    cap = agent.call("capture", corpus.capture_args(f"aw{salt}", i))
                    agent.call("request_admission", {"candidate_id": cap["candidate_id"],
                                                     "idempotency_key": f"bench-admission-aw{salt}-{i:08d}"})
                started = time.perf_counter()
                agent.call("search", {"query": QUERIES[i % len(QUERIES)], "purpose_ref": PURPOSE})
                (after if i % 2 == 0 else quiet).append((time.perf_counter() - started) * 1000)
        finally:
            agent.close()
    finally:
        served.stop()

    def p(values: list[float], q: float) -> float:
        return round(sorted(values)[min(len(values) - 1, int(len(values) * q))], 2)

    return {"after_a_write_p50_ms": round(statistics.median(after), 2), "after_a_write_p90_ms": p(after, 0.9),
            "nothing_new_p50_ms": round(statistics.median(quiet), 2), "nothing_new_p90_ms": p(quiet, 0.9),
            "write_adds_p50_ms": round(statistics.median(after) - statistics.median(quiet), 2), "searches": len(after)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a store tools/bench_search.py loaded (made if absent)")
    p.add_argument("--records", type=int, default=100_000, help="records loaded into a new --data")
    p.add_argument("--baseline", type=Path, help="another checkout to alternate with (before/after)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--writes", type=int, default=40, help="writes (and searches of each kind) per run")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if not (a.data / "engram.duckdb").exists():
        load_store(a.data, a.records)
    trees: list[tuple[str, Path | None]] = [("this checkout", None)]
    if a.baseline:
        trees.insert(0, ("baseline", a.baseline))
    work = Path(tempfile.mkdtemp(prefix="engram-after-write-"))
    summary: dict[str, Any] = {"machine": facts(), "loadavg_before": loadavg(), "runs": []}
    try:
        copies = {}
        for label, _ in trees:  # each tree writes to a store of its own
            copies[label] = work / label.replace(" ", "-")
            shutil.copytree(a.data, copies[label])
        salt = str(int(time.time()))
        for r in range(a.rounds):
            for label, tree in trees if r % 2 == 0 else trees[::-1]:
                result = {"tree": label, "round": r, **_run(copies[label], tree, a.writes, f"{salt}{r}")}
                summary["runs"].append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary["loadavg_after"] = loadavg()
    print_and_save(summary, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
