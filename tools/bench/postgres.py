"""Several cores over one PostgreSQL store (issue 28): the write path and search through one and
two ``engram serve --store`` processes, against the same figures on the embedded DuckDB store in
the same run.

    .venv/bin/python -m tools.bench.postgres [--size 10000] [--clients 1,4,16] [--duration 10] [--out FILE]
        [--baseline CHECKOUT --rounds 2]

A PostgreSQL 15 cluster of its own is started in a temporary directory (as the tests start theirs:
tests/support/pg_cluster.py; as root through ``runuser -u postgres``), on this machine, so the database
shares its cores with the cores and the clients. The DuckDB store is bulk-loaded to ``--size``
records (tools/bench/loader.py) and moved into PostgreSQL with ``engram admin migrate-store``
(timed; lexical only, so the move does not embed). Then, per engine and number of cores: pairs and
forgets per client count (tools/bench/writes.py's points: throughput, p50/p99 per call, server
CPU per operation, transactions per COMMIT), a scope's first search on a fresh core (the cold
load of its index) and one client's lexical searches; with several cores, what read-your-writes
costs a search (``--catch-up``: a search on the last core right after a write acknowledged by
the first, against one right after a write the first acknowledged in another scope (nothing to
catch up: the control), one right after a write it acknowledged itself and one with nothing new,
interleaved).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.pg_cluster import start_cluster  # the tests' own cluster helper
from tools.bench.corpus import PURPOSE, Corpus
from tools.bench.grpc_client import GrpcAgent, activate
from tools.bench.machine import facts, tree_cpu_s
from tools.bench.serving import ENGRAM, REPO, Served
from tools.bench.stats import run_summary
from tools.bench.writes import TENANT, WORKSPACE, _load, _point, emit


def _searches(address: str, key_path: Path, queries: list[str], n: int) -> dict[str, Any]:
    agent = GrpcAgent(address, key_path, tenant=TENANT, workspace=WORKSPACE)
    try:
        started = time.perf_counter()
        agent.call("search", {"query": queries[0], "purpose_ref": PURPOSE})
        cold = time.perf_counter() - started
        lat = []
        began = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            agent.call("search", {"query": queries[i % len(queries)], "purpose_ref": PURPOSE})
            lat.append(time.perf_counter() - t)
        return {"first_search_ms": round(cold * 1000, 2), **run_summary(lat, time.perf_counter() - began)}
    finally:
        agent.close()


OTHER_WORKSPACE = "elsewhere"  # the catch-up phase's control: a scope the searches never read


def _catch_up(writer: str, reader: str, key_path: Path, corpus: Corpus, queries: list[str], n: int,
              salt: str, pause_s: float = 0.0) -> dict[str, Any]:
    """What read-your-writes costs a search: one client cycles through four kinds of search on
    ``reader``: right after a capture + admission acknowledged by ``writer`` (the reader's index
    is one record and its events behind the scope's head, and catches up before it answers);
    right after a capture + admission acknowledged by ``writer`` in another scope (nothing to
    catch up, but the other process just ran on the machine's CPUs and the reader sat idle
    meanwhile, as in the first kind); right after a capture + admission acknowledged by
    ``reader`` itself (its index already holds the record: only the head read, but the same
    write just happened on the machine, whose after-effects, such as the audit spool's move and
    the database's WAL writer, share the CPUs with the search); and when nothing was written
    since its last one. The first minus the second is the catch-up's own cost (its statement's
    extra rows and the indexing); the first minus the third is what the older figure
    (``catch_up_adds_p50_ms``) reports, which includes the reading core having sat idle while
    another process ran; the first minus the fourth is what a client sees. The kinds are
    interleaved, so drift of the machine falls on all alike. ``pause_s``: a wait between the
    write's answer and the search (every kind), so that the writing core's work after it
    answered is over when the search starts."""
    activate(writer, key_path, TENANT, OTHER_WORKSPACE)
    w = GrpcAgent(writer, key_path, tenant=TENANT, workspace=WORKSPACE)
    elsewhere = GrpcAgent(writer, key_path, tenant=TENANT, workspace=OTHER_WORKSPACE)
    r = GrpcAgent(reader, key_path, tenant=TENANT, workspace=WORKSPACE)
    kinds: dict[str, list[float]] = {"after_a_write_on_the_other_core": [],
                                     "after_a_write_on_the_other_core_in_another_scope": [],
                                     "after_a_write_on_the_same_core": [], "nothing_written_since": []}
    names = list(kinds)
    writers = {"after_a_write_on_the_other_core": w, "after_a_write_on_the_other_core_in_another_scope": elsewhere,
               "after_a_write_on_the_same_core": r}
    try:
        for i in range(len(names) * (n + 2)):
            kind = names[i % len(names)]
            by = writers.get(kind)
            if by is not None:
                cap = by.call("capture", corpus.capture_args(f"catch-up-{salt}", i))
                by.call("request_admission", {"candidate_id": cap["candidate_id"],
                                              "idempotency_key": f"bench-catch-up-{salt}-{i:08d}"})
            if pause_s:
                time.sleep(pause_s)
            t = time.perf_counter()
            r.call("search", {"query": queries[i % len(queries)], "purpose_ref": PURPOSE})
            if i >= 2 * len(names):  # the first rounds warm both cores' paths
                kinds[kind].append(time.perf_counter() - t)
        out: dict[str, Any] = {k: run_summary(v, sum(v)) for k, v in kinds.items()}
        after_other = out["after_a_write_on_the_other_core"]["p50_ms"]
        out["catch_up_adds_p50_ms"] = round(after_other - out["after_a_write_on_the_same_core"]["p50_ms"], 3)
        out["catch_up_own_work_p50_ms"] = round(
            after_other - out["after_a_write_on_the_other_core_in_another_scope"]["p50_ms"], 3)
        return out
    finally:
        w.close()
        elsewhere.close()
        r.close()


def _run(servers: list[Served], key_path: Path, a: argparse.Namespace, corpus: Corpus, label: str,
         summary: dict[str, Any], database_cpu: Callable[[], float] | None = None) -> None:
    queries = corpus.queries(200)
    search = _searches(servers[-1].address, key_path, queries, a.searches)
    summary["points"].append({"engine": label, "cores": len(servers), "phase": "search", "search": search})
    print(f"[postgres] {label} x{len(servers)} search: first {search['first_search_ms']} ms, "
          f"p50 {search['p50_ms']} ms p99 {search['p99_ms']} ms", file=sys.stderr)
    if len(servers) > 1 and a.catch_up:
        caught = _catch_up(servers[0].address, servers[-1].address, key_path, corpus, queries, a.catch_up,
                           salt=f"{time.time_ns()}", pause_s=a.catch_up_pause_ms / 1000)
        summary["points"].append({"engine": label, "cores": len(servers), "phase": "catch-up",
                                  "pause_ms": a.catch_up_pause_ms, **caught})
        print(f"[postgres] {label} x{len(servers)} catch-up: search p50 "
              f"{caught['after_a_write_on_the_other_core']['p50_ms']} ms after a write on the other core, "
              f"{caught['after_a_write_on_the_other_core_in_another_scope']['p50_ms']} ms after one there in "
              f"another scope, {caught['after_a_write_on_the_same_core']['p50_ms']} ms after one on the same "
              f"core, {caught['nothing_written_since']['p50_ms']} ms with nothing new", file=sys.stderr)
    for clients in (int(c) for c in a.clients.split(",")):
        admitted: list[str] = []
        for phase in ("pair", "forget"):
            point = _point(servers if len(servers) > 1 else servers[0], key_path, clients, a.duration, phase,
                           corpus, admitted, database_cpu=database_cpu)
            point["engine"] = label
            summary["points"].append(point)
            main = point.get(phase, {})
            print(f"[postgres] {label} x{len(servers)} clients={clients} {phase}: {main.get('throughput_per_s')}/s "
                  f"p50={main.get('p50_ms')} ms p99={main.get('p99_ms')} ms, "
                  f"{point['transactions_per_commit']} tx/COMMIT, scope lock {point['scope_lock']}, "
                  f"CPU ms/op server {point['server_cpu_ms_per_op']} database {point['database_cpu_ms_per_op']}, "
                  f"errors {point['errors']} {point.get('error_samples', '')}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=10000, help="accepted records loaded first (default 10000)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of pairs per client count")
    p.add_argument("--searches", type=int, default=300, help="lexical searches by one client per setup")
    p.add_argument("--cores", default="1,2", help="numbers of PostgreSQL cores to run (default 1,2)")
    p.add_argument("--no-duckdb", action="store_true", help="skip the embedded store's figures")
    p.add_argument("--catch-up", type=int, default=200,
                   help="with several cores: searches on one after a write on another, as many after a write "
                        "on the same core and with nothing new, interleaved (read-your-writes' cost; 0: skip)")
    p.add_argument("--catch-up-pause-ms", type=float, default=0.0,
                   help="a wait between each write's answer and the search that follows it (the writing core's "
                        "work after it answered then falls outside the search)")
    p.add_argument("--semantic", choices=("on", "off"), default="on",
                   help="the cores' semantic channel (default on: each admission embeds)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkout (its stubs generated) whose cores run over the same database, "
                        "alternated with this checkout's (before/after in one run)")
    p.add_argument("--rounds", type=int, default=1, help="with --baseline: rounds of both, alternated")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    a = p.parse_args(argv)
    summary: dict[str, Any] = {"machine": facts(), "command": " ".join(sys.argv), "size": a.size,
                               "semantic": a.semantic, "points": []}
    cluster = start_cluster()
    os.environ["PGPASSFILE"] = str(cluster.passfile)
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])

    def database_cpu() -> float:
        return tree_cpu_s(postmaster)
    try:
        with tempfile.TemporaryDirectory(prefix="engram-bench-pg-") as tmp:
            data, keys = Path(tmp) / "data", Path(tmp) / "keys"
            print(f"[postgres] loading {a.size:,} records", file=sys.stderr)
            _load(data, a.size)
            corpus = Corpus(seed=41)
            if not a.no_duckdb:
                server = Served(data, semantic=a.semantic == "on", metrics=True)
                try:
                    activate(server.address, data / "host.key", TENANT, WORKSPACE)
                    _run([server], data / "host.key", a, corpus, "duckdb", summary)
                finally:
                    server.stop()
            db = cluster.create_database("bench")
            started = time.perf_counter()
            moved = subprocess.run([ENGRAM, "admin", "--json", "migrate-store", "--from", str(data), "--to",
                                    db.conninfo, "--key-dir", str(keys)], capture_output=True, text=True,
                                   env={**os.environ, **db.env, "ENGRAM_SEMANTIC": "off"}, cwd=REPO)
            if moved.returncode != 0:
                raise RuntimeError(f"migrate-store failed: {moved.stderr[-2000:]}")
            seconds = time.perf_counter() - started
            records = json.loads(moved.stdout)["records_restored"]
            summary["migrate_store"] = {"seconds": round(seconds, 2), "records": records,
                                        "records_per_s": round(records / seconds, 1)}
            print(f"[postgres] migrate-store: {records} records in {seconds:.1f} s", file=sys.stderr)
            key_path = data / "host.key"  # copied into the key directory: the hosts' key signs there too
            trees: list[tuple[str, Path | None]] = [("postgresql", None)]
            if a.baseline is not None:
                trees.insert(0, ("postgresql (baseline)", a.baseline))
            for n in (int(c) for c in a.cores.split(",")):
                for r in range(a.rounds if a.baseline is not None else 1):
                    for label, tree in trees if r % 2 == 0 else trees[::-1]:
                        servers: list[Served] = []
                        try:
                            for _ in range(n):
                                servers.append(Served(keys, semantic=a.semantic == "on", metrics=True,
                                                      store=db.conninfo, tree=tree))
                            _run(servers, key_path, a, corpus, label, summary, database_cpu=database_cpu)
                        finally:
                            for s in servers:
                                s.stop()
    finally:
        log_dir = os.environ.get("ENGRAM_BENCH_LOG_DIR")
        if log_dir:  # the database's own log beside the cores' (a deadlock names both statements there)
            shutil.copyfile(cluster.root / "server.log", Path(log_dir) / f"postgresql-{os.getpid()}.log")
        cluster.destroy()
    emit(summary, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
