"""What DuckDB would refuse, found before a batch is answered from the intent log.

A batch committed at once learns at its flush that a row breaks a constraint, and refuses every
member (nothing answered). A batch answered from the intent log flushes later, after the answer:
a row DuckDB refused then would be an answered write lost, and a frame the next open could not
apply. So each segment's rows are checked against the constraints the schema declares (the
schema has primary keys and NOT NULL columns, nothing else: ``tables``), before its frame is
written: a NOT NULL column given None, or a primary key already in the batch or in the database
(one statement for the segment's keys), refuses the segment as its flush would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from engram_core.contract.errors import Code, EngramError
from engram_core.store.key_digests import KeyDigests

# Keys never in the database already, so not looked up there (the batch's own set still checks
# them): drawn from heads the writer holds under its lock (a scope's next cursor, a chain's next
# sequence number), or at random (a candidate id: 128 random bits, ``services.core.new_id``).
_DRAWN = {"journal", "audit", "candidates"}


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    key: tuple[str, ...]
    not_null: frozenset[str]
    text_key: bool  # every key column VARCHAR: its keys have digests (key_digests.py)


def tables(con: duckdb.DuckDBPyConnection) -> dict[str, Table]:
    """The main schema's tables: columns in order, primary key, NOT NULL columns."""
    columns: dict[str, list[str]] = {}
    not_null: dict[str, set[str]] = {}
    text: dict[str, set[str]] = {}
    for table, name, nullable, type_ in con.execute(
            "SELECT table_name, column_name, is_nullable, data_type FROM duckdb_columns() WHERE schema_name = 'main' "
            "AND NOT internal ORDER BY table_name, column_index").fetchall():
        columns.setdefault(table, []).append(name)
        if not nullable:
            not_null.setdefault(table, set()).add(name)
        if type_ == "VARCHAR":
            text.setdefault(table, set()).add(name)
    keys = {table: tuple(names) for table, names in con.execute(
        "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
        "WHERE schema_name = 'main' AND constraint_type = 'PRIMARY KEY'").fetchall()}
    return {t: Table(tuple(cols), keys.get(t, ()), frozenset(not_null.get(t, ())),
                     bool(keys.get(t)) and set(keys[t]) <= text.get(t, set()))
            for t, cols in columns.items()}


def _names(cols: str, table: Table) -> tuple[str, ...]:
    return tuple(c.strip() for c in cols.strip("() ").split(",")) if cols else table.columns


@dataclass
class BatchKeys:
    """Primary keys the open batch inserts (answered segments and the current one), and those it
    deletes by key (the delete runs before any later insert of its table: ``Batch.apply``)."""

    inserted: dict[str, set[tuple[Any, ...]]] = field(default_factory=dict)
    deleted: dict[str, set[tuple[Any, ...]]] = field(default_factory=dict)

    def check(self, committed: duckdb.DuckDBPyConnection, schema: dict[str, Table],
              ops: list[tuple[Any, ...]], digests: dict[str, KeyDigests]) -> None:
        """Raise STORE_UNAVAILABLE (nothing of the segment happens; retry) if a row of ``ops``
        would be refused at the flush; else remember its keys. ``committed``: a cursor of its own
        (the committed state: the batch's own rows, flushed or not, are what this remembers)."""
        added: dict[str, set[tuple[Any, ...]]] = {}
        removed: dict[str, set[tuple[Any, ...]]] = {}
        fresh: dict[str, set[tuple[Any, ...]]] = {}  # plain INSERTs' keys to look up in the database
        for op in ops:
            if op[0] == "delete":
                _, table, col, key = op
                spec = schema.get(table)
                if spec is not None and spec.key == (col,):
                    added.get(table, set()).discard((key,))
                    removed.setdefault(table, set()).add((key,))
                continue
            if op[0] != "row" or (spec := schema.get(table := op[1])) is None:
                continue
            _, _, verb, cols, values = op
            row = dict(zip(_names(cols, spec), values, strict=False))
            if any(row.get(c) is None for c in spec.not_null):
                raise _refused(f"{table}: a NOT NULL column without a value")
            if not spec.key:
                continue
            key = tuple(row.get(c) for c in spec.key)
            if verb == "INSERT":
                held = key in added.get(table, ()) or (key in self.inserted.get(table, ())
                                                       and key not in removed.get(table, ()))
                if held:
                    raise _refused(f"{table}: a primary key written twice in one batch")
                gone = key in self.deleted.get(table, ()) or key in removed.get(table, ())
                known = digests.get(table)
                if table not in _DRAWN and not gone and (known is None or known.may_contain(*key)):
                    fresh.setdefault(table, set()).add(key)
            added.setdefault(table, set()).add(key)
        _absent(committed, schema, fresh)
        for table, keys in added.items():
            if (known := digests.get(table)) is not None:
                for key in keys:
                    known.add(*key)
        for table, keys in removed.items():
            self.inserted.get(table, set()).difference_update(keys)
            self.deleted.setdefault(table, set()).update(keys)
        for table, keys in added.items():
            self.inserted.setdefault(table, set()).update(keys)


def _absent(con: duckdb.DuckDBPyConnection, schema: dict[str, Table], keys: dict[str, set[tuple[Any, ...]]]) -> None:
    """One statement: raise if any of ``keys`` is in its table already."""
    parts, params = [], []
    for table, found in keys.items():
        cols = schema[table].key
        if len(cols) == 1:  # an IN list: the key's index answers it
            parts.append(f"SELECT '{table}' FROM {table} WHERE {cols[0]} IN ({', '.join('?' * len(found))})")
        else:
            one = "(" + " AND ".join(f"{c} = ?" for c in cols) + ")"
            parts.append(f"SELECT '{table}' FROM {table} WHERE " + " OR ".join([one] * len(found)))
        params += [v for key in found for v in key]
    if not parts:
        return
    hit = con.execute(" UNION ALL ".join(parts) + " LIMIT 1", params).fetchall()
    if hit:
        raise _refused(f"{hit[0][0]}: a primary key already stored")


def _refused(why: str) -> EngramError:
    return EngramError(Code.STORE_UNAVAILABLE, f"write batch refused before its answer: {why}")


class AnswerCheck:
    """The engine's: the schema, a cursor on the committed state, and digests of every primary
    key of the tables it looks up (key_digests.py: a superset, so ``absent`` needs no read and only
    a possible hit goes to the database). The digests hold every key a batch wrote (``noted``) or
    a check passed; any other write to those tables (a statement by condition, a transaction of
    its own, a migration) makes them stale, and the next check reads them again."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.schema = tables(con)
        self._cur = con.cursor()
        self._digests: dict[str, KeyDigests] | None = None

    def _load(self) -> dict[str, KeyDigests]:
        out = {}
        for table, spec in self.schema.items():
            if spec.key and spec.text_key and table not in _DRAWN:
                out[table] = KeyDigests(self._cur.execute(
                    f"SELECT md5_number_upper(concat_ws(chr(0), {', '.join(spec.key)})) AS d FROM {table}"
                ).fetchnumpy()["d"])
        return out

    def check(self, keys: BatchKeys, ops: list[tuple[Any, ...]]) -> None:
        if self._digests is None:
            self._digests = self._load()
        keys.check(self._cur, self.schema, ops, self._digests)

    def noted(self, ops: list[tuple[Any, ...]]) -> None:
        """A batch commits ``ops`` without a check: their keys join the digests."""
        digests = self._digests
        if digests is None:
            return
        for op in ops:
            if op[0] == "row" and (known := digests.get(op[1])) is not None:
                spec = self.schema[op[1]]
                row = dict(zip(_names(op[3], spec), op[4], strict=False))
                known.add(*(str(row.get(c)) for c in spec.key))
            elif op[0] == "sql" and op[3] & digests.keys():
                self._digests = None
                return

    def stale(self) -> None:
        self._digests = None
