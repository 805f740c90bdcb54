"""Committed changes: what a transaction changed that the in-memory search index must follow.

The store kernel (``kernel.py``) hands these to the search index after a transaction
commits, never before (SPEC §5: a search never sees what is not durable). A transaction
collects them as it writes; a core serving a store that other processes also write
(PostgreSQL replicas) derives the same records from the database for the changes it did
not make itself (``kernel.StoreKernel.catch_up``). So each record says what changed in
terms of committed rows and sealed projections, not how a particular engine wrote it.

Identifiers, cursors and keyed term hashes only: no plaintext, as everything the index
holds (docs/search.md, "Projections").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engram_core.store.port import RecordRow

if TYPE_CHECKING:
    from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Posting:
    """One keyed term hash of one field of a record, with its frequency and the field's length."""

    term: int
    field: str
    tf: int
    field_len: int


@dataclass(frozen=True, slots=True)
class RecordIndexed:
    """An accepted record's projection entered the index: its committed row and postings."""

    row: RecordRow
    postings: tuple[Posting, ...]


@dataclass(frozen=True, slots=True)
class VectorIndexed:
    """A record's vector (semantic channel) under ``model``."""

    tenant: str
    workspace: str
    record_id: str
    model: str
    vector: Sequence[float] | NDArray[Any]  # float32 values as the sealed projection holds them


@dataclass(frozen=True, slots=True)
class RecordStateChanged:
    """A record changed lifecycle state (``current``: it is ``accepted_current`` now) at ``state_cursor``;
    ``body_dropped``: its sealed body is gone (the index's copy of its row must not be served)."""

    record_id: str
    current: bool
    state_cursor: int
    body_dropped: bool = False


@dataclass(frozen=True, slots=True)
class RecordRowChanged:
    """Something of a record's row other than its state changed (a trust class): the index's copy of
    the row is no longer the committed one."""

    record_id: str


@dataclass(frozen=True, slots=True)
class RecordUnindexed:
    """A record's projection is gone (forget)."""

    tenant: str
    workspace: str
    record_id: str


@dataclass(frozen=True, slots=True)
class ScopeProjectionsDropped:
    """Every projection of one scope is gone (``invalidate-projections``, before a rebuild)."""

    tenant: str
    workspace: str


Change = (RecordIndexed | VectorIndexed | RecordStateChanged | RecordRowChanged | RecordUnindexed
          | ScopeProjectionsDropped)
