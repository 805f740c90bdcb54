"""Connections to the store's database: a bounded ``psycopg_pool.ConnectionPool`` with what the
engine and the key vault both need of it.

- Bounded: ``size`` connections at most, a caller waiting longer than ``timeout_s`` for one is
  refused (STORE_UNAVAILABLE) rather than queued without end.
- Autocommit connections: the engine sends its own BEGIN/COMMIT, in the same pipeline as its
  statements (one round trip where a driver-made BEGIN would cost one more).
- Durable commits: a database whose default is ``synchronous_commit = off`` would acknowledge
  what a crash then loses; such a session is set to ``on`` (anything stronger is kept).
- A connection idle longer than ``IDLE_CHECK_S`` answers an empty query before it is handed
  out; one that does not is replaced, so a database restarted meanwhile fails no caller.
- Connection strings never carry a password (``check_conninfo``); what is logged or shown of
  one is ``redacted_location``.
"""

from __future__ import annotations

import select
import time

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from engram_core.contract.errors import Code, EngramError

IDLE_CHECK_S = 5.0


def failure(exc: BaseException) -> str:
    """A failure's kind, never its message (PostgreSQL's messages quote the values of a row)."""
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} {state}" if state else type(exc).__name__


def redacted_location(conninfo: str) -> str:
    """Where the store is, for logs and the start-up summary: host, port, database, user or
    service, never a password or any other parameter."""
    try:
        params = pg_conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "postgresql (unparsable connection string)"
    if "service" in params:
        return f"postgresql service={params['service']}"
    host, port = params.get("host", "localhost"), params.get("port", "5432")
    return f"postgresql://{params.get('user', '')}@{host}:{port}/{params.get('dbname', '')}"


def check_conninfo(conninfo: str) -> None:
    """Refuse a connection string that carries a password (SPEC §13: credentials are never
    stored, and a connection string ends up in process listings and logs): PGPASSFILE or the
    libpq environment give it to libpq instead."""
    try:
        params = pg_conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"not a libpq connection string or URL: {failure(exc)}") from None
    if params.get("password"):
        raise ValueError("the PostgreSQL connection string holds a password; give it through PGPASSFILE "
                         "(or the libpq environment) instead")


def _readable(conn: psycopg.Connection) -> bool:
    """An idle connection the server wrote to: it closed it (a restart, an administrator's
    termination, the idle timeout) or sent a notice; either way it is checked before use, since a
    transaction whose first round trip holds its COMMIT must not go out on a dead connection."""
    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


class Pool:
    """A bounded pool of autocommit connections (see the module docstring)."""

    def __init__(self, conninfo: str, *, name: str, size: int, settings: list[str], connect_timeout_s: float,
                 timeout_s: float) -> None:
        check_conninfo(conninfo)
        self.location = redacted_location(conninfo)
        self._settings = settings
        self._idle_since: dict[int, float] = {}
        self._pool = ConnectionPool(conninfo, min_size=min(2, size), max_size=size, open=False, name=name,
                                    timeout=timeout_s, kwargs={"autocommit": True}, configure=self._configure,
                                    check=self._check)
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout:
            self._pool.close()
            raise EngramError(Code.STORE_UNAVAILABLE, f"PostgreSQL unreachable: {self.location}") from None

    def _configure(self, conn: psycopg.Connection) -> None:
        for sql in self._settings:
            conn.execute(sql)  # type: ignore[arg-type]
        if conn.execute("SHOW synchronous_commit").fetchone()[0] == "off":  # type: ignore[index]
            conn.execute("SET synchronous_commit = on")

    def _check(self, conn: psycopg.Connection) -> None:
        since = self._idle_since.pop(id(conn), None)
        if since is None or time.monotonic() - since > IDLE_CHECK_S or _readable(conn):
            conn.execute("")  # raising, the pool discards it and hands out another

    def get(self) -> psycopg.Connection:
        try:
            return self._pool.getconn()
        except PoolTimeout:
            raise EngramError(Code.STORE_UNAVAILABLE, "no store connection available") from None
        except psycopg.Error as exc:
            raise EngramError(Code.STORE_UNAVAILABLE, f"store connection failed: {failure(exc)}") from None

    def put(self, conn: psycopg.Connection) -> None:
        if not conn.broken and not conn.closed:
            self._idle_since[id(conn)] = time.monotonic()
        self._pool.putconn(conn)

    def discard(self, conn: psycopg.Connection) -> None:
        """Close ``conn`` and give it back: the pool drops it and makes another."""
        self._idle_since.pop(id(conn), None)
        try:
            conn.close()
        finally:
            self._pool.putconn(conn)

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def close(self) -> None:
        self._pool.close()
