"""Ranking profiles (SPEC §11): parameters pinned in a config digest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engram_core.canonical import digest
from engram_core.services.lexical import TOKENIZER_ID

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Profile:
    name: str
    version: str
    k1: float = 1.2
    b: float = 0.75
    weights: dict[str, float] = field(
        default_factory=lambda: {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}
    )
    half_life_ms: int = 30 * DAY_MS
    lexical_weight: float = 0.85
    rrf_k: int = 60
    model_id: str | None = None

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "profile": self.name, "version": self.version, "tokenizer": TOKENIZER_ID,
            "bm25": {"k1": str(self.k1), "b": str(self.b)},
            "field_weights": {k: str(v) for k, v in sorted(self.weights.items())},
            "recency": {"half_life_ms": self.half_life_ms, "weight": str(round(1 - self.lexical_weight, 4))},
        }
        if self.model_id is not None:
            cfg["semantic"] = {"model_id": self.model_id, "fusion": "rrf", "k": self.rrf_k}
        return cfg

    def config_digest(self) -> str:
        return digest("profile-config", self.config())


OFFLINE_LEXICAL_V1 = Profile(name="offline_lexical_v1", version="1")
