"""EmbeddingBatcher: admissions embed off their own thread, concurrent texts share model runs,
each caller gets its own text's vector, a failed run fails only its own callers, and the real
model's vectors from a batch equal its vectors one by one."""

from __future__ import annotations

import threading
import time

import pytest

from engram_core.embedding.onnx_minilm import try_load_local_embedder
from engram_core.embedding.port import SemanticUnavailable
from engram_core.services.embedding import EmbeddingBatcher


class SlowModel:
    """A stand-in model: a text's vector is its length and first code point; each run takes a
    while, so callers pile up behind it."""

    model_id = "stand-in"
    dimensions = 2
    needs_network = False

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.fail_next = False

    def embed_batch(self, texts: list[str]) -> list[list[float]]:
        self.batches.append(len(texts))
        time.sleep(0.02)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("model failed")
        return [[float(len(t)), float(ord(t[0]))] for t in texts]

    def embed(self, text: str) -> list[float]:
        return self.embed_batch([text])[0]


def _embed_concurrently(batcher: EmbeddingBatcher, texts: list[str]) -> list[object]:
    out: list[object] = [None] * len(texts)

    def run(i: int) -> None:
        try:
            out[i] = batcher.embed(texts[i])
        except Exception as exc:  # noqa: BLE001 - the test compares what each caller got
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_concurrent_callers_share_runs_and_each_gets_its_own_vector() -> None:
    model = SlowModel()
    batcher = EmbeddingBatcher(lambda: model, max_batch=4)
    texts = [chr(ord("a") + i) * (i + 1) for i in range(12)]
    out = _embed_concurrently(batcher, texts)
    assert out == [[float(len(t)), float(ord(t[0]))] for t in texts]
    assert sum(model.batches) == 12
    assert max(model.batches) > 1 and max(model.batches) <= 4
    assert batcher.embed("zz") == [2.0, float(ord("z"))]  # idle again: runs at once, alone
    assert model.batches[-1] == 1


def test_a_failed_run_fails_its_callers_and_the_next_run_works() -> None:
    model = SlowModel()
    model.fail_next = True
    batcher = EmbeddingBatcher(lambda: model)
    with pytest.raises(RuntimeError):
        batcher.embed("first")
    assert batcher.embed("second") == [6.0, float(ord("s"))]
    with pytest.raises(SemanticUnavailable):
        EmbeddingBatcher(lambda: None).embed("x")


def test_the_real_model_gives_the_same_vectors_batched() -> None:
    model = try_load_local_embedder()
    if model is None:
        pytest.fail("the local model is part of the install (tools/setup)")
    texts = ["We chose DuckDB because it is embedded.", "Kafka lag alerts: restart the consumer group.",
             "ok", "The billing job hangs when the queue is full; raise the batch timeout to 30 s."]
    batched = _embed_concurrently(EmbeddingBatcher(lambda: model), texts)
    for text, vector in zip(texts, batched, strict=True):
        alone = model.embed(text)
        assert sum(a * b for a, b in zip(alone, vector, strict=True)) > 0.9999  # type: ignore[arg-type]


def test_submit_returns_at_once_and_the_worker_ends_when_idle() -> None:
    release = threading.Event()

    class Gated(SlowModel):
        def embed_batch(self, texts: list[str]) -> list[list[float]]:
            assert release.wait(10)
            return super().embed_batch(texts)

    batcher = EmbeddingBatcher(lambda: Gated(), idle_s=0.05)
    future = batcher.submit("abc")
    assert not future.done()  # the caller goes on deciding while the model runs
    release.set()
    assert future.result(10) == [3.0, float(ord("a"))]
    deadline = time.monotonic() + 10
    while batcher._worker is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher._worker is None  # no thread left behind by an idle core
    assert batcher.embed("b") == [1.0, float(ord("b"))]  # and a new one starts with the next text
