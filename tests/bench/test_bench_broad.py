"""Issue 63's benchmark of the searches agents really send, at a tiny size, so the tools cannot
rot (nothing here is timed: the figures are only checked to exist). No npm: the peer is skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools.bench.broad_corpus import SALT, SHAPES, WORDS, BroadCorpus, load
from tools.bench.peer import preload


@pytest.fixture(scope="module")
def broad_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 records of the broad corpus, loaded once; each test serves or opens a copy of its own
    (a core's searches write audit rows)."""
    data = tmp_path_factory.mktemp("broad-store") / "data"
    load(data, 40, progress=False)
    return data


def test_the_broad_corpus_names_six_common_words_and_its_queries_have_their_shapes() -> None:
    from engram_core.contract.tools import CAPTURE_TOOL
    from engram_core.contract.validation import validate_arguments

    corpus = BroadCorpus()
    decision, _ = corpus.text(SALT, 3)
    assert sum(f" {w} " in f" {decision.replace(',', ' ').replace(':', ' ')} " for w in WORDS) == 6
    validate_arguments(CAPTURE_TOOL, corpus.capture_args(SALT, 3))
    assert corpus.shape_queries("broad", 5, 100) == BroadCorpus().shape_queries("broad", 5, 100)
    broad, long, narrow = (corpus.shape_queries(s, 20, 100) for s in SHAPES)
    assert all(len(q.split()) == 2 and set(q.split()) <= set(WORDS) for q in broad)
    assert all(" ".join(corpus.text(SALT, int(q.split(f"rec{SALT}x")[1].split(".")[0]))) == q for q in long)
    assert all(len(q.split()) == 2 and not set(q.split()) & set(WORDS) for q in narrow)


def test_the_peer_holds_the_scope_s_texts(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    preload(path, BroadCorpus(), 3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[1]["observations"] == [" ".join(BroadCorpus().text(SALT, 1))]


def test_tiny_broad_benchmark_over_grpc_and_mcp(broad_store: Path, tmp_path: Path) -> None:
    """tools.bench.broad on a copy of the module's store (--data names a loaded directory: the
    tool serves it as it is), one measured round per shape, the MCP hop's floor beside (it
    replays each shape's first MCP answer: the same candidate count)."""
    from tools.bench.broad import main

    data = tmp_path / "data"
    shutil.copytree(broad_store, data)
    out = tmp_path / "broad.json"
    assert main(["--records", "40", "--rounds", "1", "--warmup", "1", "--no-peer", "--floor", "--data",
                 str(data), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["shapes"]) == set(SHAPES)
    for shape in SHAPES:
        for path in ("grpc", "mcp"):
            fig = doc["shapes"][shape][path]
            assert 0 < fig["p50_ms"] <= fig["p90_ms"] and fig["first_query_candidates"] > 0, (shape, path, fig)
            assert fig["core_cpu_ms_per_call"] >= 0
        assert doc["shapes"][shape]["mcp"]["adapter_cpu_ms_per_call"] >= 0
        floor = doc["shapes"][shape]["floor"]
        assert floor["p50_ms"] > 0 and floor["floor_server_cpu_ms_per_call"] >= 0, (shape, floor)
        assert floor["first_query_candidates"] == doc["shapes"][shape]["mcp"]["first_query_candidates"], shape
    assert doc["shapes"]["long"]["grpc"]["first_query_candidates"] >= doc["shapes"]["narrow"]["grpc"][
        "first_query_candidates"]


def test_tiny_in_process_and_rank_comparisons_with_this_checkout_as_the_other(broad_store: Path,
                                                                             tmp_path: Path) -> None:
    """broad_inprocess (4 queries a shape, one run of each tree) and broad_rank on a copy of the
    module's store."""
    from tools.bench import broad_inprocess, broad_rank
    from tools.bench.broad_inprocess import REPO

    data = tmp_path / "data"
    shutil.copytree(broad_store, data)
    out = tmp_path / "inproc.json"
    assert broad_inprocess.main(["--data", str(data), "--tree", str(REPO), "--runs", "1", "--rounds", "1",
                                 "--queries", "4", "--profile", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    for name in ("before", "this"):
        shapes = doc["runs"][name][0]["shapes"]
        assert set(shapes) == set(SHAPES) and all(f["p50_ms"] > 0 and f["searches"] == 4 for f in shapes.values())
    assert abs(sum(doc["runs"]["this"][0]["shapes"]["long"]["profile"]["share"].values()) - 1) < 0.01
    assert set(doc["median_p50_ms"]["before_over_this"]) == set(SHAPES)
    ranked = tmp_path / "rank.json"
    assert broad_rank.main(["--data", str(data), "--tree", str(REPO), "--reps", "1", "--rounds", "1",
                            "--queries", "2", "--out", str(ranked)]) == 0
    assert set(json.loads(ranked.read_text())["shapes"]) == set(SHAPES)
