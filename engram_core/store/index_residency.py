"""Which scopes' search indexes a core holds, when scopes are loaded on first use.

A core over a shared store (PostgreSQL) may be asked about any scope, but it should not have to
hold every scope's index: the kernel loads a scope's index from its sealed projections the first
time a read needs it, and evicts the least recently used scopes when the records held exceed a
budget (``engram serve --index-max-records``; 0: no budget). The budget is in records, the unit
the index's memory grows by (docs/deployment.md, "Sizing": about 9 KB a record with its vector).
Eviction only forgets: the next read of an evicted scope loads it again, so a budget costs cold
reads, never a wrong answer. Not thread-safe by itself: the kernel holds its publish lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class ResidencyStats:
    """What the metrics report (engram_search_index_scopes_loaded, …_scope_loads_total, …)."""

    scopes_loaded: int
    records_loaded: int
    loads: int
    evictions: int
    max_records: int


class IndexResidency:
    """The loaded scopes, least recently used first, with the records each holds."""

    def __init__(self, max_records: int = 0) -> None:
        if max_records < 0:
            raise ValueError("the index budget is a number of records, 0 for none")
        self.max_records = max_records
        self._records: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._held = 0
        self._loads = 0
        self._evictions = 0

    def __contains__(self, scope: tuple[str, str]) -> bool:
        return scope in self._records

    def touch(self, scope: tuple[str, str]) -> None:
        """A read used the scope: it is the most recently used now."""
        if scope in self._records:
            self._records.move_to_end(scope)

    def loaded(self, scope: tuple[str, str], records: int) -> None:
        """The scope's index was loaded (or reloaded) holding ``records``."""
        self._held += records - self._records.pop(scope, 0)
        self._records[scope] = records
        self._loads += 1

    def resized(self, scope: tuple[str, str], records: int) -> None:
        """The scope's record count changed by commits applied to its loaded index."""
        if scope in self._records:
            self._held += records - self._records[scope]
            self._records[scope] = records

    def victims(self, keep: tuple[str, str]) -> list[tuple[str, str]]:
        """The least recently used scopes to evict (never ``keep``) until the budget holds; they
        are forgotten here, and the caller drops their indexes."""
        out: list[tuple[str, str]] = []
        if not self.max_records:
            return out
        for scope in list(self._records):
            if self._held <= self.max_records:
                break
            if scope == keep:
                continue
            self._held -= self._records.pop(scope)
            self._evictions += 1
            out.append(scope)
        return out

    def clear(self) -> None:
        self._records.clear()
        self._held = 0

    def stats(self) -> ResidencyStats:
        return ResidencyStats(scopes_loaded=len(self._records), records_loaded=self._held, loads=self._loads,
                              evictions=self._evictions, max_records=self.max_records)
