"""tools/bench/http_auth.py at a tiny size, so the authentication benchmark cannot rot (issue 29).
The layer only: no core, no adapter processes."""

from __future__ import annotations

import json
from pathlib import Path

from tools.bench.http_auth import main


def test_the_layer_measurement_runs_and_reports_every_path(tmp_path: Path) -> None:
    out = tmp_path / "auth.json"
    assert main(["--reps", "20", "--no-end-to-end", "--out", str(out)]) == 0
    layer = json.loads(out.read_text())["layer"]
    assert set(layer["requests_cpu"]) == {"none", "static_token", "jwt_es256", "jwt_rs256"}
    assert set(layer["added_p50_ms_cpu"]) == {"static_token", "jwt_es256", "jwt_rs256"}
    assert all(point["n"] == 20 and point["p50_ms"] > 0 for point in layer["verify_first_use_cpu"].values())
    assert layer["jwks_fetches"] == 1  # fetched once, then cached
