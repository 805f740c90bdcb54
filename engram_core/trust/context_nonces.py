"""The nonces of signed host contexts the core has accepted (SPEC §2: a replayed context
is refused like a bad one).

A signed context carries a random nonce under its signature. The first call that
presents it claims the nonce; any later presentation within the context's lifetime
is a replay. An entry is kept until its context expires (after that the context is
refused for its age anyway), so memory is bounded by the rate of calls times the
context lifetime (at most 300 s; the adapter asks far less).

**Partitions.** Entries are held per signing key, and per key in two lanes: maintenance
contexts (host principals with maintenance scopes, what ``engram admin`` signs) and every
other call. Each lane has a bound of its own: a key that floods the ledger (another
tenant's host, say) fills its own lane and is refused RATE_LIMITED there, while every
other key, and its own maintenance, keeps its full capacity. The bound is a refusal,
never an eviction: forgetting a live nonce would reopen its replay.

**Restarts.** Every call that acts writes an audit row naming its claim
(``AuditRow.context_nonce``: the key id and a digest of the nonce) before it answers, so the
store seeds the ledger at open from the audit rows of the last context lifetime: a context
used before a restart is a replay after it. (The calls that spend a context and write no row —
the tool listing, a CheckGated that answers, an undecodable request — are not seeded on a
single-writer core; docs/security.md says what that leaves.) Contexts issued before the process started (by
more than the clock-skew allowance) are refused as well. Where several cores share one
store, the store also claims each nonce in the database (docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import heapq
import threading

from engram_core.contract.errors import Code, EngramError

DEFAULT_CAPACITY = 100_000  # live nonces per signing key and lane
MAINTENANCE_LANE, CALLS_LANE = "maintenance", "calls"


def nonce_ref(key_id: str, nonce: str) -> str:
    """How a claimed nonce is named in the audit log and the ledger: the signing key and a
    digest of the nonce (the nonce itself never needs to be stored)."""
    return key_id + ":" + hashlib.sha256(nonce.encode()).hexdigest()[:32]


class ContextNonceLedger:
    """Single use of context nonces within their lifetime; bounded per key and lane, fails
    closed when a lane is full."""

    def __init__(self, *, started_at_ms: int, skew_ms: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._floor_ms = started_at_ms - skew_ms
        self._expiry: dict[str, int] = {}
        self._lane_of: dict[str, tuple[str, str]] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._heap: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)

    def lane_sizes(self) -> dict[tuple[str, str], int]:
        """Live nonces per (signing key, lane) (metrics and tests)."""
        with self._lock:
            return dict(self._counts)

    def claim(self, key_id: str, nonce: str, *, issued_at_ms: int, expires_at_ms: int, now_ms: int,
              lane: str = CALLS_LANE) -> str:
        """Claim a verified context's nonce; returns its ``nonce_ref``, or raises.

        TRUSTED_CONTEXT_UNAVAILABLE for a missing nonce, a nonce already claimed, or a
        context issued before this process could have seen its nonce; RATE_LIMITED when the
        key's lane is full of live entries.
        """
        if not nonce:
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context without nonce")
        if issued_at_ms < self._floor_ms:
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context issued before the core started")
        ref = nonce_ref(key_id, nonce)
        with self._lock:
            self._purge(now_ms)
            if ref in self._expiry:
                raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context replayed", reasons=("CONTEXT_REPLAYED",))
            partition = (key_id, lane)
            if self._counts.get(partition, 0) >= self._capacity:
                raise EngramError(Code.RATE_LIMITED, f"context nonce ledger full for key {key_id} ({lane})",
                                  reasons=("NONCE_LEDGER_FULL",))
            self._add(ref, partition, expires_at_ms)
        return ref

    def seed(self, refs: list[tuple[str, int]]) -> int:
        """Claims recorded before this process started: (nonce ref, until when it is live).
        Returns how many are live."""
        with self._lock:
            for ref, until_ms in refs:
                if ref not in self._expiry:
                    self._add(ref, (ref.rsplit(":", 1)[0], CALLS_LANE), until_ms)
            return len(self._expiry)

    def _add(self, ref: str, partition: tuple[str, str], expires_at_ms: int) -> None:
        self._expiry[ref] = expires_at_ms
        self._lane_of[ref] = partition
        self._counts[partition] = self._counts.get(partition, 0) + 1
        heapq.heappush(self._heap, (expires_at_ms, ref))

    def _purge(self, now_ms: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, ref = heapq.heappop(heap)
            if self._expiry.pop(ref, None) is not None:
                partition = self._lane_of.pop(ref)
                left = self._counts[partition] - 1
                if left:
                    self._counts[partition] = left
                else:
                    del self._counts[partition]
