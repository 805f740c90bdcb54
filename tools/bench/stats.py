"""Percentiles and run summaries (medians across runs, spread shown)."""

from __future__ import annotations

import math
import statistics
from typing import Any


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


def run_summary(latencies_s: list[float], wall_s: float, errors: int = 0) -> dict[str, Any]:
    """One run: latency percentiles in ms and throughput in ops/s."""
    lat = sorted(x * 1000 for x in latencies_s)
    return {
        "n": len(lat),
        "errors": errors,
        "p50_ms": round(percentile(lat, 50), 3),
        "p95_ms": round(percentile(lat, 95), 3),
        "p99_ms": round(percentile(lat, 99), 3),
        "mean_ms": round(statistics.fmean(lat), 3) if lat else float("nan"),
        "throughput_per_s": round(len(lat) / wall_s, 2) if wall_s > 0 else 0.0,
    }


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of each figure across runs, with min and max to show the spread."""
    out: dict[str, Any] = {"runs": len(runs), "per_run": runs}
    for k in ("p50_ms", "p95_ms", "p99_ms", "mean_ms", "throughput_per_s"):
        vals = [r[k] for r in runs if r.get("n")]
        if vals:
            out[k] = round(statistics.median(vals), 3)
            out[k + "_min"] = round(min(vals), 3)
            out[k + "_max"] = round(max(vals), 3)
    out["n"] = sum(r["n"] for r in runs)
    out["errors"] = sum(r.get("errors", 0) for r in runs)
    return out
