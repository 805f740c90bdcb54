"""The Embedder port (SPEC §11 ``semantic_v5``): text to a unit vector, by a pinned model."""

from __future__ import annotations

from typing import Protocol


class Embedder(Protocol):
    """Turns text into a unit vector. ``model_id`` pins model and tokenizer."""

    model_id: str
    dimensions: int
    needs_network: bool

    def embed(self, text: str) -> list[float]: ...

    def embed_batch(self, texts: list[str]) -> list[list[float]]: ...


class SemanticUnavailable(Exception):
    """The local model or its runtime is not installed or does not verify."""
