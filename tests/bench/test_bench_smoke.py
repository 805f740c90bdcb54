"""The benchmark at a tiny size, so tools/bench cannot rot (issue 8). No npm: the peer is skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools.bench.__main__ import main
from tools.bench.corpus import Corpus
from tools.bench.peer import preload
from tools.bench.report import latency_table, profile_table, targets
from tools.bench.stats import combine, percentile, run_summary


@pytest.fixture(scope="module")
def search_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 records as tools/bench_search.py loads them (after_write.load_store), loaded once for
    the tools that take such a store; a test that opens it with a core works on a copy."""
    from tools.bench.after_write import load_store

    data = tmp_path_factory.mktemp("search-store") / "data"
    load_store(data, 60)
    return data


def test_percentiles_and_medians_across_runs() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    runs = [run_summary([0.001] * 10, 1.0), run_summary([0.003] * 10, 1.0), run_summary([0.002] * 10, 2.0)]
    c = combine(runs)
    assert c["p50_ms"] == 2.0 and c["p50_ms_min"] == 1.0 and c["p50_ms_max"] == 3.0 and c["n"] == 30


def test_corpus_is_deterministic_and_valid_for_capture() -> None:
    from engram_core.contract.tools import CAPTURE_TOOL
    from engram_core.contract.validation import validate_arguments

    a, b = Corpus(), Corpus()
    assert a.capture_args("s", 3) == b.capture_args("s", 3) and a.queries(5) == b.queries(5)
    validate_arguments(CAPTURE_TOOL, a.capture_args("s", 3))


def test_peer_preload_is_the_servers_jsonl_format(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    preload(path, Corpus(), 3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in rows] == ["entity"] * 3 and all(r["observations"] for r in rows)


def test_tiny_benchmark_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "results"
    # --duration 0: each point is its 3 calls per client (the runner's minimum), not a timed window.
    assert main(["--sizes", "40", "--clients", "1,2", "--runs", "1", "--duration", "0", "--other-scopes", "1",
                 "--semantic-max", "0", "--profile-calls", "1", "--no-peer", "--no-progress",
                 "--scanner-sizes", "1024,4096", "--scanner-reps", "2", "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    size = doc["sizes"]["40"]
    assert doc["machine"]["logical_cores"] >= 1 and size["load"]["records_total"] == 60
    for surface in ("grpc", "mcp"):
        for op in ("capture", "request_admission", "pair", "search_lexical", "get", "forget"):
            for clients in ("1", "2"):
                point = size[surface][op][clients]
                assert point["n"] > 0 and point["errors"] == 0, (surface, op, clients, point)
                assert 0 < point["p50_ms"] <= point["p99_ms"]
    assert set(size["profile"]) >= {"capture", "request_admission", "search_lexical", "get", "forget"}
    assert abs(sum(size["profile"]["search_lexical"]["share"].values()) - 1) < 0.01
    assert doc["targets"] == targets(doc) and doc["targets"]
    assert "search_lexical" in latency_table(doc, "grpc") and "forget" in profile_table(doc)
    assert set(doc["scanner"]) >= {"dotenv_TOKEN", "cookie_sid", "every_keyword", "prose"}
    point = doc["scanner"]["dotenv_TOKEN"]["4096"]
    assert point["n"] == 2 and point["bytes"] == 4096 and 0 < point["p50_ms"] <= point["p99_ms"]


def test_scanner_shapes_have_their_sizes() -> None:
    from tools.bench.scanner import shapes, table

    for name, text in shapes(4096).items():
        assert 3000 <= len(text.encode()) <= 4096, (name, len(text.encode()))
    assert "dotenv_TOKEN" in table({"dotenv_TOKEN": {"1024": {"p50_ms": 1, "p99_ms": 2, "cpu_p50_ms": 1,
                                                               "cpu_p99_ms": 2}}})


def test_mcp_hop_measures_grpc_and_both_adapters_in_one_run(tmp_path: Path) -> None:
    """tools/bench/mcp_hop.py at 20 records, with this checkout as its own baseline."""
    from tools.bench.mcp_hop import REPO
    from tools.bench.mcp_hop import main as hop_main

    out = tmp_path / "hop.json"
    assert hop_main(["--records", "20", "--rounds", "2", "--warmup", "1", "--data", str(tmp_path / "data"),
                     "--baseline", str(REPO), "--out", str(out)]) == 0
    paths = json.loads(out.read_text())["paths"]
    assert set(paths) == {"grpc", "mcp", "mcp_baseline"}
    for name in ("mcp", "mcp_baseline"):
        assert paths[name]["p50_ms"] > 0 and paths[name]["adapter_cpu_ms_per_call"] is not None


def test_mcp_hop_writes_twice_on_one_store_beside_a_baseline_core(tmp_path: Path) -> None:
    """``--writes`` twice on one --data, the baseline's core serving a copy of the store as its
    own loader left it: the second run writes new captures (a replay would stop it) and the
    baseline can still open its copy (this checkout's core migrated only its own)."""
    from tools.bench.mcp_hop import REPO, as_loaded
    from tools.bench.mcp_hop import main as hop_main

    data = tmp_path / "data"
    for run in (1, 2):
        out = tmp_path / f"hop{run}.json"
        assert hop_main(["--records", "20", "--rounds", "2", "--warmup", "1", "--data", str(data), "--writes",
                         "--semantic", "off", "--baseline", str(REPO), "--baseline-core", "--grpc-only",
                         "--out", str(out)]) == 0
        result = json.loads(out.read_text())
        assert result["semantic"] == "off"
        assert set(result["paths"]) == {f"{path}{leg}" for path in ("grpc", "grpc_baseline")
                                        for leg in ("", ":admission", ":pair")}
        assert result["machine"]["logical_cores"] > 0
        for timings in result["paths"].values():
            assert 0 < timings["p50_ms"] <= timings["p90_ms"] <= timings["p99_ms"]
        for path in ("grpc", "grpc_baseline"):  # a pair is its capture and its admission, round by round
            pair = result["paths"][f"{path}:pair"]["mean_ms"]
            legs = result["paths"][path]["mean_ms"] + result["paths"][f"{path}:admission"]["mean_ms"]
            assert abs(pair - legs) <= 0.05, (path, pair, legs)
    assert (as_loaded(data) / "engram.duckdb").is_file()


def test_writes_reports_throughput_commits_and_server_cpu(tmp_path: Path) -> None:
    """tools/bench/writes.py at 40 records: pairs and forgets from 1 and 3 clients, 0.3 s a point,
    with the COMMITs read from the served core's metrics."""
    from tools.bench.writes import main as writes_main

    out = tmp_path / "writes.json"
    assert writes_main(["--size", "40", "--clients", "1,3", "--duration", "0.3", "--search-writers", "2",
                        "--out", str(out)]) == 0
    points = json.loads(out.read_text())["points"]
    assert [(p["clients"], p["phase"]) for p in points] == [(1, "pair"), (1, "forget"), (3, "pair"), (3, "forget"),
                                                          (2, "pair+search")]
    assert points[-1]["search"]["n"] > 0
    for p in points:
        assert p["errors"] == 0 and p["operations"] > 0, p
        assert p["commits"] > 0 and p["transactions"] >= p["operations"], p
        assert p["server_cpu_ms_per_op"] > 0
    assert points[0]["pair"]["p50_ms"] > points[0]["capture"]["p50_ms"] > 0


def test_writes_serves_another_checkouts_core_with_tree(tmp_path: Path) -> None:
    """``--tree``: that checkout's loader fills the store and its own ``engram serve`` serves it
    (here this checkout again, run from its directory rather than the venv's script)."""
    from tools.bench.mcp_hop import REPO
    from tools.bench.writes import main as writes_main

    out = tmp_path / "writes.json"
    assert writes_main(["--size", "20", "--clients", "1", "--duration", "0.3", "--search-writers", "0",
                        "--tree", str(REPO), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["tree"] == str(REPO)
    assert [(p["clients"], p["phase"], p["errors"]) for p in summary["points"]] == [(1, "pair", 0), (1, "forget", 0)]


def test_after_write_measures_both_kinds_of_search_for_both_trees(search_store: Path, tmp_path: Path) -> None:
    """tools/bench/after_write.py on the module's 60-record store (it serves copies and leaves
    the store as it was), with this checkout as its own baseline: a search after a write and one
    with nothing new, per tree. One round: a second would serve both trees again, in the
    opposite order, each a fresh ``engram serve``."""
    from tools.bench.after_write import main as after_write_main
    from tools.bench.mcp_hop import REPO

    out = tmp_path / "after.json"
    assert after_write_main(["--data", str(search_store), "--baseline", str(REPO),
                             "--rounds", "1", "--writes", "2", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["tree"], r["round"]) for r in runs] == [("baseline", 0), ("this checkout", 0)]
    for r in runs:
        assert r["searches"] == 2 and r["after_a_write_p50_ms"] > 0 and r["nothing_new_p50_ms"] > 0


def test_search_inprocess_alternates_two_checkouts_each_in_its_own_process(search_store: Path,
                                                                          tmp_path: Path) -> None:
    """tools.bench.search_inprocess on a copy of the module's 60-record store (its searches
    write audit rows), with this checkout as the other tree, one run of each: every run names
    the code it measured and the profile its receipts named."""
    from tools.bench.mcp_hop import REPO
    from tools.bench.search_inprocess import main as inprocess_main

    data = tmp_path / "data"
    shutil.copytree(search_store, data)
    out = tmp_path / "inprocess.json"
    assert inprocess_main(["--data", str(data), "--tree", str(REPO), "--runs", "1", "--rounds", "1",
                           "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"tree", "this"}
    for runs in report["runs"].values():
        assert len(runs) == 1
        for r in runs:
            assert r["code"] == str(REPO) and r["profile"].startswith("offline_lexical_v")
            assert r["searches"] == report["queries"] > 0 and 0 < r["p50_ms"] <= r["p90_ms"]


def test_fsync_beside_cpu_measures_alone_and_beside_a_hog_on_each_cpu(tmp_path: Path) -> None:
    import os

    from tools.bench.fsync_beside_cpu import main as fsync_main
    out = tmp_path / "fsync.json"
    assert fsync_main(["--dir", str(tmp_path), "--samples", "5", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert set(cases) == {"alone", *(f"beside a CPU-bound process on cpu {c}" for c in os.sched_getaffinity(0))}
    assert all(case["p50_ms"] > 0 and case["p90_ms"] >= case["p50_ms"] for case in cases.values())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("fsync-bench-")]  # its file is gone
    assert "block_interrupts_by_cpu" in result["machine"]
