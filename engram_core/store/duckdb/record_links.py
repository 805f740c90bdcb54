"""Record links: reconciliation-family membership and derivative sources (SPEC §5, §9).

Both are facts of a record's payload that governance needs without opening
sealed bodies: which families a record names (with the kind of its primary
component), and which records of the same scope its citations name as their
source. They hold identifiers and labels only, never text. They are written in
the admission transaction, re-derived from the sealed bodies by
``rebuild_projections`` and restore, and dropped when the record is tombstoned.

Almost no record has a link, yet every forget asked (its derivatives, then two
deletes: ~1 ms). The store keeps the ids that appear in a link (``linked_ids``,
read at open, added to before a link row can commit, never removed: a
superset), so an id outside it needs no statement at all.
"""

from __future__ import annotations

from typing import Any, Protocol

from engram_core.contract.scope import Scope
from engram_core.store.port import RecordRow
from engram_core.store.sql.codecs import RECORD_COLS, RECORD_WIDTH, record_of


class _Linked(Protocol):
    linked_ids: set[str]


class RecordLinks:
    """Mixin of ``DuckDBEngineTx`` (uses its ``_all``, ``_exec``, ``_insert`` and its store's ``linked_ids``)."""

    _store: _Linked

    def _all(self, sql: str, params: list[Any] | tuple = ()) -> list[tuple]: ...  # provided by DuckDBEngineTx

    def _exec(self, sql: str, params: list[Any] | tuple = ()) -> None: ...  # provided by DuckDBEngineTx

    def _insert(self, table: str, values: list[Any], *, verb: str = "INSERT", cols: str = "") -> None: ...

    def add_record_links(self, scope: Scope, record_id: str, *, family_refs: list[str],
                         primary_kind: str, source_ids: list[str]) -> None:
        if family_refs or source_ids:
            self._store.linked_ids.update([record_id, *source_ids])  # before the rows can commit
        for ref in family_refs:
            self._insert("record_families", [scope.tenant, scope.workspace, ref, record_id, primary_kind], verb="INSERT OR IGNORE")
        for source in source_ids:
            self._insert("record_sources", [scope.tenant, scope.workspace, source, record_id], verb="INSERT OR IGNORE")

    def drop_record_links(self, record_id: str) -> None:
        """A tombstoned record names no family and derives from nothing any more."""
        if record_id not in self._store.linked_ids:
            return
        self._exec("DELETE FROM record_families WHERE record_id = ?", [record_id])
        self._exec("DELETE FROM record_sources WHERE record_id = ? OR source_id = ?", [record_id, record_id])

    def family_members(self, scope: Scope, family_refs: list[str],
                       states: tuple[str, ...]) -> list[tuple[RecordRow, str, list[str]]]:
        """Records in ``states`` sharing a family with ``family_refs``: (row, primary kind, shared
        family refs sorted), ordered by record id."""
        if not family_refs:
            return []
        rows = self._all(
            f"SELECT {', '.join('r.' + c.strip() for c in RECORD_COLS.split(','))}, f.primary_kind, "
            "list_sort(list(f.family_ref)) FROM record_families f JOIN records r ON r.record_id = f.record_id "
            "WHERE f.tenant = ? AND f.workspace = ? AND f.family_ref IN (SELECT unnest(?::VARCHAR[])) "
            "AND r.state IN (SELECT unnest(?::VARCHAR[])) "
            "GROUP BY ALL ORDER BY r.record_id",
            [scope.tenant, scope.workspace, list(family_refs), list(states)],
        )
        return [(record_of(r), r[RECORD_WIDTH], list(r[RECORD_WIDTH + 1])) for r in rows
                if r[1] == scope.tenant and r[2] == scope.workspace]

    def derivatives(self, scope: Scope, source_id: str) -> list[RecordRow]:
        """Records of the scope whose citations name ``source_id`` as their source, by record id."""
        if source_id not in self._store.linked_ids:
            return []
        # The links first, alone: almost always none, and the join with records costs ~3 ms even then.
        linked = [r[0] for r in self._all(
            "SELECT record_id FROM record_sources WHERE tenant = ? AND workspace = ? AND source_id = ?",
            [scope.tenant, scope.workspace, source_id])]
        if not linked:
            return []
        rows = self._all(
            f"SELECT {', '.join('r.' + c.strip() for c in RECORD_COLS.split(','))} FROM records r "
            "WHERE r.record_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY r.record_id",
            [linked],
        )
        return [record_of(r) for r in rows if r[1] == scope.tenant and r[2] == scope.workspace]
