"""A record's search projection, sealed under the record's own data key (SPEC §10).

Everything derived from a record's content — its postings (keyed term hashes, term
frequencies, field lengths) and its vector — is stored only as one AES-256-GCM blob
next to the sealed body, under the same per-record data key. Destroying that key (a
forget) shreds the projection in the file, the WAL and every backup at once: nothing
depends on DuckDB overwriting freed pages, which it does not do. The in-memory search
index is built from these blobs when the store opens.

Shared by every store engine: the format is a property of the data, not of DuckDB.

Format (little-endian), laid out so that opening 100k of them at start-up is a few slices per
record and one array conversion for all of them (``Parts``): ``b"EP2"``, u8 field count ``n``,
u8[n] field codes, u32[n] posting counts, int64[total] term hashes, int32[total] term
frequencies (fields in code order), u16 model-id length, the model id (UTF-8; empty: no vector),
u32 dimension, float32[dimension].
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engram_core.crypto.sealing import seal, unseal

MAGIC = b"EP2"
SEAL_KIND = "projection"  # associated data binds the kind and the record id (crypto.sealing)


class DataKeys(Protocol):
    """The part of the key vault the store needs to seal and open projections."""

    def data_key(self, slot: int, owner: str) -> bytes | None: ...

    def data_keys(self, wanted: list[tuple[int, str]]) -> dict[int, bytes]:
        """``data_key`` for many (slot, owner) pairs at once: the keys found, by slot."""
        ...

    def sync(self) -> None:
        """Make every slot written so far durable (before a commit that names new slots)."""
        ...


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


@dataclass(frozen=True)
class Parts:
    """A decoded projection's byte ranges, before any array is made (the index's loader joins
    them for all records and converts once)."""

    codes: bytes
    counts: tuple[int, ...]
    terms: bytes | memoryview
    tfs: bytes | memoryview
    model: str
    vector: bytes | memoryview


def encode(p: Projection) -> bytes:
    codes = sorted(p.fields)
    counts = [len(p.fields[c][0]) for c in codes]
    model = p.model.encode()
    vec = p.vector if p.vector is not None else np.zeros(0, dtype=np.float32)
    return b"".join([
        MAGIC, struct.pack(f"<B{len(codes)}B{len(codes)}I", len(codes), *codes, *counts),
        *(p.fields[c][0].astype("<i8").tobytes() for c in codes),
        *(p.fields[c][1].astype("<i4").tobytes() for c in codes),
        struct.pack("<H", len(model)), model, struct.pack("<I", len(vec)), vec.astype("<f4").tobytes(),
    ])


def split(raw: bytes | memoryview) -> Parts:
    """The projection's parts; given a memoryview, its byte ranges are views into it, not copies
    (the index builder appends them to its buffers at open)."""
    if raw[:3] != MAGIC:
        raise ValueError("not a sealed projection")
    n = raw[3]
    codes = bytes(raw[4:4 + n])
    counts = struct.unpack_from(f"<{n}I", raw, 4 + n)
    at = 4 + 5 * n
    total = sum(counts)
    terms, tfs = raw[at:at + 8 * total], raw[at + 8 * total:at + 12 * total]
    at += 12 * total
    (model_len,) = struct.unpack_from("<H", raw, at)
    model = bytes(raw[at + 2:at + 2 + model_len]).decode()
    at += 2 + model_len
    (dim,) = struct.unpack_from("<I", raw, at)
    return Parts(codes, counts, terms, tfs, model, raw[at + 4:at + 4 + 4 * dim] if model else b"")


def decode(raw: bytes) -> Projection:
    parts = split(raw)
    terms = np.frombuffer(parts.terms, dtype="<i8")
    tfs = np.frombuffer(parts.tfs, dtype="<i4")
    fields, at = {}, 0
    for code, n in zip(parts.codes, parts.counts, strict=True):
        fields[code] = (terms[at:at + n], tfs[at:at + n])
        at += n
    vector = np.frombuffer(parts.vector, dtype="<f4") if parts.model else None
    return Projection(fields, parts.model, vector)


def seal_projection(key: bytes, record_id: str, p: Projection) -> bytes:
    return seal(key, encode(p), kind=SEAL_KIND, owner=record_id)


def open_projection(key: bytes, record_id: str, sealed: bytes) -> Projection:
    return decode(unseal(key, sealed, kind=SEAL_KIND, owner=record_id))


def open_plain(key: bytes, record_id: str, sealed: bytes) -> bytes:
    """The opened projection's bytes (``encode``'s format), for ``split``."""
    return unseal(key, sealed, kind=SEAL_KIND, owner=record_id)
