"""The in-memory engine's tables: one committed state, copied by each write transaction.

A ``Tables`` holds every row the engine port persists, as the frozen rows of ``port.py`` (and
audit documents as given). A committed ``Tables`` is never changed: a write transaction works on
a copy (``copy``) and its commit publishes that copy whole, so a reader holding a committed state
(a snapshot) sees it unchanged for as long as it likes, and a failed transaction leaves nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from engram_core.store.port import (
    CandidateRow,
    Event,
    HostKeyRow,
    IdempotencyRow,
    KeyDestruction,
    RecordRow,
    ScopeRow,
)

ScopeKey = tuple[str, str]  # (tenant, workspace): the tables' key of a scope


@dataclass
class Tables:
    scopes: dict[ScopeKey, ScopeRow] = field(default_factory=dict)
    journal: dict[ScopeKey, list[Event]] = field(default_factory=dict)  # by cursor
    idempotency: dict[tuple[str, str, str, str], IdempotencyRow] = field(default_factory=dict)
    confirmations: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # grant -> (tenant, workspace, at)
    candidates: dict[str, CandidateRow] = field(default_factory=dict)
    records: dict[str, RecordRow] = field(default_factory=dict)
    tombstones: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    data_keys: dict[str, tuple[int, int]] = field(default_factory=dict)  # owner -> (slot, at_ms)
    destructions: dict[str, KeyDestruction] = field(default_factory=dict)
    families: dict[tuple[str, str, str, str], str] = field(default_factory=dict)  # (t, w, ref, record) -> kind
    sources: set[tuple[str, str, str, str]] = field(default_factory=set)  # (t, w, source, record)
    projections: dict[str, tuple[str, str, bytes]] = field(default_factory=dict)  # record -> (t, w, sealed)
    audit: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # chain -> seq -> document
    host_keys: dict[str, HostKeyRow] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    def copy(self) -> Tables:
        """A copy a write transaction may change (rows are frozen; containers are copied)."""
        return Tables(
            scopes=dict(self.scopes), journal={k: list(v) for k, v in self.journal.items()},
            idempotency=dict(self.idempotency), confirmations=dict(self.confirmations),
            candidates=dict(self.candidates), records=dict(self.records), tombstones=dict(self.tombstones),
            data_keys=dict(self.data_keys), destructions=dict(self.destructions), families=dict(self.families),
            sources=set(self.sources), projections=dict(self.projections),
            audit={k: dict(v) for k, v in self.audit.items()}, host_keys=dict(self.host_keys), meta=dict(self.meta))


def frozen_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """An audit document as stored: a copy nobody else holds (documents are dicts)."""
    return copy.deepcopy(doc)
