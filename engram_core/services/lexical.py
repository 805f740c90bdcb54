"""Tokenizer and keyed term hashing for the lexical projection (SPEC §11).

Postings store keyed 64-bit hashes of terms, never the terms: the projection
holds no plaintext even of accepted records, and forgetting a record leaves no
readable word behind in freed pages. The key lives outside the database.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

TOKENIZER_ID = "nfkc-casefold-unicode-words-v1"
_WORD = re.compile(r"\w+", re.UNICODE)
_MAX_TOKEN = 64


def tokenize(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return [t for t in _WORD.findall(folded) if len(t) <= _MAX_TOKEN]


class TermHasher:
    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_dir(cls, data_dir: Path) -> TermHasher:
        path = data_dir / "index.key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
        return cls(path.read_bytes())

    def term(self, token: str) -> int:
        h = hashlib.blake2b(token.encode(), key=self._key, digest_size=8).digest()
        return int.from_bytes(h, "big", signed=True)

    def terms(self, text: str) -> list[int]:
        return [self.term(t) for t in tokenize(text)]

    def counts(self, text: str) -> Counter[int]:
        return Counter(self.terms(text))


def record_fields(payload: dict[str, Any], hasher: TermHasher) -> dict[str, Counter[int]]:
    """Per-field term counts of a record payload: primary, decision, evidence, context, citations."""
    fields: dict[str, Counter[int]] = {k: Counter() for k in ("primary", "decision", "evidence", "context", "citations")}
    primary = payload["primary_component_id"]
    for comp in payload["components"]:
        name = "primary" if comp["component_id"] == primary else comp["kind"]
        fields[name].update(hasher.counts(comp["text"]))
    for citation in payload["citations"]:
        fields["citations"].update(hasher.counts(citation["source_ref"]))
    return {k: v for k, v in fields.items() if v}
