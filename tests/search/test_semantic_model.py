"""The semantic channel's model file: derived once for int8 arithmetic, verified by digest, and
vectors of an older model re-embedded when a store is opened (issue 14: the model was half the
server's CPU under a write load)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engram_core.contract.scope import Scope
from engram_core.embedding import model as semantic_model
from engram_core.embedding.model import DERIVED_FILE, DERIVED_SHA256, derived_model, sha256_of
from engram_core.embedding.onnx_minilm import load_local_embedder
from engram_core.services.maintenance import VECTOR_MODEL_META
from tests.support.search_support import SEMANTIC, Client, activate

TEXTS = ["Pintail rollout uses a canary in one region first.",
         "Decision: the eider migration keeps dual writes for a week, then cuts over.\nContext: the data team "
         "approved it after the load test of 2026-03-02 showed no lag above 40 ms.",
         "Known problem: the release job times out when the artifact cache is cold; fix: warm it first."]


def _vectors(model: Path, texts: list[str]) -> np.ndarray:
    """Mean-pooled, normalized vectors of ``model`` with the embedder's own tokenizer."""
    embedder = load_local_embedder()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    out = []
    for text in texts:
        enc = embedder._tokenizer.encode(text)  # the embedder's own tokenization, not a copy of it
        ids, mask = np.array([enc.ids]), np.array([enc.attention_mask])
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        pooled = (hidden * mask[:, :, None]).sum(axis=1) / mask.sum()
        out.append(pooled[0] / np.linalg.norm(pooled[0]))
    return np.array(out)


def test_the_derived_model_is_made_from_the_installed_one_and_matches_its_pin(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_MODEL_CACHE", str(tmp_path))
    with pytest.raises(semantic_model.ModelUnavailable):
        derived_model(create=False)
    path = derived_model()
    assert path == tmp_path / DERIVED_FILE and sha256_of(path) == DERIVED_SHA256
    assert [p.name for p in tmp_path.iterdir()] == [DERIVED_FILE]  # no temporary file left behind
    # Same embeddings as the installed graph, to the precision int8 arithmetic gives.
    cosines = (_vectors(path, TEXTS) * _vectors(semantic_model.source_model(), TEXTS)).sum(axis=1)
    assert cosines.min() > 0.97, cosines


def test_a_tampered_model_file_is_never_run_but_derived_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_MODEL_CACHE", str(tmp_path))
    path = derived_model()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert derived_model() == path and sha256_of(path) == DERIVED_SHA256


def test_a_cache_that_cannot_be_written_is_a_clear_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("ENGRAM_MODEL_CACHE", str(blocker / "models"))
    with pytest.raises(semantic_model.ModelUnavailable, match="ENGRAM_MODEL_CACHE"):
        derived_model()


def test_vectors_of_an_older_model_are_re_embedded_when_the_store_opens(tmp_path: Path, stores) -> None:
    data = tmp_path / "data"
    running = stores.start_core(data, semantic=True)
    try:
        activate(running)
        ana = Client(running)
        ids = [ana.remember(text) for text in TEXTS]
        model = running.core.embedder.model_id
    finally:
        running.stop()
    # The store as the previous release left it: every vector made by another model.
    core, _, _ = stores.open_core(data, semantic=False)
    try:
        with core.store.write() as tx:
            older = tx.reseal_projections(Scope("acme", "alpha"), lambda rec, old: dataclasses.replace(
                old, model="all-MiniLM-L6-v2-onnx-int8@older", vector=old.vector[::-1].copy()))
            tx.set_meta(VECTOR_MODEL_META, "all-MiniLM-L6-v2-onnx-int8@older")  # (that release kept none)
        assert older == len(TEXTS)
    finally:
        core.close()
    running = stores.start_core(data, semantic=True)
    try:
        with running.core.store.read() as tx:
            assert tx.meta(VECTOR_MODEL_META) == model
        embedder = running.core.embedder
        with running.core.store.read() as tx:
            for record_id, text in zip(ids, TEXTS, strict=True):
                projection = tx.projection(record_id)
                assert projection is not None and projection.model == model
                assert float(np.dot(projection.vector, embedder.embed(text))) > 0.999
                assert projection.postings > 0  # the lexical part kept
        activate(running)
        found = Client(running).ids("artifact cache cold release job", capability_policy=SEMANTIC)
        assert found[0] == ids[2]
        # (after a read: PostgreSQL loads a scope's index at its first read, DuckDB all at open)
        with running.core.store.search_index() as index:
            assert index.vector_models() == {model}
    finally:
        running.stop()
