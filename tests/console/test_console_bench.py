"""tools/bench/console.py at a tiny size, so the console's benchmark cannot rot (no test times anything)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.bench.console import main


def test_console_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "console.json"
    assert main(["--records", "20", "--requests", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["records"] == 20 and doc["held"] == 5
    assert set(doc["pages"]) == {"signin", "home", "review", "candidate", "memory", "memory_browse",
                                 "memory_browse_state", "memory_browse_older", "audit", "policy", "keys",
                                 "confirmations", "audit_verify"}
    assert all(p["n"] == 2 and p["p50_ms"] <= p["p95_ms"] for p in doc["pages"].values())
