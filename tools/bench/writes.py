"""The write path under concurrency (issue 14): capture + admission pairs and forgets from N gRPC
clients against ``engram serve``, with how many transactions each COMMIT carried and what the
server's CPU spent per operation.

    .venv/bin/python -m tools.bench.writes [--size 10000] [--clients 1,4,16] [--duration 10] [--out FILE]

The store is bulk-loaded to ``--size`` accepted records first (tools/bench/loader.py), then served
by ``engram serve --metrics`` in its own process (semantic channel on, so admissions embed). Per
client count: pairs for ``--duration`` seconds (each client captures, then admits that
candidate), then forgets of records the pairs admitted; last, one client searching (lexical, in
its own process) while ``--search-writers`` clients write pairs. Reported per point: completed operations
per second, p50/p99 latency of each call, the server process's CPU time per operation (user +
system from /proc), the benchmark clients' own CPU per operation and how busy the machine's cores
were, and the COMMITs with their mean transactions (the core's
``engram_store_commit_batch_transactions`` histogram, read before and after). The machine's facts
and load averages go with the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench.corpus import PURPOSE, Corpus
from tools.bench.grpc_client import GrpcAgent, activate
from tools.bench.machine import facts, loadavg, machine_busy_s, process_cpu_s
from tools.bench.serving import Served, run_in_tree
from tools.bench.stats import run_summary

TENANT, WORKSPACE = "bench", "writes"
_POINTS = itertools.count()


def _load(data: Path, size: int) -> None:
    from engram_core.app.composition import open_core
    from tools.bench.loader import activate_scope, load_scope

    core, _, _ = open_core(data, semantic=False, load_index=False)
    try:
        activate_scope(core, TENANT, WORKSPACE)
        if size:
            load_scope(core, Corpus(seed=14), TENANT, WORKSPACE, size, embed=False, reload=False)
    finally:
        core.store.close()


_LOCK_SERIES = ("engram_store_scope_lock_wait_duration_seconds", "engram_store_scope_lock_hold_duration_seconds")


def _scrape(servers: list[Any]) -> dict[str, Any]:
    """The cores' metrics this benchmark reads, summed over them: COMMITs and the transactions
    they carried, and the scope-lock histograms' cumulative bucket counts (by upper bound)."""
    out: dict[str, Any] = {"commits": 0.0, "transactions": 0.0, **{name: {} for name in _LOCK_SERIES}}
    for server in servers:
        text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith("engram_store_commit_batch_transactions_count"):
                out["commits"] += float(line.split()[-1])
            elif line.startswith("engram_store_commit_batch_transactions_sum"):
                out["transactions"] += float(line.split()[-1])
            else:
                for name in _LOCK_SERIES:
                    if line.startswith(name + "_bucket{"):
                        le = float(line.split('le="', 1)[1].split('"', 1)[0])
                        out[name][le] = out[name].get(le, 0.0) + float(line.split()[-1])
    return out


def _quantile_ms(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The q-quantile (0..1) of what a histogram observed between two scrapes, interpolated
    linearly inside its bucket (as PromQL's histogram_quantile does), in ms."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    want, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= want:
            if bound == float("inf"):
                return round(lower * 1000, 2)
            share = (want - below) / (cumulative - below) if cumulative > below else 1.0
            return round((lower + (bound - lower) * share) * 1000, 2)
        lower, below = bound, cumulative
    return None


def _lock_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | None:
    """Scope-lock wait and hold p50/p99 (PostgreSQL; None for DuckDB, which has no scope locks)."""
    out: dict[str, Any] = {}
    for name, label in zip(_LOCK_SERIES, ("wait", "hold"), strict=True):
        if after[name]:
            n = max(after[name].values()) - max(before[name].values(), default=0.0)
            out[label] = {"n": int(n), "p50_ms": _quantile_ms(before[name], after[name], 0.5),
                          "p99_ms": _quantile_ms(before[name], after[name], 0.99)}
    return out or None


def _point(server: Any, key_path: Path, clients: int, duration: float, phase: str,
           corpus: Corpus, admitted: list[str], *, searcher: bool = False,
           database_cpu: Callable[[], float] | None = None) -> dict[str, Any]:
    """``clients`` writers doing ``phase`` (pair or forget); ``searcher``: one more client searching
    (lexical) all the while, in a process of its own, its latencies reported as ``search``.
    ``server``: one served core, or a list of cores over one store (client n talks to core n mod
    their number; CPU and COMMITs are summed over them). ``database_cpu``: the CPU seconds a
    database server has spent so far (PostgreSQL's processes), reported per operation too."""
    servers = server if isinstance(server, list) else [server]
    lat: dict[str, list[float]] = {"pair": [], "capture": [], "request_admission": [], "forget": [], "search": []}
    errors = [0]
    error_samples: list[str] = []  # what the first few failed calls answered
    lock = threading.Lock()
    todo = list(admitted) if phase == "forget" else []
    # Every point writes memories of its own: a key used by an earlier point would be answered
    # from the idempotency ledger (a cheap replay), not written.
    salt = f"w{next(_POINTS)}-{clients}"

    def client(n: int) -> None:
        agent = GrpcAgent(servers[n % len(servers)].address, key_path, tenant=TENANT, workspace=WORKSPACE)
        i = 0
        try:
            while time.monotonic() < stop:
                i += 1
                if phase == "pair":
                    started = time.perf_counter()
                    cap = agent.call("capture", corpus.capture_args(f"{salt}-{n}", i))
                    mid = time.perf_counter()
                    out = agent.call("request_admission", {"candidate_id": cap["candidate_id"],
                                                           "idempotency_key": f"bench-admission-{salt}-{n}-{i:08d}"})
                    done = time.perf_counter()
                    with lock:
                        lat["capture"].append(mid - started)
                        lat["request_admission"].append(done - mid)
                        lat["pair"].append(done - started)
                        if out["outcome"].get("record_id"):
                            admitted.append(out["outcome"]["record_id"])
                else:
                    with lock:
                        if not todo:
                            return
                        rid = todo.pop()
                    # Forgets count against a per-principal quota (600 a minute, policies/data.json):
                    # one principal for every client and point measured refusals once a minute's
                    # forgets added up. Each client of each point forgets as principals of its own,
                    # a new one every 500 forgets, so every forget measured is a forget done.
                    agent.principal = f"agent:bench-forget-{salt}-{n}-{i // 500}"
                    started = time.perf_counter()
                    agent.call("forget", {"record_id": rid, "idempotency_key": f"bench-forget-{rid}"[:200],
                                          "reason_ref": "bench"}, confirm=True)
                    with lock:
                        lat["forget"].append(time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
            with lock:
                errors[0] += 1
                if len(error_samples) < 5:
                    error_samples.append(f"{type(exc).__name__}: {str(exc)[:300]}")
        finally:
            agent.close()

    cpu0, scraped0 = sum(process_cpu_s(s.proc.pid) for s in servers), _scrape(servers)
    db0 = database_cpu() if database_cpu is not None else 0.0
    mine0, (busy0, all0) = time.process_time(), machine_busy_s()
    began = time.perf_counter()
    # The window opens now, after the metrics scrape: a short --duration (the smoke's) would
    # otherwise lose part of itself, or all of it on a loaded machine, to the scrape.
    stop = time.monotonic() + duration
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    if searcher:
        # Its own process, as another agent's would be: a thread here would wait for this
        # process's GIL behind the writers' clients (measured: ~1 ms of its p50 at 100k).
        receive, send = multiprocessing.Pipe(duplex=False)
        child = multiprocessing.get_context("spawn").Process(
            target=_search_until, args=(servers[-1].address, key_path, corpus.queries(200), stop, send))
        child.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if searcher:
        found, failed = receive.recv()
        child.join()
        lat["search"].extend(found)
        errors[0] += failed
    wall = time.perf_counter() - began
    cpu1, scraped1 = sum(process_cpu_s(s.proc.pid) for s in servers), _scrape(servers)
    db1 = database_cpu() if database_cpu is not None else 0.0
    (c0, t0), (c1, t1) = ((m["commits"], m["transactions"]) for m in (scraped0, scraped1))
    mine1, (busy1, all1) = time.process_time(), machine_busy_s()
    ops = len(lat["pair"]) if phase == "pair" else len(lat["forget"])
    out: dict[str, Any] = {
        "clients": clients, "cores": len(servers), "phase": phase + ("+search" if searcher else ""), "operations": ops,
        "errors": errors[0],
        **({"error_samples": error_samples} if error_samples else {}),
        "server_cpu_ms_per_op": round((cpu1 - cpu0) / ops * 1000, 2) if ops else None,
        "server_cpu_share_of_a_core": round((cpu1 - cpu0) / wall, 2),
        "database_cpu_ms_per_op": round((db1 - db0) / ops * 1000, 2) if ops and database_cpu is not None else None,
        "database_cpu_share_of_a_core": round((db1 - db0) / wall, 2) if database_cpu is not None else None,
        # The benchmark's own gRPC clients share the machine: what they spent, and how busy all
        # cores were (1.0 = every core busy all the time).
        "clients_cpu_ms_per_op": round((mine1 - mine0) / ops * 1000, 2) if ops else None,
        "machine_busy_share": round((busy1 - busy0) / (all1 - all0), 2) if all1 > all0 else None,
        "commits": int(c1 - c0), "transactions": int(t1 - t0),
        "transactions_per_commit": round((t1 - t0) / (c1 - c0), 2) if c1 > c0 else None,
        "scope_lock": _lock_figures(scraped0, scraped1),
        "loadavg_after": loadavg(),
    }
    for name, values in lat.items():
        if values:
            out[name] = run_summary(values, wall)
    return out


def _search_until(address: str, key_path: Path, queries: list[str], stop: float, out: Any) -> None:
    """One client searching (lexical) until ``stop`` (time.monotonic, the same clock in every
    process here), at least once: a spawned process can start after a short run's stop (seen on
    a loaded machine), and a point with no search would report none. Sends (latencies in
    seconds, errors)."""
    agent = GrpcAgent(address, key_path, tenant=TENANT, workspace=WORKSPACE)
    latencies: list[float] = []
    failed, i = 0, 0
    try:
        while not latencies or time.monotonic() < stop:
            started = time.perf_counter()
            agent.call("search", {"query": queries[i % len(queries)], "purpose_ref": PURPOSE})
            latencies.append(time.perf_counter() - started)
            i += 1
    except Exception:  # noqa: BLE001 - counted and reported, the run goes on
        failed = 1
    finally:
        agent.close()
        out.send((latencies, failed))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=10000, help="accepted records loaded first (default 10000)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of pairs per client count")
    p.add_argument("--search-writers", type=int, default=4,
                   help="then one client searching while this many write pairs (0: skip)")
    p.add_argument("--tree", default=None,
                   help="another checkout of this repository (its stubs generated): its loader fills the "
                        "store and its core serves it, for a before/after of two checkouts")
    p.add_argument("--out", default=None, help="write the JSON summary here")
    a = p.parse_args(argv)
    tree = Path(a.tree).resolve() if a.tree else None
    summary: dict[str, Any] = {"machine": facts(), "command": " ".join(sys.argv), "size": a.size,
                               "tree": str(tree) if tree else None, "points": []}
    with tempfile.TemporaryDirectory(prefix="engram-bench-writes-") as tmp:
        data = Path(tmp) / "data"
        print(f"[writes] loading {a.size:,} records", file=sys.stderr)
        if tree is None:
            _load(data, a.size)
        else:  # the other checkout's own loader: its core refuses a store newer than itself
            run_in_tree(tree, "import sys; from pathlib import Path; from tools.bench.writes import _load; "
                              "_load(Path(sys.argv[1]), int(sys.argv[2]))", str(data), str(a.size))
        server = Served(data, semantic=True, metrics=True, tree=tree)
        try:
            activate(server.address, data / "host.key", TENANT, WORKSPACE)
            corpus = Corpus(seed=41)
            for clients in (int(c) for c in a.clients.split(",")):
                admitted: list[str] = []
                for phase in ("pair", "forget"):
                    point = _point(server, data / "host.key", clients, a.duration, phase, corpus, admitted)
                    summary["points"].append(point)
                    main_op = point.get(phase, {})
                    print(f"[writes] clients={clients} {phase}: {main_op.get('throughput_per_s')}/s "
                          f"p50={main_op.get('p50_ms')} ms, {point['transactions_per_commit']} tx/COMMIT, "
                          f"server CPU {point['server_cpu_ms_per_op']} ms/op, errors {point['errors']}",
                          file=sys.stderr)
            if a.search_writers:
                point = _point(server, data / "host.key", a.search_writers, a.duration, "pair", corpus, [],
                               searcher=True)
                summary["points"].append(point)
                print(f"[writes] search while {a.search_writers} write pairs: p50={point['search']['p50_ms']} ms "
                      f"p99={point['search']['p99_ms']} ms; pairs {point['pair']['throughput_per_s']}/s",
                      file=sys.stderr)
        finally:
            server.stop()
    emit(summary, a.out)
    return 0


def emit(summary: dict[str, Any], out: str | None) -> None:
    """The run's JSON summary, with the load at its end, to ``out`` (or stdout)."""
    summary["loadavg_at_end"] = loadavg()
    text = json.dumps(summary, indent=1)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    raise SystemExit(main())
