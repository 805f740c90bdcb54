"""Search benchmark: latency of engram_memory_search through gRPC at N accepted records in one scope.

Loading N records through capture + admission would take hours, so the store is
bulk-loaded in-process through the same code the admission transaction uses for
each record (``vault.new_data_key``, ``seal`` of the effective payload,
``record_fields`` with the core's term hasher, ``tx.insert_record``,
``tx.put_data_key``, ``tx.index_record`` with the sealed projection), in transactions of
``--batch`` records. Journal and audit rows per record are
not written; the scope cursor is moved past the loaded records. Texts vary from
templates; vectors come from embedding ``--distinct-texts`` distinct texts with
the real model (each record gets its template's vector: the search cost does not
depend on the values). Searches then go through a real gRPC server with signed
host contexts, exactly as an agent's would.

``--session-size S`` captures the records live instead, in agent sessions of S records 30 s apart
(valid time = capture time, as an agent capturing as it goes dates them), so that version 4's
neighbours link every record of a session: the lending's cost at its largest. Without it records
have their own days and no session (what nothing links).

Run: ``.venv/bin/python tools/bench_search.py --records 100000 [--session-size 20] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "retrieval"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tools.bench

from agent import DAY_MS, PURPOSE, Agent, now_ms  # noqa: E402

from engram_core.app.composition import RunningCore, start_core  # noqa: E402
from engram_core.contract.canonical import canonical_json  # noqa: E402
from engram_core.contract.scope import Scope
from engram_core.crypto.sealing import seal  # noqa: E402
from engram_core.services.core import record_id_of  # noqa: E402
from engram_core.services.lexical import record_fields  # noqa: E402
from engram_core.store.engine import TxEffects  # noqa: E402
from engram_core.store.port import RecordRow  # noqa: E402
from tools.bench.search_queries import QUERIES, TENANT, WORKSPACE  # noqa: E402
from tools.bench.serving import Served  # noqa: E402


def texts(n_distinct: int, rng: random.Random) -> list[str]:
    corpus = json.loads((Path(__file__).parent / "retrieval" / "corpus.json").read_text())
    base = [m["text"] for m in corpus["memories"]]
    words = sorted({w.strip(".,;:") for t in base for w in t.split() if len(w) > 3})
    out = []
    for i in range(n_distinct):
        extra = " ".join(rng.sample(words, 6))
        out.append(f"{rng.choice(base)} Also noted: {extra} (item {i}).")
    return out


def payload(text: str, t: int, i: int) -> dict[str, Any]:
    return {
        "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": t},
        "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["cit1"]},
                       {"component_id": "c2", "kind": "context", "text": f"Context for bench record {i}.",
                        "citation_ids": ["cit1"]}],
        "primary_component_id": "c1",
        "primary_event": {"at": t, "type_ref": "event:decision", "citation_id": "cit1"},
        "citations": [{"citation_id": "cit1", "source_ref": f"ticket:BEN-{i % 997}",
                       "locator": {"scheme": "ticket", "value": f"BEN-{i}"}, "content_digest": "sha256:" + "a" * 64}],
        "scope_ref": {"tenant": TENANT, "workspace": WORKSPACE},
    }


def bulk_load(running: RunningCore, n: int, *, distinct: int, batch: int, seed: int, session_size: int = 0) -> float:
    core = running.core
    rng = random.Random(seed)
    pool = texts(distinct, rng)
    vectors = None
    if core.embedder is not None:
        vectors = []
        for i in range(0, len(pool), 64):
            vectors += core.embedder.embed_batch(pool[i:i + 64])
    t0 = time.perf_counter()
    with core.store.read() as tx:
        cursor = tx.scope(Scope(TENANT, WORKSPACE)).last_cursor  # type: ignore[union-attr]
    now = now_ms()
    session_start = 0
    for start in range(0, n, batch):
        rows = []
        for i in range(start, min(n, start + batch)):
            k = rng.randrange(len(pool))
            if session_size:  # live: one session's records 30 s apart, dated when captured
                if i % session_size == 0:
                    session_start = now - rng.randrange(400) * DAY_MS - session_size * 30_000
                t = session_start + (i % session_size) * 30_000
            else:
                t = now - rng.randrange(400) * DAY_MS
            eff = payload(pool[k] + f" #{i}", t, i)
            rdigest = "sha256:" + os.urandom(32).hex()
            rid = record_id_of(rdigest)
            slot, key = core.vault.new_data_key(f"record:{rid}")
            body = seal(key, canonical_json(eff), kind="record", owner=rid)
            cursor += 1
            rows.append((rid, rdigest, eff, slot, body, cursor, k, record_fields(eff, core.hasher),
                         f"s-bench-{i // session_size}" if session_size else None))
        with core.store.write() as tx:
            for rid, rdigest, eff, slot, body, cur, k, fields, session in rows:
                tx.insert_record(RecordRow(
                    record_id=rid, tenant=TENANT, workspace=WORKSPACE, candidate_id=f"cand_bench{cur}",
                    record_digest=rdigest, payload_digest="sha256:" + os.urandom(32).hex(), state="accepted_current",
                    trust_class="asserted", principal="user:bench", agent_id="agent-bench",
                    valid_t=eff["valid_time"]["t"], valid_t_end=None, expires_at_ms=None,
                    derivative_rule="make-ineligible", accepted_at_ms=now, accepted_cursor=cur, state_cursor=cur,
                    successor_id=None, sealed_body=body, key_slot=slot, session=session,
                    captured_at_ms=eff["valid_time"]["t"] if session else now))
                tx.put_data_key(f"record:{rid}", slot, now)
                vector = (core.embedder.model_id, vectors[k]) if vectors is not None else None  # type: ignore[union-attr]
                tx.index_record(Scope(TENANT, WORKSPACE), rid, fields, vector)
            head = tx.scope(Scope(TENANT, WORKSPACE)).last_event_digest  # type: ignore[union-attr]
        # Moving the journal head past raw rows is the engine's, not the store port's (issue 62).
        with core.store.engine.write(effects=TxEffects()) as etx:  # type: ignore[attr-defined]
            etx.set_scope_head(Scope(TENANT, WORKSPACE), cursor, head)
        print(f"  loaded {min(n, start + batch)}/{n} ({time.perf_counter() - t0:.0f} s)", flush=True)
    core.store.checkpoint()
    return time.perf_counter() - t0


def measure(agent: Agent, *, semantic: bool, rounds: int) -> tuple[str, dict[str, float]]:
    """(the profile the rank receipts name, latency percentiles)."""
    profile = ""
    for q in QUERIES:  # warm-up
        profile = agent.search(q, semantic=semantic)["rank_receipt"]["profile"]
    lat = []
    for _ in range(rounds):
        for q in QUERIES:
            t = time.perf_counter()
            agent.search(q, semantic=semantic)
            lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    return profile, {"p50_ms": round(lat[len(lat) // 2], 2), "p90_ms": round(lat[int(len(lat) * 0.9)], 2),
                     "p99_ms": round(lat[int(len(lat) * 0.99)], 2), "searches": len(lat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--distinct-texts", type=int, default=2_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-semantic", action="store_true")
    ap.add_argument("--session-size", type=int, default=0, help="capture live, in sessions of this many records")
    ap.add_argument("--data", type=Path, help="reuse this data dir (loaded once)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tree", type=Path,
                    help="serve another checkout's core (its stubs built) on --data: a before/after in one run "
                         "with this client; the store is loaded by this checkout")
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="engram-bench-")) / "data"
    fresh = not (data / "engram.duckdb").exists()
    running = start_core(data, semantic=not args.no_semantic)
    try:
        Agent(running, TENANT, WORKSPACE).activate()
        load_s = bulk_load(running, args.records, distinct=args.distinct_texts, batch=args.batch,
                           seed=args.seed, session_size=args.session_size) if fresh else 0.0
        semantic = running.core.embedder is not None
    finally:
        running.stop()
    # Measured against `engram serve` in its own process, as deployed: an in-process server
    # would share the client's GIL and inflate every figure.
    served = Served(data, semantic, tree=args.tree)
    try:
        agent = Agent(served, TENANT, WORKSPACE)  # type: ignore[arg-type]
        report: dict[str, Any] = {
            "records": args.records, "load_seconds": round(load_s, 1), "cpus": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "rounds": args.rounds,
            "queries": len(QUERIES), "session_size": args.session_size, "tree": str(args.tree or "this checkout"),
            "loadavg_before": os.getloadavg()}
        for channel in (False, True) if semantic else (False,):
            profile, figures = measure(agent, semantic=channel, rounds=args.rounds)
            report[profile] = figures
        report["loadavg_after"] = os.getloadavg()
    finally:
        served.stop()
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
