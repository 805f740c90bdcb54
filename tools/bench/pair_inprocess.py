"""Capture + admission pairs in process, the core alone (issue 63): p50, CPU per pair, and with
``--profile SORT`` a cProfile listing.

    .venv/bin/python -m tools.bench.pair_inprocess --data DIR [--pairs 40] [--profile tottime]

``DIR``: a data directory ``tools.bench.broad_corpus.load`` made; the pairs are written into it
(use a copy). Each pair signs and verifies a fresh host context per call, as the servicer
receives it, and the admission must accept.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from pathlib import Path

from engram_core.app.composition import open_core
from engram_core.services.memory import MemoryService
from engram_core.trust.hostctx import make_context, verify_context
from engram_core.trust.hostkeys import load_private_key_file
from tools.bench.broad_corpus import TENANT, WORKSPACE, BroadCorpus
from tools.bench.corpus import PURPOSE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.pair_inprocess", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--profile", default=None, help="a pstats sort key: print the profile")
    args = ap.parse_args(argv)
    core, host_key_path, _ = open_core(args.data, semantic=False)
    memory = MemoryService(core)
    key = load_private_key_file(host_key_path)
    corpus = BroadCorpus()

    def ctx(call: str):
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
    prof = cProfile.Profile() if args.profile else None
    try:
        for i in range(5):  # warm-up
            pair(i)
        if prof:
            prof.enable()
        for i in range(5, 5 + args.pairs):
            started, cpu0 = time.perf_counter(), time.process_time()
            pair(i)
            lat.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu0) * 1000)
        if prof:
            prof.disable()
    finally:
        core.close()
    print(f"pairs {len(lat)}  p50 {statistics.median(lat):.3f} ms  CPU p50 {statistics.median(cpu):.3f} ms"
          f"  (load {os.getloadavg()[0]:.2f})")
    if prof:
        pstats.Stats(prof).sort_stats(args.profile).print_stats(40)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
