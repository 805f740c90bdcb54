"""A record's search projection, sealed under the record's own data key (SPEC §10).

Everything derived from a record's content — its postings (keyed term hashes, term
frequencies, field lengths) and its vector — is stored only as one AES-256-GCM blob
next to the sealed body, under the same per-record data key. Destroying that key (a
forget) shreds the projection in the file, the WAL and every backup at once: nothing
depends on DuckDB overwriting freed pages, which it does not do. The in-memory search
index is built from these blobs when the store opens.

Shared by every store engine: the format is a property of the data, not of DuckDB.

Format (little-endian), compact so that opening 100k of them at start-up stays cheap:
``b"EP1"``, u8 field count, per field (u8 field code, u32 n, int64[n] term hashes,
int32[n] term frequencies), then u16 model-id length, the model id (UTF-8; empty: no
vector), u32 dimension, float32[dimension].
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engram_core.crypto.sealing import seal, unseal

MAGIC = b"EP1"
SEAL_KIND = "projection"  # associated data binds the kind and the record id (crypto.sealing)


class DataKeys(Protocol):
    """The part of the key vault the store needs to seal and open projections."""

    def data_key(self, slot: int, owner: str) -> bytes | None: ...


@dataclass(frozen=True)
class Projection:
    """One record's postings by field code, and its vector (model id, float32) or none."""

    fields: dict[int, tuple[np.ndarray, np.ndarray]]  # field code -> (int64 terms, int32 tfs)
    model: str = ""
    vector: np.ndarray | None = None

    @classmethod
    def of(cls, fields: dict[int, Counter[int]], model: str = "", vector: list[float] | None = None) -> Projection:
        arrays = {code: (np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)),
                         np.fromiter(counts.values(), dtype=np.int32, count=len(counts)))
                  for code, counts in fields.items() if counts}
        vec = np.asarray(vector, dtype=np.float32) if vector is not None else None
        return cls(arrays, model if vec is not None else "", vec)

    @property
    def postings(self) -> int:
        return sum(len(terms) for terms, _ in self.fields.values())


def encode(p: Projection) -> bytes:
    parts = [MAGIC, struct.pack("<B", len(p.fields))]
    for code, (terms, tfs) in sorted(p.fields.items()):
        parts += [struct.pack("<BI", code, len(terms)), terms.astype("<i8").tobytes(), tfs.astype("<i4").tobytes()]
    model = p.model.encode()
    vec = p.vector if p.vector is not None else np.zeros(0, dtype=np.float32)
    parts += [struct.pack("<H", len(model)), model, struct.pack("<I", len(vec)), vec.astype("<f4").tobytes()]
    return b"".join(parts)


def decode(raw: bytes) -> Projection:
    if raw[:3] != MAGIC:
        raise ValueError("not a sealed projection")
    view, at = memoryview(raw), 4
    fields = {}
    for _ in range(raw[3]):
        code, n = struct.unpack_from("<BI", view, at)
        at += 5
        terms = np.frombuffer(view, dtype="<i8", count=n, offset=at)
        at += 8 * n
        tfs = np.frombuffer(view, dtype="<i4", count=n, offset=at)
        at += 4 * n
        fields[code] = (terms, tfs)
    (model_len,) = struct.unpack_from("<H", view, at)
    model = bytes(view[at + 2: at + 2 + model_len]).decode()
    at += 2 + model_len
    (dim,) = struct.unpack_from("<I", view, at)
    vector = np.frombuffer(view, dtype="<f4", count=dim, offset=at + 4) if model else None
    return Projection(fields, model, vector)


def seal_projection(key: bytes, record_id: str, p: Projection) -> bytes:
    return seal(key, encode(p), kind=SEAL_KIND, owner=record_id)


def open_projection(key: bytes, record_id: str, sealed: bytes) -> Projection:
    return decode(unseal(key, sealed, kind=SEAL_KIND, owner=record_id))
