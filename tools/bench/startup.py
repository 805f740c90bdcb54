"""Start-up cost at scale (issue 14): how long a core takes to open a store of N accepted records
and build its search index from the sealed projections, and how much memory it then holds.

    .venv/bin/python -m tools.bench.startup --sizes 100000,1000000 [--out FILE]

Each size is bulk-loaded in-process (tools/bench/loader.py: the admission path's sealing, one
transaction per batch). Vectors are random 384-dimension unit vectors (MiniLM's size) from a
synthetic embedder: embedding a million texts with the real model would take hours and the
start-up cost does not depend on the values. The open is then timed in a fresh process:
``open_core`` (migrations, key vault, opening every record's sealed projection, building the
in-memory index) until the core could serve, and the process's peak RSS after it.
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

TENANT, WORKSPACE = "bench", "main"
DIMENSION = 384

_PROBE = """
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from engram_core.rpc.server import open_core
core, _, _ = open_core(Path(sys.argv[1]), semantic=False)
with core.store.search_index() as index:
    docs = index.document_count()
opened = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
core.store.close()
print(json.dumps({"open_s": round(opened, 2), "peak_rss_mb": round(rss), "indexed": docs}))
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


def measure(size: int, root: Path, *, batch: int) -> dict[str, object]:
    from engram_core.rpc.server import open_core

    data = root / f"n{size}"
    core, _, _ = open_core(data, semantic=False)
    core.embedder = SyntheticEmbedder()  # type: ignore[assignment]
    activate_scope(core, TENANT, WORKSPACE)
    t0 = time.perf_counter()
    bar = Progress(size, f"load {size}")
    load_scope(core, Corpus(seed=11), TENANT, WORKSPACE, size, embed=True, batch=batch, progress=bar)
    bar.close()
    loaded = time.perf_counter() - t0
    core.store.close()
    db_mb = sum(p.stat().st_size for p in data.iterdir() if p.is_file()) / 2**20
    runs = [json.loads(subprocess.run([sys.executable, "-c", _PROBE, str(data)], check=True, capture_output=True,
                                      text=True).stdout) for _ in range(2)]
    best = min(runs, key=lambda r: r["open_s"])
    return {"records": size, "load_s": round(loaded, 1), "data_dir_mb": round(db_mb), **best,
            "open_runs_s": [r["open_s"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--batch", type=int, default=2000)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="engram-startup-") as tmp:
        results = [measure(int(s), Path(tmp), batch=args.batch) for s in args.sizes.split(",")]
    report = {"machine": machine.facts(), "load_average": machine.loadavg(), "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
