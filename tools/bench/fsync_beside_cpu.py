"""What a busy CPU does to this machine's fsyncs: fdatasync latency alone, then beside a CPU-bound
process pinned to each CPU in turn.

    .venv/bin/python -m tools.bench.fsync_beside_cpu                 # 200 syncs per case, in the working directory
    .venv/bin/python -m tools.bench.fsync_beside_cpu --dir /data --samples 50 --out r.json

Every Engram call waits for an fsync (a write for the key vault's and the store's WAL, a search
or a get for its audit row in the spool), and the record's vector is computed beside a capture on
a thread that keeps one CPU busy for ~5 ms. On the project's 2-core VM the disk's completion interrupts all land on one CPU, and a
CPU-bound task there delays every fdatasync from ~0.1 ms to 6–9 ms (docs/performance.md, "The
model beside the capture: fsyncs wait for the disk's interrupt CPU"). Whether a benchmark's
model thread ran there is up to the scheduler, which is one reason the same code's write latency
moves between runs on that VM. Run this before trusting write latencies from a new machine: on
one without the effect every case is within noise of "alone".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench.machine import block_interrupts_by_cpu, facts
from tools.bench.report import print_and_save
from tools.bench.stats import percentile

# Pinned to the CPU it is given; busy until killed, or until its parent is gone.
_HOG = ("import hashlib, os, sys\n"
        "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "parent = os.getppid()\n"
        "buf = os.urandom(1 << 22)\n"
        "while os.getppid() == parent:\n"
        "    hashlib.sha256(buf).digest()\n")


def _syncs(directory: Path, samples: int) -> list[float]:
    """fdatasync latencies (ms) of one 4 KiB rewrite each, 1 ms apart."""
    fd, name = tempfile.mkstemp(dir=directory, prefix="fsync-bench-")
    try:
        block = os.urandom(4096)
        out = []
        for i in range(samples):
            os.pwrite(fd, block, (i % 64) * 4096)
            started = time.perf_counter()
            os.fdatasync(fd)
            out.append((time.perf_counter() - started) * 1000)
            time.sleep(0.001)
        return out
    finally:
        os.close(fd)
        os.unlink(name)


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"p50_ms": round(percentile(ordered, 50), 3), "p90_ms": round(percentile(ordered, 90), 3),
            "mean_ms": round(statistics.mean(ordered), 3)}


def measure(directory: Path, samples: int) -> dict[str, Any]:
    """{"alone": ..., "beside a CPU-bound process on cpu N": ...} for every CPU this process may use."""
    cases: dict[str, Any] = {"alone": _summary(_syncs(directory, samples))}
    for cpu in sorted(os.sched_getaffinity(0)):
        hog = subprocess.Popen([sys.executable, "-c", _HOG, str(cpu)])
        try:
            time.sleep(0.2)  # running, and pinned
            cases[f"beside a CPU-bound process on cpu {cpu}"] = _summary(_syncs(directory, samples))
        finally:
            hog.kill()
            hog.wait()
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=Path.cwd(), help="a directory on the disk to measure")
    p.add_argument("--samples", type=int, default=200, help="fdatasyncs per case")
    p.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = p.parse_args(argv)
    result = {"machine": facts(), "dir": str(args.dir), "samples": args.samples,
              "cases": measure(args.dir, args.samples),
              "block_interrupts_by_cpu_after": block_interrupts_by_cpu()}
    print_and_save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
