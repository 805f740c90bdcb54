"""Usage counters the authorization policy decides quotas on (issue 18; SPEC §3 RATE_LIMITED).

Per principal (tenant, workspace, principal) and per scope (tenant, workspace), what agents do
(captures, admissions, searches, gets, withdrawals, forgets, and bytes stored) over sliding windows (a minute and an hour), each kept as ``BUCKETS`` buckets, so a count
leaves the window at most one bucket late and memory per subject is bounded. The policy reads
the counts (``input.usage``) and decides; limits live in ``data.json``.

Counters are soft: concurrent calls read the counts before either is counted, so a burst may
overshoot a limit by the number of calls in flight. One core keeps them in memory; where several
cores share one store the counters are the store's (``shared``: a bucket row per subject,
window, bucket and metric, added to by every core), so a principal's quota is one quota however
its calls are spread. A core holds its own adds back to send them with its next read of the
counts, in the same statement (one round trip for both, the read answering with them included;
a call's read itself rides in the round trip that claims its context's nonce, ``begin_read``),
or ``FLUSH_AFTER_S`` later when no read comes: other cores see a count that much later at most
(a burst may overshoot by that much more), and a core that dies loses its last ``FLUSH_AFTER_S``
of counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from engram_core.contract.scope import Scope

WINDOWS_MS: dict[str, int] = {"minute": 60_000, "hour": 3_600_000}
BUCKETS = 60
METRICS = ("captures", "admissions", "searches", "gets", "withdrawals", "forgets", "bytes_stored")
# Subjects idle longer than the longest window are dropped on the next sweep.
_SWEEP_EVERY_MS = 60_000
FLUSH_AFTER_S = 0.05  # a shared add not sent with a read by then is sent on its own
_FLUSHER_IDLE_S = 30.0  # the flusher thread ends after this long with nothing to send


class SharedUsage(Protocol):
    """Usage buckets in a store several cores share: each call one round trip for all its rows."""

    def add_usage(self, rows: list[tuple[str, str, int, str, int]]) -> None:
        """Add (subject, window, bucket start, metric, amount) rows to the buckets."""
        ...

    def usage_buckets(self, wanted: list[tuple[str, str, int]], *, adding: Sequence[tuple[str, str, int, str, int]] = (),
                      ) -> dict[tuple[str, str], list[tuple[int, str, int]]]:
        """For each (subject, window, floor): (bucket start, metric, total) of its buckets after the
        floor, as they were before ``adding`` (rows as ``add_usage`` takes them), which are added in
        the same round trip."""
        ...


Row = tuple[str, str, int, str, int]  # (subject, window, bucket start, metric, amount)


@dataclass(frozen=True)
class UsageRead:
    """A read of shared counts for one call, made ready to ride on another statement of the store
    (``Store.claim_context``): the buckets wanted, and the held-back adds sent with it."""

    scope: Scope
    principal: str
    now_ms: int
    wanted: list[tuple[str, str, int]]  # (subject, window, floor)
    adding: list[Row]


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


def _subject(key: tuple[str, ...]) -> str:
    return "\x00".join(key)


class QuotaCounters:
    def __init__(self, now_ms: Callable[[], int], *, shared: SharedUsage | None = None) -> None:
        self._now = now_ms
        self._shared = shared
        self._lock = threading.Lock()
        self._subjects: dict[tuple[str, ...], tuple[dict[str, _Window], list[int]]] = {}
        self._swept = 0
        # Shared adds not sent yet, and the thread that sends them when no read takes them.
        self._pending: list[tuple[str, str, int, str, int]] = []
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        # Held by the flusher from taking the held-back adds until the store has them: a read
        # waits for it, so adds the flusher took are committed before the read's statement
        # (else the read found them neither held back nor in the store: a principal's fourth
        # capture in a row was admitted under a limit of three when the flush fell between).
        self._sending = threading.Lock()

    def _take_pending(self) -> list[tuple[str, str, int, str, int]]:
        with self._lock:
            rows, self._pending = self._pending, []
            return rows

    def _requeue(self, rows: list[tuple[str, str, int, str, int]]) -> None:
        with self._lock:
            self._pending[:0] = rows

    def _flush_loop(self) -> None:
        while True:
            woke = self._wake.wait(_FLUSHER_IDLE_S)
            with self._lock:
                if not woke and not self._pending:
                    self._flusher = None
                    return
            time.sleep(FLUSH_AFTER_S)  # a read in the meantime takes them with it
            self._wake.clear()  # before taking: an add after this wakes the loop again
            with self._sending:
                rows = self._take_pending()
                if rows:
                    try:
                        self._shared.add_usage(rows)  # type: ignore[union-attr]
                    except Exception:  # noqa: BLE001 - the store is away: kept for the next read or flush
                        self._requeue(rows)

    def flush(self) -> None:
        """Send the held-back shared adds now (tests; a core closing)."""
        with self._sending:
            rows = self._take_pending()
            if rows and self._shared is not None:
                self._shared.add_usage(rows)

    @staticmethod
    def _keys(scope: Scope, principal: str) -> dict[str, tuple[str, ...]]:
        return {"principal": ("principal", scope.tenant, scope.workspace, principal),
                "scope": ("scope", scope.tenant, scope.workspace)}

    @property
    def shared(self) -> bool:
        """The counts are the store's (several cores), not this process's."""
        return self._shared is not None

    def begin_read(self, scope: Scope, principal: str) -> UsageRead:
        """A shared read of ``usage``'s counts, taking the held-back adds with it: hand it to the
        store with the statement it rides on, then to ``finish_read`` with what that answered, or
        to ``abandon_read`` when the statement failed (the adds are kept for the next read)."""
        now = self._now()
        keys = self._keys(scope, principal)
        floors = {name: now - (ms // BUCKETS) * BUCKETS for name, ms in WINDOWS_MS.items()}
        wanted = [(_subject(key), name, floor) for key in keys.values() for name, floor in floors.items()]
        with self._sending:  # a flush in flight lands first; the rest rides with this read
            adding = self._take_pending()
        return UsageRead(scope, principal, now, wanted, adding)

    def abandon_read(self, read: UsageRead) -> None:
        self._requeue(read.adding)

    def finish_read(self, read: UsageRead, found: dict[tuple[str, str], list[tuple[int, str, int]]],
                    ) -> dict[str, object]:
        """``usage``'s answer from the buckets the store read (as they were before ``read.adding``)."""
        found = {k: list(v) for k, v in found.items()}
        floor_of = {(s, w): f for s, w, f in read.wanted}
        for subject, window, start, metric, amount in read.adding:  # read as they were before these
            if (subject, window) in floor_of and start > floor_of[(subject, window)]:
                found.setdefault((subject, window), []).append((start, metric, amount))
        out: dict[str, object] = {"windows": {name: {"ms": ms} for name, ms in WINDOWS_MS.items()}}
        for subject, key in self._keys(read.scope, read.principal).items():
            out[subject] = {name: self._shared_window(found.get((_subject(key), name), []), name, read.now_ms)
                            for name in WINDOWS_MS}
        return out

    def usage(self, scope: Scope, principal: str) -> dict[str, object]:
        """``input.usage`` for the authz policy."""
        if self._shared is not None:
            read = self.begin_read(scope, principal)
            try:
                found = self._shared.usage_buckets(read.wanted, adding=read.adding)
            except BaseException:
                self.abandon_read(read)
                raise
            return self.finish_read(read, found)
        now = self._now()
        out: dict[str, object] = {"windows": {name: {"ms": ms} for name, ms in WINDOWS_MS.items()}}
        with self._lock:
            for subject, key in self._keys(scope, principal).items():
                entry = self._subjects.get(key)
                out[subject] = {name: (entry[0][name].usage(now) if entry else {**dict.fromkeys(METRICS, 0),
                                                                                 "retry_after_ms": 0})
                                for name in WINDOWS_MS}
        return out

    @staticmethod
    def _shared_window(buckets: list[tuple[int, str, int]], name: str, now: int) -> dict[str, int]:
        window = _Window.new(WINDOWS_MS[name])
        for start, metric, total in buckets:
            window.add(start, metric, total)
        return window.usage(now)

    def add(self, scope: Scope, principal: str, metric: str, amount: int = 1) -> None:
        now = self._now()
        if self._shared is not None:
            rows = [(_subject(key), name, now - now % (ms // BUCKETS), metric, amount)
                    for key in self._keys(scope, principal).values() for name, ms in WINDOWS_MS.items()]
            with self._lock:
                self._pending += rows
                if self._flusher is None:
                    self._flusher = threading.Thread(target=self._flush_loop, daemon=True, name="engram-usage-flush")
                    self._flusher.start()
            self._wake.set()
            return
        with self._lock:
            for key in self._keys(scope, principal).values():
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
