"""What read-your-writes costs a PostgreSQL core in-process: two store kernels (two cores) over one
database; the second admits a record, the first catches its search index up (``committed_scope``,
what every search on a core beside others calls first), timed, against the same call right after
with nothing new. No gRPC and no other process in the measured path, so the difference of the two
p50s is the catch-up's own work: its round trips beyond the head check and the indexing.

    .venv/bin/python -m tools.bench.catch_up [--records 2000] [--catch-ups 400] [--baseline CHECKOUT]
                                             [--rounds 2] [--out FILE]

A PostgreSQL 15 cluster of its own is started in a temporary directory (tests/support/pg_cluster.py).
Each round runs in a process of its own on a fresh database; with ``--baseline``, that checkout's
``engram_core`` runs the same rounds alternated with this tree's, so drift falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from engram_core.contract.scope import Scope

REPO = Path(__file__).resolve().parents[2]


def _child(conninfo: str, key_dir: Path, records: int, catch_ups: int) -> dict[str, Any]:
    import psycopg

    from engram_core.store.conformance.support import (  # the conformance suite's builders
        T,
        W,
        admit_journaled,
        search,
    )
    from tests.support.store_targets import PostgresTarget
    from tools.bench.stats import run_summary

    class _Db:  # what PostgresTarget reads of tests/pg_cluster.Database
        def __init__(self, conninfo: str) -> None:
            self.conninfo = conninfo
            self.env: dict[str, str] = {}

    target = PostgresTarget(key_dir, _Db(conninfo))
    reader, writer = target.open(), target.open()
    try:
        for i in range(records):
            admit_journaled(writer, f"mem_load{i:07d}", [i % 97, 1000 + i % 13], event_id=f"evt_load{i:07d}")
        with psycopg.connect(conninfo, autocommit=True) as con:
            con.execute("ANALYZE")  # as autovacuum would have by now, and a restore does
        reader.committed_scope(Scope(T, W))  # loads the scope: what follows is catch-ups only
        kinds: dict[str, list[float]] = {"other": [], "own": [], "none": []}
        searched: dict[str, list[float]] = {"other": [], "own": [], "none": []}
        for i in range(catch_ups):
            kind = ("other", "own", "none")[i % 3]
            if kind != "none":
                admit_journaled(writer if kind == "other" else reader, f"mem_new{i:07d}",
                                [i % 97, 2000 + i % 11], event_id=f"evt_new{i:07d}")
            t = time.perf_counter()
            row = reader.committed_scope(Scope(T, W))
            caught = time.perf_counter()
            search(reader, [i % 97, 1000 + i % 13])
            kinds[kind].append(caught - t)
            searched[kind].append(time.perf_counter() - caught)
            assert row is not None
        return {"catch_up_ms": {k: run_summary(v, sum(v)) for k, v in kinds.items()},
                "search_after_ms": {k: run_summary(v, sum(v)) for k, v in searched.items()},
                "catch_up_adds_p50_ms": round((statistics.median(kinds["other"]) - statistics.median(kinds["none"]))
                                              * 1000, 3),
                "search_after_other_adds_p50_ms": round((statistics.median(searched["other"])
                                                         - statistics.median(searched["own"])) * 1000, 3)}
    finally:
        target.close_all()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=2000, help="records in the scope before the catch-ups")
    p.add_argument("--catch-ups", type=int, default=400)
    p.add_argument("--baseline", type=Path, help="another checkout to alternate with (before/after)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", nargs=2, metavar=("CONNINFO", "KEY_DIR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(_child(a.child[0], Path(a.child[1]), a.records, a.catch_ups)))
        return
    from tests.support.pg_cluster import start_cluster
    from tools.bench.machine import facts, loadavg

    trees = [("this", REPO)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    cluster = start_cluster()
    results: list[dict[str, Any]] = []
    try:
        env = {**os.environ, **cluster.env}
        for r in range(a.rounds):
            order = trees[::-1] if r % 2 == 0 else trees  # baseline, this, this, baseline, ...
            for label, tree in order:
                db = cluster.create_database("catchup")
                with tempfile.TemporaryDirectory(prefix="engram-catchup-") as keys:
                    child_env = {**env, "PYTHONPATH": os.pathsep.join(
                        [str(tree), str(REPO)])}
                    out = subprocess.run(
                        [sys.executable, str(Path(__file__).resolve()), "--records", str(a.records),
                         "--catch-ups", str(a.catch_ups), "--child", db.conninfo, keys],
                        cwd=tree, env=child_env, capture_output=True, text=True, check=False)
                cluster.drop_database(db)
                if out.returncode != 0:
                    raise SystemExit(f"{label} round {r + 1} failed:\n{out.stderr[-4000:]}")
                found = json.loads(out.stdout.strip().splitlines()[-1])
                results.append({"tree": label, "round": r + 1, "loadavg": loadavg(), **found})
                c, q = found["catch_up_ms"], found["search_after_ms"]
                print(f"[catch-up] {label} round {r + 1}: catch-up p50 after the other core's write "
                      f"{c['other']['p50_ms']} ms, after its own {c['own']['p50_ms']}, nothing new {c['none']['p50_ms']}; "
                      f"the search after it {q['other']['p50_ms']} / {q['own']['p50_ms']} / {q['none']['p50_ms']} ms",
                      flush=True)
    finally:
        cluster.destroy()
    doc = {"machine": facts(), "records": a.records, "catch_ups": a.catch_ups, "results": results}
    if a.out:
        a.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
