"""Negative lookups without a database read: 64-bit digests of every key a table holds.

Most idempotency keys an agent sends are new, and most admitted content is neither current nor
forgotten already; finding that out cost a point read each, twice per mutation (before deciding,
and again under the writer lock). A ``KeyDigests`` holds a 64-bit digest of every key ever
written (a superset: rows rolled back or deleted stay in it), so ``absent`` here means absent in
the store, and only a possible hit (a real one, or a digest collision at ~n/2^64) goes to the
database. The engine fills it at open from the table and adds each key before the row that
carries it can commit.

The digest is the first 8 bytes of MD5 (little-endian) of the key's parts joined by NUL: a
fingerprint for lookups, not a security function (a collision costs one database read). It is
the same number DuckDB's ``md5_number_upper`` gives, so the table is read at open in one
vectorized query without a Python loop per row.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

MERGE_AT = 1 << 16  # keys added since the last merge into the sorted array


def key_digest(*parts: str) -> int:
    return int.from_bytes(hashlib.md5("\x00".join(parts).encode("utf-8"), usedforsecurity=False).digest()[:8],
                          "little")


class KeyDigests:
    """A superset of the keys a table holds, as 64-bit digests: a sorted array plus recent adds.

    Readers never lock: ``add`` publishes a merged array before it drops the set it merged, so a
    reader sees every key in one of the two."""

    def __init__(self, digests: np.ndarray | None = None) -> None:
        self._sorted = np.unique(digests.astype(np.uint64)) if digests is not None else np.empty(0, np.uint64)
        self._recent: set[int] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def add(self, *parts: str) -> None:
        d = key_digest(*parts)
        with self._lock:
            self._recent.add(d)
            if len(self._recent) >= MERGE_AT:
                recent = self._recent
                self._sorted = np.union1d(self._sorted, np.fromiter(recent, np.uint64, len(recent)))
                self._recent = set()

    def may_contain(self, *parts: str) -> bool:
        d = key_digest(*parts)
        recent, ordered = self._recent, self._sorted
        if d in recent:
            return True
        i = int(np.searchsorted(ordered, np.uint64(d)))
        return i < len(ordered) and int(ordered[i]) == d
