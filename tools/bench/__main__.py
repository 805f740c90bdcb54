"""Engram service benchmark (issue 8).

    .venv/bin/python -m tools.bench              # 1k, 10k, 100k records; gRPC, MCP, peer, profile
    .venv/bin/python -m tools.bench --quick      # 1k and 10k, shorter runs
    .venv/bin/python -m tools.bench --sizes 200 --clients 1,2 --runs 1 --duration 0.3 --no-peer --no-mcp

For each size: load N accepted records into one scope (plus other scopes) in-process
(see loader.py), serve the data directory with ``engram serve`` in its own process,
then measure capture, request_admission, search (lexical, semantic), get and forget
through gRPC and through MCP (``engram mcp`` over stdio, the official SDK client) with
1, 4 and 16 concurrent clients; warm-up first, several runs, medians with min/max.
The secret scanner's case (tools/bench/scanner.py) runs in-process after the sizes.
Then profile the same operations in-process. Results: JSON in --out
(default tools/bench/results/<timestamp>/), summary.json plus raw.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, FORGET_TOOL, GET_TOOL, SEARCH_TOOL
from tools.bench import machine
from tools.bench.corpus import PURPOSE, Corpus
from tools.bench.loader import Progress, activate_scope, load_scope
from tools.bench.serving import Served
from tools.bench.stats import combine
from tools.bench.workload import run_tasks, run_threads

REPO = Path(__file__).resolve().parents[2]
TENANT, WORKSPACE = "bench", "main"
SEMANTIC = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="sizes 1k,10k; 2 runs of 1.5 s; peer at 1k,10k")
    p.add_argument("--sizes", default=None,
                   help="comma-separated record counts (default 1000,10000,100000; 'none' with --merge re-measures only the peer)")
    p.add_argument("--clients", default="1,4,16", help="concurrent clients (default 1,4,16)")
    p.add_argument("--runs", type=int, default=None, help="measured runs per point (default 3; quick 2)")
    p.add_argument("--duration", type=float, default=None, help="seconds per run per point (default 3; quick 1.5)")
    p.add_argument("--other-scopes", type=int, default=3, help="extra scopes holding N/20 records each (default 3)")
    p.add_argument("--semantic-max", type=int, default=10000,
                   help="embed records only for sizes up to this (embedding is the slowest part of loading)")
    p.add_argument("--peer-sizes", default=None, help="peer item counts (default 1000,10000,100000; quick 1000,10000)")
    p.add_argument("--no-grpc", action="store_true")
    p.add_argument("--no-mcp", action="store_true")
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--profile-calls", type=int, default=40)
    p.add_argument("--no-scanner", action="store_true", help="skip the secret scanner case (tools/bench/scanner.py)")
    p.add_argument("--scanner-sizes", default="1024,65536,1048576", help="UTF-8 bytes per scanned text")
    p.add_argument("--scanner-reps", type=int, default=30)
    p.add_argument("--out", default=None, help="results directory")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--merge", action="store_true",
                   help="update the sizes (and peer) measured now in an existing --out/summary.json, keep the rest")
    a = p.parse_args(argv)
    sizes = a.sizes or ("1000,10000" if a.quick else "1000,10000,100000")
    a.sizes = [] if sizes == "none" else [int(x) for x in sizes.split(",")]  # none: the peer only (with --merge)
    a.clients = [int(x) for x in a.clients.split(",")]
    a.runs = a.runs or (2 if a.quick else 3)
    a.duration = a.duration if a.duration is not None else (1.5 if a.quick else 3.0)
    a.peer_sizes = [int(x) for x in (a.peer_sizes or ("1000,10000" if a.quick else "1000,10000,100000")).split(",")]
    return a


# ---- serving -------------------------------------------------------------------------------


# ---- measured operations ---------------------------------------------------------------------


class Points:
    """Collects per-run summaries: surface -> op -> clients -> [run, ...]."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}

    def add(self, surface: str, clients: int, result: dict[str, Any]) -> None:
        for op, summary in result.items():
            self.data.setdefault(surface, {}).setdefault(op, {}).setdefault(str(clients), []).append(summary)

    def combined(self) -> dict[str, Any]:
        return {s: {op: {c: combine(runs) for c, runs in by_c.items()} for op, by_c in ops.items()}
                for s, ops in self.data.items()}


def grpc_phase(a: argparse.Namespace, served: Served, corpus: Corpus, record_ids: list[str], queries: list[str],
               semantic: bool, points: Points, size: int) -> None:
    from tools.bench.grpc_client import GrpcAgent

    agents = [GrpcAgent(served.address, served.key_path, tenant=TENANT, workspace=WORKSPACE,
                        principal=f"agent:bench-grpc-{c}", agent_id=f"bench-grpc-{c}") for c in range(max(a.clients))]
    pool: deque[str] = deque()
    seq = iter(range(10**9))
    rnd = random.Random(size)

    def pair(c: int, i: int):
        k = next(seq)
        t0 = time.perf_counter()
        cap = agents[c].call("capture", corpus.capture_args(f"grpc.{size}", k, key=f"bench-grpc-cap-{size}-{k:09d}"))
        t1 = time.perf_counter()
        adm = agents[c].call("request_admission", {"candidate_id": cap["candidate_id"],
                                                   "idempotency_key": f"bench-grpc-adm-{size}-{k:09d}"})
        t2 = time.perf_counter()
        if adm["outcome"]["status"] != "accepted":
            raise RuntimeError(adm["outcome"]["status"])
        pool.append((c, adm["outcome"]["record_id"]))
        return [("capture", t1 - t0), ("request_admission", t2 - t1)]

    def search(sem: bool):
        def go(c: int, i: int):
            args: dict[str, Any] = {"query": rnd.choice(queries), "purpose_ref": PURPOSE}
            if sem:
                args["capability_policy"] = SEMANTIC
            agents[c].call("search", args)
        return go

    def get(c: int, i: int):
        agents[c].call("get", {"record_id": rnd.choice(record_ids), "purpose_ref": PURPOSE})

    def forget(c: int, i: int):
        owner, rid = pool.popleft()
        r = agents[owner].call("forget", {"record_id": rid, "idempotency_key": f"bench-fgt-{rid}"[:200],
                                          "reason_ref": "reason:bench"}, confirm=True)
        if r["projection_invalidation"] != "complete":
            raise RuntimeError("forget incomplete")

    ops = [("pair", pair, a.duration), ("search_lexical", search(False), a.duration)]
    if semantic:
        ops.append(("search_semantic", search(True), a.duration))
    ops += [("get", get, a.duration), ("forget", forget, a.duration)]
    for _name, fn, _ in ops:  # warm-up, not recorded
        for _ in range(3):
            fn(0, 0)
    for run in range(a.runs):
        for clients in a.clients:
            for name, fn, dur in ops:
                # forget consumes records made by the pair phase; never more than it made.
                cap = max(1, len(pool) // clients) if name == "forget" else 10_000
                r = run_threads(name, fn, clients, duration_s=dur, min_ops=min(3, cap), max_ops=min(cap, 10_000))
                points.add("grpc", clients, r)
                log(f"grpc size={size} run={run + 1} clients={clients} {name}: "
                    + ", ".join(f"{k} p50={v['p50_ms']}ms {v['throughput_per_s']}/s" for k, v in r.items()))
    for ag in agents:
        ag.close()


async def mcp_phase(a: argparse.Namespace, served: Served, work: Path, corpus: Corpus, record_ids: list[str],
                    queries: list[str], semantic: bool, points: Points, size: int) -> None:
    from tools.bench.mcp_client import clients as open_clients
    from tools.bench.mcp_client import value_of, write_config

    configs = [write_config(work / f"mcp-{c}.toml", address=served.address, signing_key=served.key_path,
                            tenant=TENANT, workspace=WORKSPACE, n=c) for c in range(max(a.clients))]
    pool: deque[tuple[int, str]] = deque()
    seq = iter(range(10**9))
    rnd = random.Random(size + 1)
    log(f"mcp: starting {len(configs)} adapters")
    async with open_clients(configs) as cl:
        for c in cl:
            await c.list_tools()

        async def pair(c: int, i: int):
            k = next(seq)
            t0 = time.perf_counter()
            cap = value_of(await cl[c].call_tool(CAPTURE_TOOL, corpus.capture_args(
                f"mcp.{size}", k, key=f"bench-mcp-cap-{size}-{k:09d}")))
            t1 = time.perf_counter()
            adm = value_of(await cl[c].call_tool(ADMISSION_TOOL, {
                "candidate_id": cap["candidate_id"], "idempotency_key": f"bench-mcp-adm-{size}-{k:09d}"}))
            t2 = time.perf_counter()
            if adm["outcome"]["status"] != "accepted":
                raise RuntimeError(adm["outcome"]["status"])
            pool.append((c, adm["outcome"]["record_id"]))
            return [("capture", t1 - t0), ("request_admission", t2 - t1)]

        def search(sem: bool):
            async def go(c: int, i: int):
                args: dict[str, Any] = {"query": rnd.choice(queries), "purpose_ref": PURPOSE}
                if sem:
                    args["capability_policy"] = SEMANTIC
                value_of(await cl[c].call_tool(SEARCH_TOOL, args))
            return go

        async def get(c: int, i: int):
            value_of(await cl[c].call_tool(GET_TOOL, {"record_id": rnd.choice(record_ids),
                                                                 "purpose_ref": PURPOSE}))

        async def forget(c: int, i: int):
            owner, rid = pool.popleft()
            value_of(await cl[owner].call_tool(FORGET_TOOL, {
                "record_id": rid, "idempotency_key": f"bench-fgt-{rid}"[:200], "reason_ref": "reason:bench"}))

        ops = [("pair", pair), ("search_lexical", search(False))]
        if semantic:
            ops.append(("search_semantic", search(True)))
        ops += [("get", get), ("forget", forget)]
        for _name, fn in ops:
            for _ in range(3):
                await fn(0, 0)
        for run in range(a.runs):
            for clients in a.clients:
                for name, fn in ops:
                    cap = max(1, len(pool) // clients) if name == "forget" else 10_000
                    r = await run_tasks(name, fn, clients, duration_s=a.duration, min_ops=min(3, cap),
                                        max_ops=min(cap, 10_000))
                    points.add("mcp", clients, r)
                    log(f"mcp size={size} run={run + 1} clients={clients} {name}: "
                        + ", ".join(f"{k} p50={v['p50_ms']}ms {v['throughput_per_s']}/s" for k, v in r.items()))


# ---- one size --------------------------------------------------------------------------------


def bench_size(a: argparse.Namespace, size: int, corpus: Corpus, queries: list[str], work_root: Path) -> dict[str, Any]:
    from engram_core.app.composition import open_core

    work = Path(tempfile.mkdtemp(prefix=f"size{size}-", dir=work_root))
    data = work / "data"
    embed = size <= a.semantic_max
    result: dict[str, Any] = {"records": size}
    try:
        core, _, _ = open_core(data, semantic=None if embed else False)
        embed = embed and core.embedder is not None
        others = [f"other{k}" for k in range(a.other_scopes)]
        n_other = max(20, size // 20)
        total = size + n_other * len(others)
        bar = Progress(total, f"loading {size:,} (+{len(others)}x{n_other:,})", enabled=not a.no_progress)
        t0 = time.perf_counter()
        try:
            activate_scope(core, TENANT, WORKSPACE)
            record_ids = load_scope(core, corpus, TENANT, WORKSPACE, size, embed=embed, progress=bar)
            for ws in others:
                activate_scope(core, TENANT if ws != "other0" else "bench-b", ws)
                load_scope(core, corpus, TENANT if ws != "other0" else "bench-b", ws, n_other, embed=False,
                           progress=bar)
            core.store.checkpoint()
        finally:
            bar.close()
            core.close()
        load_s = time.perf_counter() - t0
        result["load"] = {"records_total": total, "seconds": round(load_s, 1), "per_s": round(total / load_s, 1),
                          "vectors": embed, "scopes": 1 + len(others), "method": "in-process batches (loader.py)"}
        result["semantic_measured"] = embed
        log(f"loaded {total} records in {load_s:.1f}s (vectors: {embed})")
        points = Points()
        served = Served(data, semantic=True)
        try:
            if not a.no_grpc:
                grpc_phase(a, served, corpus, record_ids, queries, embed, points, size)
            if not a.no_mcp:
                asyncio.run(mcp_phase(a, served, work, corpus, record_ids, queries, embed, points, size))
        finally:
            served.stop()
        result.update(points.combined())
        if not a.no_profile:
            from tools.bench.profiling import profile

            log("profiling in-process (cProfile)")
            result["profile"] = profile(data, tenant=TENANT, workspace=WORKSPACE, record_ids=record_ids,
                                        calls=a.profile_calls, semantic=embed, queries=queries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _git_describe() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return f"{head}{'+dirty' if dirty else ''}" if head else None


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    out = Path(a.out) if a.out else REPO / "tools" / "bench" / "results" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    corpus = Corpus()
    queries = corpus.queries(200)
    started = time.time()
    doc: dict[str, Any] = {
        "machine": machine.facts(),
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "command": "python -m tools.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "git": _git_describe(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "sizes": {},
    }
    previous = out / "summary.json"
    if a.merge and previous.exists():
        kept = json.loads(previous.read_text())
        doc["sizes"] = kept.get("sizes", {})
        if "peer" in kept:
            doc["peer"] = kept["peer"]
        doc["merged_from"] = kept.get("merged_from", []) + [{k: kept.get(k) for k in ("command", "git", "started_at")}]
    work_root = Path(tempfile.mkdtemp(prefix="engram-bench-"))
    try:
        for size in a.sizes:
            log(f"size {size:,}")
            doc["sizes"][str(size)] = {**bench_size(a, size, corpus, queries, work_root), "git": doc["git"],
                                       "loadavg_after": machine.loadavg()}
            (out / "summary.json").write_text(json.dumps(doc, indent=1))
        if not a.no_scanner:
            from tools.bench.scanner import measure

            log("secret scanner: pathological and ordinary shapes")
            doc["scanner"] = measure([int(x) for x in a.scanner_sizes.split(",")], a.scanner_reps)
            (out / "summary.json").write_text(json.dumps(doc, indent=1))
        if not a.no_peer:
            from tools.bench.peer import bench_peer, install

            log("peer: installing/starting @modelcontextprotocol/server-memory")
            try:
                entry, version = install()
                doc["peer"] = {"package": "@modelcontextprotocol/server-memory", "version": version,
                               "sizes": asyncio.run(bench_peer(entry, work_root, corpus, a.peer_sizes, runs=a.runs,
                                                               duration_s=a.duration, min_ops=3, max_ops=10_000,
                                                               queries=queries))}
            except Exception as exc:  # the Engram results still get written
                log(f"peer failed: {exc!r}")
                doc["peer"] = {"error": repr(exc)}
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    doc["machine"]["loadavg_at_end"] = machine.loadavg()
    doc["elapsed_s"] = round(time.time() - started, 1)
    from tools.bench.report import targets

    doc["targets"] = targets(doc)
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["targets"], indent=1))
    log(f"wrote {out / 'summary.json'} in {doc['elapsed_s']}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
