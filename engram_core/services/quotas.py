"""Usage counters the authorization policy decides quotas on (issue 18; SPEC §3 RATE_LIMITED).

The core counts, per principal (tenant, workspace, principal) and per scope
(tenant, workspace), what agents do — captures, admissions, searches, gets,
withdrawals, forgets and bytes stored (effective payload bytes of committed
captures) — over sliding
windows (a minute and an hour), and hands the counts to the authz policy with
every agent tool call (``input.usage``). The policy decides: it may deny with
``retry_after_ms`` in its answer, which the core turns into RATE_LIMITED
(retriable; over gRPC with a ``google.rpc.RetryInfo`` detail). Limits live in
``data.json``, not here.

Counters are in memory (per core process, lost at restart, not shared between
cores) and soft: concurrent calls read the counts before either is counted, so
a burst may overshoot a limit by the number of calls in flight. Each window is
kept as ``BUCKETS`` buckets, so a count leaves the window at most one bucket
late, and memory per subject is bounded (buckets, not events). The clock is
injected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from engram_core.errors import Code, EngramError

WINDOWS_MS: dict[str, int] = {"minute": 60_000, "hour": 3_600_000}
BUCKETS = 60
METRICS = ("captures", "admissions", "searches", "gets", "withdrawals", "forgets", "bytes_stored")
# Which counter an agent tool adds one to once it is authorized. The check a host makes before a
# human is asked to confirm a withdraw or forget (HostService.CheckGated) is authorized as that
# tool and counts as a call of it (issue 26.7: a principal out of quota made hundreds of them).
TOOL_METRIC: dict[str, str] = {
    "engram_memory_capture": "captures",
    "engram_memory_request_admission": "admissions",
    "engram_memory_search": "searches",
    "engram_memory_get": "gets",
    "engram_memory_withdraw": "withdrawals",
    "engram_memory_forget": "forgets",
}
# Subjects idle longer than the longest window are dropped on the next sweep.
_SWEEP_EVERY_MS = 60_000


class RateLimited(EngramError):
    """RATE_LIMITED with the policy's retry-after (travels as gRPC RetryInfo)."""

    def __init__(self, retry_after_ms: int, detail: str = "") -> None:
        super().__init__(Code.RATE_LIMITED, detail)
        self.retry_after_ms = max(0, int(retry_after_ms))


@dataclass
class _Window:
    """One sliding window as ring buckets: bucket start time and per-metric sums."""

    width_ms: int
    starts: list[int]
    sums: list[dict[str, int]]

    @classmethod
    def new(cls, window_ms: int) -> _Window:
        return cls(window_ms // BUCKETS, [-1] * BUCKETS, [{} for _ in range(BUCKETS)])

    def add(self, now_ms: int, metric: str, amount: int) -> None:
        start = now_ms - now_ms % self.width_ms
        i = (start // self.width_ms) % BUCKETS
        if self.starts[i] != start:
            self.starts[i], self.sums[i] = start, {}
        self.sums[i][metric] = self.sums[i].get(metric, 0) + amount

    def usage(self, now_ms: int) -> dict[str, int]:
        """Counts over the window ending now, and when the oldest counted bucket leaves it."""
        floor = now_ms - self.width_ms * BUCKETS
        totals = dict.fromkeys(METRICS, 0)
        oldest = None
        for start, sums in zip(self.starts, self.sums, strict=True):
            if start > floor and sums:
                for k, v in sums.items():
                    totals[k] = totals.get(k, 0) + v
                oldest = start if oldest is None else min(oldest, start)
        # The earliest moment any count drops out: retry-after material for the policy.
        totals["retry_after_ms"] = (oldest + self.width_ms * BUCKETS - now_ms) if oldest is not None else 0
        return totals


class QuotaCounters:
    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now = now_ms
        self._lock = threading.Lock()
        self._subjects: dict[tuple[str, ...], tuple[dict[str, _Window], list[int]]] = {}
        self._swept = 0

    @staticmethod
    def _keys(tenant: str, workspace: str, principal: str) -> dict[str, tuple[str, ...]]:
        return {"principal": ("principal", tenant, workspace, principal), "scope": ("scope", tenant, workspace)}

    def usage(self, tenant: str, workspace: str, principal: str) -> dict[str, object]:
        """``input.usage`` for the authz policy."""
        now = self._now()
        out: dict[str, object] = {"windows": {name: {"ms": ms} for name, ms in WINDOWS_MS.items()}}
        with self._lock:
            for subject, key in self._keys(tenant, workspace, principal).items():
                entry = self._subjects.get(key)
                out[subject] = {name: (entry[0][name].usage(now) if entry else {**dict.fromkeys(METRICS, 0),
                                                                                 "retry_after_ms": 0})
                                for name in WINDOWS_MS}
        return out

    def add(self, tenant: str, workspace: str, principal: str, metric: str, amount: int = 1) -> None:
        now = self._now()
        with self._lock:
            for key in self._keys(tenant, workspace, principal).values():
                entry = self._subjects.get(key)
                if entry is None:
                    entry = self._subjects[key] = ({n: _Window.new(ms) for n, ms in WINDOWS_MS.items()}, [now])
                for window in entry[0].values():
                    window.add(now, metric, amount)
                entry[1][0] = now
            if now - self._swept > _SWEEP_EVERY_MS:
                self._swept = now
                horizon = now - max(WINDOWS_MS.values())
                for key in [k for k, (_, seen) in self._subjects.items() if seen[0] < horizon]:
                    del self._subjects[key]
