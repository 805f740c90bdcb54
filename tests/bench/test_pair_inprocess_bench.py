"""tools.bench.pair_inprocess at a tiny size, so the tool cannot rot (never a timing)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.bench.broad_corpus import load


def test_pairs_in_process_alternate_two_checkouts_on_copies_of_the_data(tmp_path: Path) -> None:
    from tools.bench import pair_inprocess
    from tools.bench.pair_inprocess import REPO

    data = tmp_path / "data"
    load(data, 30, progress=False)
    before = sorted(p.name for p in data.iterdir())
    size = (data / "engram.duckdb").stat().st_size
    out = tmp_path / "pairs.json"
    assert pair_inprocess.main(["--data", str(data), "--tree", str(REPO), "--runs", "1", "--pairs", "2",
                                "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    for name in ("before", "this"):
        (run,) = doc["runs"][name]
        assert run["pairs"] == 2 and run["cpu_p50_ms"] > 0 and run["code"] == str(REPO)
    assert set(doc["summary"]["before_over_this_cpu_p50_ms"]) == {"median", "min", "max"}
    # Every run wrote into a copy: the data directory is as it was.
    assert sorted(p.name for p in data.iterdir()) == before
    assert (data / "engram.duckdb").stat().st_size == size
