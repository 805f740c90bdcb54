"""Commit announcements between cores over one PostgreSQL database (LISTEN/NOTIFY), so that a
core's search index catches up with another core's write before a read needs it.

**Advisory only.** Read-your-writes does not rest on this: every read on a core whose database
other cores write checks the scope's head and catches up before it answers
(``StoreKernel.catch_up``). A notification can arrive before the writer's COMMIT returned, be
late, or be lost with a session (a restart); each of those costs a read its own catch-up, never a
wrong answer. What a notification buys is time: the core that hears it catches the scope up in
the background while the writer's reply travels to its client and the client's next call
travels here, so that call finds the index current and pays only the head check (issue 28:
measured in docs/performance.md, "Catching up before the read").

**Announcing** (``Announcer``): after a write transaction committed, the engine hands the
scopes it moved and their new heads to a thread of its own, which sends them all in one
statement on a session of its own. Not inside the writing transaction: a transaction that
issued NOTIFY takes a database-wide lock at COMMIT to order the notification queue, which would
serialize every core's commits, WAL flush included. The announcing session commits with
``synchronous_commit = off`` (a lost announcement costs only time), and the write path never
waits for it.

**Listening** (``Listener``): a thread with a session of its own LISTENs and hands each
announcement (tenant, workspace, cursor) to the kernel, which catches the scope up if it holds
it behind that cursor. A failed session is opened again after a pause; announcements missed
meanwhile are caught up by the reads themselves.

A payload is JSON ``[tenant, workspace, cursor]``; one too long for NOTIFY (8,000 bytes) is not
sent (never the case within the contract's id bounds).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

import psycopg

from engram_core.store.postgres.pool import failure

log = logging.getLogger("engram.change_feed")

CHANNEL = "engram_changes"
MAX_PAYLOAD = 7_900  # NOTIFY refuses 8,000 bytes and more (the server's default build)
POLL_S = 0.2  # how soon a closed listener's thread ends
RETRY_S = (0.5, 1.0, 2.0, 5.0)  # pauses before opening a failed session again

Heard = Callable[[str, str, int], None]


def _connect(conninfo: str, connect_timeout_s: float, name: str) -> psycopg.Connection:
    conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=int(connect_timeout_s), application_name=name)
    conn.execute("SET idle_session_timeout = 0")  # an operator's timeout would cut a quiet listener
    return conn


class Announcer:
    """Sends the heads of the scopes committed transactions moved, from a thread of its own."""

    def __init__(self, conninfo: str, *, connect_timeout_s: float, enabled: bool = True) -> None:
        self._conninfo = conninfo
        self._connect_timeout_s = connect_timeout_s
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, str], int] = {}
        self._closed = not enabled  # a disabled announcer drops everything, as a closed one
        self._thread: threading.Thread | None = None

    def announce(self, heads: dict[tuple[str, str], int]) -> None:
        """Queue ``heads`` ((tenant, workspace) → cursor); returns at once."""
        if not heads:
            return
        with self._cond:
            if self._closed:
                return
            for key, cursor in heads.items():
                if cursor > self._pending.get(key, 0):
                    self._pending[key] = cursor
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engram-announce", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
                batch, self._pending = self._pending, {}
            payloads = [p for (t, w), c in batch.items() if len(p := json.dumps([t, w, c])) <= MAX_PAYLOAD]
            try:
                if conn is None or conn.closed:
                    conn = _connect(self._conninfo, self._connect_timeout_s, "engram-announce")
                    conn.execute("SET synchronous_commit = off")
                conn.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", [CHANNEL, payloads])
            except psycopg.Error as exc:
                log.debug("announcement not sent (reads catch up themselves): %s", failure(exc))
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)


class Listener:
    """Hands every announcement on ``CHANNEL`` to ``heard``, from a thread of its own."""

    def __init__(self, conninfo: str, heard: Heard, *, connect_timeout_s: float) -> None:
        self._conninfo = conninfo
        self._heard = heard
        self._connect_timeout_s = connect_timeout_s
        self._closed = threading.Event()
        self._listening = threading.Event()  # a session LISTENs now (tests wait for it)
        self._thread = threading.Thread(target=self._run, name="engram-listen", daemon=True)
        self._thread.start()

    def wait_listening(self, timeout_s: float) -> bool:
        return self._listening.wait(timeout_s)

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                with _connect(self._conninfo, self._connect_timeout_s, "engram-listen") as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    failures = 0
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=POLL_S):
                            self._deliver(note.payload)
                            if self._closed.is_set():
                                break
            except psycopg.Error as exc:
                self._listening.clear()
                pause = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                log.info("change feed session failed (%s); listening again in %.1f s", failure(exc), pause)
                self._closed.wait(pause)

    def _deliver(self, payload: str) -> None:
        try:
            tenant, workspace, cursor = json.loads(payload)
        except (ValueError, TypeError):
            return  # not ours (another program on the channel): nothing to do
        if not isinstance(tenant, str) or not isinstance(workspace, str) or not isinstance(cursor, int):
            return
        try:
            self._heard(tenant, workspace, cursor)
        except Exception:  # a failed background catch-up leaves it to the next read
            log.warning("background catch-up of an announced scope failed; the next read catches up",
                        exc_info=True)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
