"""A statement written once with ``?`` placeholders, rendered for an engine's driver: DuckDB
takes ``?`` as written, psycopg ``%s``. Each statement is rendered once, then looked up."""

from __future__ import annotations


class Dialect:
    """An engine's paramstyle (``param``) and the largest value its ``seq`` columns compare with
    (``max_seq``: an open upper bound of a range)."""

    def __init__(self, name: str, param: str, *, max_seq: int) -> None:
        self.name = name
        self.param = param
        self.max_seq = max_seq
        self._rendered: dict[str, str] = {}

    def __call__(self, statement: str) -> str:
        """``statement`` (``?`` placeholders, no literal ``?`` or ``%``) in this dialect."""
        sql = self._rendered.get(statement)
        if sql is None:
            sql = self._rendered[statement] = statement.replace("?", self.param)
        return sql


DUCKDB = Dialect("duckdb", "?", max_seq=2**63)  # seq is UBIGINT there
POSTGRES = Dialect("postgresql", "%s", max_seq=2**63 - 1)  # BIGINT
