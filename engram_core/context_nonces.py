"""The nonces of signed host contexts the core has accepted (SPEC §2: a replayed context
is refused like a bad one).

A signed context carries a random nonce under its signature. The first call that
presents it claims the nonce; any later presentation within the context's lifetime
is a replay. An entry is kept until its context expires — after that the context is
refused for its age anyway — so memory is bounded by the rate of calls times the
context lifetime (≤ 300 s, the adapter asks far less), and a hard capacity on top.

Process-local, and deliberately so: one core process is the only writer of its
store. A restart forgets the ledger; contexts issued before the process started
(beyond the clock-skew allowance) are therefore refused by ``claim`` as well, so a
context captured before a restart cannot be replayed after it.
"""

from __future__ import annotations

import heapq
import threading

from engram_core.errors import Code, EngramError

DEFAULT_CAPACITY = 100_000


class ContextNonceLedger:
    """Single use of context nonces within their lifetime; bounded, fails closed when full.

    Full means ``capacity`` unexpired contexts were accepted within one context
    lifetime: a new one is then refused (RATE_LIMITED, retriable) rather than a live
    entry evicted, because forgetting a live nonce would reopen its replay.
    """

    def __init__(self, *, started_at_ms: int, skew_ms: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._floor_ms = started_at_ms - skew_ms
        self._expiry: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)

    def claim(self, key_id: str, nonce: str, *, issued_at_ms: int, expires_at_ms: int, now_ms: int) -> None:
        """Claim a verified context's nonce, or raise.

        TRUSTED_CONTEXT_UNAVAILABLE for a missing nonce, a nonce already claimed, or a
        context issued before this process could have seen its nonce; RATE_LIMITED when
        the ledger is full of live entries.
        """
        if not nonce:
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context without nonce")
        if issued_at_ms < self._floor_ms:
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context issued before the core started")
        entry = key_id + "/" + nonce
        with self._lock:
            self._purge(now_ms)
            if entry in self._expiry:
                raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context replayed")
            if len(self._expiry) >= self._capacity:
                raise EngramError(Code.RATE_LIMITED, "context nonce ledger full")
            self._expiry[entry] = expires_at_ms
            heapq.heappush(self._heap, (expires_at_ms, entry))

    def _purge(self, now_ms: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            _, entry = heapq.heappop(heap)
            self._expiry.pop(entry, None)
