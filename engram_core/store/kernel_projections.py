"""The sealed-projection members of the ``Tx`` port (``kernel.KernelTx``): a record's search
projection sealed under its own data key before the engine sees it (``projection.py``), opened
with the key when read, and the committed changes the search index follows (``changes.py``).

Split from ``kernel.py`` for size; ``KernelTx`` is this class with the kernel's other members.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.changes import (
    Posting,
    RecordIndexed,
    RecordUnindexed,
    ScopeProjectionsDropped,
    VectorIndexed,
)
from engram_core.store.engine import EngineTx, TxEffects
from engram_core.store.fields import FIELD_CODE
from engram_core.store.port import RecordRow
from engram_core.store.projection import Projection, open_projection, seal_projection


class _Kernel(Protocol):
    """What these members use of ``kernel.StoreKernel``."""

    def data_key(self, rec: RecordRow) -> bytes: ...
    def indexed_postings(self, scope: Scope, record_id: str) -> int | None: ...


class ProjectionMaintenance:
    """Sealed projections inside one transaction (the kernel's ``KernelTx``)."""

    _kernel: _Kernel
    _etx: EngineTx
    _effects: TxEffects
    _inserted: dict[str, RecordRow]

    def index_record(self, scope: Scope, record_id: str, fields: dict[str, Counter[int]],
                     vector: tuple[str, list[float]] | None = None) -> None:
        """The search projection of one accepted record (after ``insert_record``, in the same
        transaction): postings and the vector (model id, values), stored as one blob sealed under
        the record's own data key (store/projection.py), so a forget shreds them with the body."""
        inserted = self._inserted.get(record_id)
        if inserted is not None and inserted.state == "accepted_current":
            r = inserted
        else:  # a record inserted earlier (rebuild, restore), or whose state changed since
            found = self._etx.records(scope, [record_id]).get(record_id)
            if found is None:
                raise EngramError(Code.STORE_UNAVAILABLE, "index_record before insert_record")
            r = found
        projection = Projection.of({FIELD_CODE[name]: counts for name, counts in fields.items()},
                                   *(vector if vector is not None else ("", None)))
        sealed = seal_projection(self._kernel.data_key(r), record_id, projection)
        self._etx.put_projection(scope, record_id, sealed, new=inserted is not None)
        postings = tuple(Posting(term, name, tf, sum(counts.values()))
                         for name, counts in fields.items() for term, tf in counts.items())
        self._effects.changes.append(RecordIndexed(r, postings))
        if vector is not None:
            self._effects.changes.append(VectorIndexed(scope.tenant, scope.workspace, record_id, vector[0], vector[1]))

    def unindex_record(self, scope: Scope, record_id: str) -> int:
        """Delete the record's sealed projection; returns how many postings it held (as the
        committed index counts them, or, where this core's index does not hold the record, as
        its sealed projection does)."""
        removed = self._kernel.indexed_postings(scope, record_id)
        if removed is None:
            removed = self.postings_count(record_id)
        self._etx.delete_projection(record_id)
        self._effects.changes.append(RecordUnindexed(scope.tenant, scope.workspace, record_id))
        return removed

    def projection(self, record_id: str) -> Projection | None:
        """The record's search projection, opened with its data key (None: it has none)."""
        found = self._etx.projection_blob(record_id)
        if found is None:
            return None
        sealed, rec = found
        return open_projection(self._kernel.data_key(rec), record_id, sealed)

    def postings_count(self, record_id: str) -> int:
        projection = self.projection(record_id)
        return projection.postings if projection is not None else 0

    def vector_count(self, record_id: str) -> int:
        projection = self.projection(record_id)
        return int(projection is not None and projection.vector is not None)

    def _scope_projections(self, scope: Scope) -> Iterator[tuple[RecordRow, bytes, Projection]]:
        """Every sealed projection of a scope with its record row and data key, opened (maintenance)."""
        for rec, sealed in self._etx.scope_projection_blobs(scope):
            key = self._kernel.data_key(rec)
            yield rec, key, open_projection(key, rec.record_id, sealed)

    def reseal_projections(self, scope: Scope,
                           rewrite: Callable[[RecordRow, Projection], Projection | None]) -> int:
        """Replace the projection of every record in a scope with ``rewrite(record, projection)``
        (None: leave it). The search index is not told: the caller reloads it after the commit."""
        resealed = []
        for rec, key, old in self._scope_projections(scope):
            projection = rewrite(rec, old)
            if projection is not None:
                resealed.append((rec.record_id, seal_projection(key, rec.record_id, projection)))
        self._etx.update_projection_blobs(resealed)
        return len(resealed)

    def projection_counts(self, scope: Scope) -> dict[str, int]:
        """Postings and vectors in the scope's sealed projections (opened: maintenance only)."""
        counts = {"projections": 0, "postings": 0, "vectors": 0}
        for _, _, projection in self._scope_projections(scope):
            counts["projections"] += 1
            counts["postings"] += projection.postings
            counts["vectors"] += int(projection.vector is not None)
        return counts

    def drop_projections(self, scope: Scope) -> dict[str, int]:
        """Delete the sealed projections of one scope; returns what they held (postings, vectors)."""
        counts = self.projection_counts(scope)
        self._etx.drop_scope_projections(scope)
        self._effects.changes.append(ScopeProjectionsDropped(scope.tenant, scope.workspace))
        return counts
