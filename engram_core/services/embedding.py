"""Embedding record texts for admission off the caller's thread (SPEC §11 ``semantic_v5``).

The model is behind the Embedder port (``engram_core.embedding.port``); the composition root
loads the local one (``engram_core.embedding.onnx_minilm``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from engram_core.embedding.port import Embedder, SemanticUnavailable

__all__ = ["Embedder", "EmbeddingBatcher", "SemanticUnavailable"]


class EmbeddingBatcher:
    """Record texts embedded off the caller's thread, concurrent ones handed to the model together.

    The model costs ~4.5 ms for a 70-token record on one core (less for short texts), and it
    releases the GIL while it runs. ``submit`` hands a text to a worker thread and returns at
    once, so an admission embeds while it goes on deciding (policy, reads) on the other core;
    texts submitted while the model is busy wait and are taken together (up to ``max_batch``;
    the model still runs each alone: ``OnnxMiniLMEmbedder.embed_batch``). ``embedder_of`` is
    read per run: observability wraps the core's embedder after the services are built. The
    worker ends after ``idle_s`` without work and starts again with the next text.
    """

    def __init__(self, embedder_of: Callable[[], Embedder | None], *, max_batch: int = 16,
                 idle_s: float = 30.0) -> None:
        self._embedder_of = embedder_of
        self._max = max_batch
        self._idle_s = idle_s
        self._cond = threading.Condition()
        self._queue: list[tuple[str, Future[list[float]]]] = []
        self._worker: threading.Thread | None = None

    def submit(self, text: str) -> Future[list[float]]:
        future: Future[list[float]] = Future()
        with self._cond:
            self._queue.append((text, future))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="engram-embed", daemon=True)
                self._worker.start()
            self._cond.notify()
        return future

    def embed(self, text: str) -> list[float]:
        return self.submit(text).result()

    def _work(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._cond.wait_for(lambda: bool(self._queue), timeout=self._idle_s):
                    self._worker = None
                    return
                batch, self._queue = self._queue[:self._max], self._queue[self._max:]
            try:
                embedder = self._embedder_of()
                if embedder is None:
                    raise SemanticUnavailable("no embedder")
                vectors = embedder.embed_batch([text for text, _ in batch])
            except BaseException as exc:  # every caller of the run gets the failure; the worker goes on
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), vector in zip(batch, vectors, strict=True):
                future.set_result(vector)
