"""Which scopes' search projections an operator invalidated and has not rebuilt yet (SPEC §3
PROJECTION_STALE; issue 18).

``admin invalidate-projections`` drops a scope's postings and vectors; until
``rebuild-projections`` re-derives them, a search there would rank nothing and
answer an empty page — an infrastructure state looking like "no match", which
the contract forbids. So the invalidation marks the scope (a ``store_meta`` row,
in the same transaction), searches there answer PROJECTION_STALE (retriable:
the rebuild is an operator's next step), and the rebuild clears the mark in its
transaction. ``get`` does not read projections and is unaffected. The marks are
loaded at open and mirrored in memory after each commit, so a search pays a set
lookup, not a statement. Where several cores share the store, a mark another core
set or cleared is read again when this core's copy of the scope may have missed
it (``Store.on_scope_refresh``): a search reads the scope's head and catches its
index up first, which sees the invalidation or rebuild event, and a scope loaded
afresh is read with its mark.
"""

from __future__ import annotations

import json
import threading

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.port import Store, Tx

_PREFIX = "projections_stale:"


def _key(scope: Scope) -> str:
    return _PREFIX + json.dumps([scope.tenant, scope.workspace])


class ProjectionStatus:
    def __init__(self, store: Store) -> None:
        self._lock = threading.Lock()
        with store.read() as tx:
            marks = tx.meta_with_prefix(_PREFIX)
        self._stale = {Scope(*json.loads(k[len(_PREFIX):])) for k, v in marks.items() if v == "1"}
        self._store = store
        store.on_scope_refresh = self._refresh

    def _refresh(self, scope: Scope) -> None:
        with self._store.read(snapshot=False) as tx:
            stale = tx.meta(_key(scope)) == "1"
        self.published(scope, stale=stale)

    def check(self, scope: Scope) -> None:
        """PROJECTION_STALE when the scope's projections were invalidated and not rebuilt."""
        if scope in self._stale:
            raise EngramError(Code.PROJECTION_STALE, "projections invalidated, not rebuilt")

    def mark(self, tx: Tx, scope: Scope, *, stale: bool) -> None:
        """Record the scope's status in the caller's transaction; ``published`` after it commits."""
        tx.set_meta(_key(scope), "1" if stale else "0")

    def published(self, scope: Scope, *, stale: bool) -> None:
        with self._lock:
            (self._stale.add if stale else self._stale.discard)(scope)
