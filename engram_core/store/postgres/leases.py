"""Leader leases of the jobs one core at a time runs (``Store.leader_lease``), on PostgreSQL.

A lease is a session-level ``pg_try_advisory_lock`` on a connection of its own (not one of the
engine's pool: a pooled connection goes back to the pool, and a session lock with it). Each job
has a lock key of its own (``lock_key``), so leases of different jobs are independent.

**Held while leader**, not taken and released every tick: the core that took a lease keeps it
from tick to tick for as long as its session lives, so one core leads a job steadily (its log
says so once, ``leads job``), a tick of the leader costs one round trip (``SELECT 1``: the
session, and with it the lock, is still there) and a tick of any other core one round trip
(``pg_try_advisory_lock``, refused at once). Releasing at the end of each tick would cost the
leader two round trips and hand the job to whichever core ticks first, with no gain: a core
that dies ends its session either way, and PostgreSQL releases a session's locks when it ends.

How fast another core takes over: a process that dies (SIGKILL, a crash) has its socket closed
by its kernel, so PostgreSQL ends the session at once and the next tick of another core takes
the lease (tests/scale/test_leader_jobs.py measures it). A host that vanishes without closing its
sockets is noticed by the server's TCP keepalives, which this session sets short
(``KEEPALIVE_*``: about 25 s). A session the server cut (a restart, an administrator's
``pg_terminate_backend``) is noticed by the leader at its next tick: it stops leading (its log
says so) and tries to take the lease again on a new session, like every other core.
"""

from __future__ import annotations

import logging
import threading
import zlib

import psycopg

from engram_core.store.postgres.pool import failure

log = logging.getLogger("engram.leases")

# The server notices a peer that vanished without closing its socket after about
# IDLE + INTERVAL * COUNT seconds, and the lease is then free (SET per session: no server setting).
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 10, 5, 3
_ENGRAM = 0x656E6772  # "engr", as the migration and ring locks (migrations.py), whose low half differs
_LEASE_TAG = 0x01000000  # the low half of every lease key starts so (0x616D.... is the other locks')


def lock_key(job: str) -> int:
    """The advisory lock key of ``job``'s lease: stable across cores and versions (a CRC of the
    name), apart from the migration and ring locks."""
    return (_ENGRAM << 32) | _LEASE_TAG | (zlib.crc32(job.encode()) & 0x00FFFFFF)


class LeaderLeases:
    """The leases this core holds, on one session of their own (opened at the first tick).

    ``conninfo``: the engine's (no password: ``pool.check_conninfo`` refused one already)."""

    def __init__(self, conninfo: str, *, connect_timeout_s: float) -> None:
        self._conninfo = conninfo
        self._connect_timeout_s = connect_timeout_s
        self._lock = threading.Lock()  # one statement at a time on the session
        self._conn: psycopg.Connection | None = None
        self._held: set[str] = set()
        self._closed = False

    def _session(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=int(self._connect_timeout_s),
                                   application_name="engram-leases")
            for sql in (f"SET tcp_keepalives_idle = {KEEPALIVE_IDLE_S}",
                        f"SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL_S}",
                        f"SET tcp_keepalives_count = {KEEPALIVE_COUNT}",
                        # An operator's idle_session_timeout would end the session between ticks
                        # and hand the lease to another core each time.
                        "SET idle_session_timeout = 0"):
                conn.execute(sql)  # type: ignore[arg-type]
            self._conn = conn
        return self._conn

    def hold(self, job: str) -> bool:
        """Whether this core holds ``job``'s lease now: kept if it held it and its session lives,
        taken if nobody holds it; False (never raising) when another core holds it or the
        database cannot be reached."""
        with self._lock:
            if self._closed:
                return False
            try:
                conn = self._session()
                if job in self._held:
                    conn.execute("SELECT 1")  # the session lives: its lock is still ours
                    return True
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", [lock_key(job)]).fetchone()
            except psycopg.Error as exc:
                self._lost(failure(exc))
                return False
            if row is not None and row[0]:
                self._held.add(job)
                log.info("this core leads job %s (leader lease taken)", job)
                return True
            return False

    def held(self) -> list[str]:
        """The jobs this core leads (as of its last tick of each)."""
        with self._lock:
            return sorted(self._held)

    def _lost(self, why: str) -> None:
        """The session failed: every lease on it is gone (the server released them with it)."""
        for job in sorted(self._held):
            log.warning("this core no longer leads job %s (its lease session failed: %s)", job, why)
        self._held.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def close(self) -> None:
        """Give every lease up: another core takes over at its next tick. Released by a statement
        before the session ends, since the server ends a closed session's backend (and frees its
        locks) only some time after the client's close returned."""
        with self._lock:
            self._closed = True
            held, self._held = bool(self._held), set()
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if held:
                    conn.execute("SELECT pg_advisory_unlock_all()")
                conn.close()
            except psycopg.Error:
                pass
