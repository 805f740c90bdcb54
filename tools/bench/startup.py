"""Start-up cost at scale (issue 14): how long a core takes to open a store of N accepted records
and build its search index from the sealed projections, and how much memory it then holds.

    .venv/bin/python -m tools.bench.startup --sizes 100000,1000000 [--out FILE]
    .venv/bin/python -m tools.bench.startup --sizes 1000000 --data DIR [--open-only]

``--data DIR`` keeps the stores (``DIR/n<size>``) so a later run, e.g. after a change to the
open path, measures the same files again: a store already complete is not loaded again, and
``--open-only`` refuses to load at all.

Each size is bulk-loaded in-process (tools/bench/loader.py: the admission path's sealing, one
transaction per batch). Vectors are random 384-dimension unit vectors (MiniLM's size) from a
synthetic embedder: embedding a million texts with the real model would take hours and the
start-up cost does not depend on the values. The open is then timed in a fresh process:
``open_core`` (migrations, key vault, opening every record's sealed projection, building the
in-memory index) until the core could serve, the process's peak RSS and what it still holds
(VmRSS) once the index is built.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tools.bench import machine
from tools.bench.corpus import Corpus
from tools.bench.loader import Progress, activate_scope, load_scope
from tools.bench.report import print_and_save

TENANT, WORKSPACE = "bench", "main"
DIMENSION = 384

_PROBE = """
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from engram_core.app.composition import open_core
core, _, _ = open_core(Path(sys.argv[1]), semantic=False)
with core.store.search_index() as index:
    docs = index.document_count()
opened = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
with open("/proc/self/status") as f:  # what the open core holds once built (Linux)
    held = next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS")), 0)
core.store.close()
print(json.dumps({"open_s": round(opened, 2), "peak_rss_mb": round(rss), "rss_after_open_mb": round(held),
                  "indexed": docs}))
"""


class SyntheticEmbedder:
    """Random unit vectors of the real model's size, for loading only (see the module docstring)."""

    model_id = "synthetic-unit-384"

    def __init__(self, seed: int = 7) -> None:
        self._rng = np.random.default_rng(seed)

    def embed_batch(self, texts: list[str]) -> list[list[float]]:
        v = self._rng.standard_normal((len(texts), DIMENSION)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        return v.tolist()


def _loaded(data: Path) -> int:
    """How many records a kept store holds (0 when there is none)."""
    marker = data / "bench-loaded"
    return int(marker.read_text()) if marker.exists() else 0


def load(size: int, data: Path, *, batch: int) -> float | None:
    """Bulk-load ``size`` records into ``data`` (continuing a partial load); seconds, None if done."""
    from engram_core.app.composition import open_core

    have = _loaded(data)
    if have >= size:
        return None
    # No index at open or after the load: this process only writes; the probe opens the store.
    core, _, _ = open_core(data, semantic=False, load_index=False)
    core.embedder = SyntheticEmbedder(seed=7 + have)  # type: ignore[assignment]
    if have == 0:
        activate_scope(core, TENANT, WORKSPACE)
    t0 = time.perf_counter()
    bar = Progress(size - have, f"load {size} from {have}")
    step = 50 * batch  # the marker advances per step, so an interrupted load resumes near where it stopped
    for lo in range(have, size, step):
        n = min(step, size - lo)
        load_scope(core, Corpus(seed=11), TENANT, WORKSPACE, n, embed=True, batch=batch, progress=bar,
                   start=lo, reload=False)
        (data / "bench-loaded").write_text(str(lo + n))
    bar.close()
    loaded = time.perf_counter() - t0
    core.store.close()
    return loaded


def measure(size: int, root: Path, *, batch: int, open_only: bool = False,
            load_only: bool = False) -> dict[str, object]:
    data = root / f"n{size}"
    if open_only and _loaded(data) < size:
        raise SystemExit(f"{data} holds {_loaded(data)} records, not {size}; run without --open-only")
    loaded = load(size, data, batch=batch)
    if load_only:
        return {"records": size, "load_s": None if loaded is None else round(loaded, 1)}
    db_mb = sum(p.stat().st_size for p in data.iterdir() if p.is_file()) / 2**20
    runs = [json.loads(subprocess.run([sys.executable, "-c", _PROBE, str(data)], check=True, capture_output=True,
                                      text=True).stdout) for _ in range(2)]
    best = min(runs, key=lambda r: r["open_s"])
    return {"records": size, "load_s": None if loaded is None else round(loaded, 1), "data_dir_mb": round(db_mb),
            **best, "open_runs_s": [r["open_s"] for r in runs], "peak_rss_runs_mb": [r["peak_rss_mb"] for r in runs],
            "rss_after_open_runs_mb": [r["rss_after_open_mb"] for r in runs],
            "load_average_after": machine.loadavg()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--data", type=Path, default=None, help="keep the stores here (default: a temporary directory)")
    p.add_argument("--open-only", action="store_true", help="measure kept stores; never load")
    p.add_argument("--load-only", action="store_true", help="load kept stores; do not open them")
    args = p.parse_args(argv)
    facts = machine.facts()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.data is not None:
        args.data.mkdir(parents=True, exist_ok=True)
        results = [measure(s, args.data, batch=args.batch, open_only=args.open_only,
                           load_only=args.load_only) for s in sizes]
    else:
        with tempfile.TemporaryDirectory(prefix="engram-startup-") as tmp:
            results = [measure(s, Path(tmp), batch=args.batch) for s in sizes]
    report = {"machine": facts, "load_average": machine.loadavg(), "results": results}
    print_and_save(report, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
