"""PostgreSQL's ``SharedState`` (``store/engine.py``): what the cores of one database share
besides its rows, kept in that database so that every core sees one answer.

- context-nonce claims (``context_nonce_claims``: the primary key arbitrates), read with the
  host-key trust version (``host_key_trust``, moved by a trigger with every change to the
  trusted keys) in one statement;
- leader leases (``leases.LeaderLeases``: a session advisory lock per job);
- the page-pin shelf (``page_pins``; ``page_pins.PinShelf``) and the usage buckets quotas are
  decided on (``usage_buckets``; ``usage_counters.SharedUsage``), written without waiting for
  the WAL flush (soft state a database crash may take back without harm).

Expired rows are swept now and then by the statement that found a sweep due. Every statement
runs on its own (autocommit) over the engine's pool, outside any transaction of the caller's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.postgres.leases import LeaderLeases

if TYPE_CHECKING:
    from engram_core.store.page_pins import PinShelf
    from engram_core.store.usage_counters import SharedUsage, UsageRead

SWEEP_EVERY_S = 60.0  # expired shared rows (nonce claims, page pins, usage buckets) deleted this often
CLAIM_RETAIN_MS = 24 * 3_600_000  # nonce claims kept: far longer than any context lives (300 s)
USAGE_RETAIN_MS = 2 * 3_600_000  # usage buckets kept: the longest quota window (an hour), twice

def _subject(subject: str) -> str:
    """A usage subject as stored: its NUL-separated parts as a JSON array (TEXT holds no NUL)."""
    return json.dumps(subject.split("\x00"), separators=(",", ":"))


class _Engine(Protocol):
    """What the shared state uses of ``engine.PostgresEngine`` (which imports this module)."""

    leases: LeaderLeases

    def autocommit(self, statements: Sequence[tuple[str, Sequence[Any], bool]]) -> list[list[tuple[Any, ...]]]: ...
    def is_open(self) -> bool: ...


class PgSharedState:
    """The shared state of one PostgreSQL store, over its engine's connections (``Engine.shared``)."""

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine
        self._sweep_lock = threading.Lock()
        self._swept: dict[str, float] = {}

    def pin_shelf(self) -> PinShelf | None:
        return self

    def shared_usage(self) -> SharedUsage | None:
        return self

    def _autocommit(self, sql: str, params: Sequence[Any], *, durable: bool = True) -> list[tuple[Any, ...]]:
        """One statement on its own (autocommit), outside any transaction of the caller's.
        ``durable=False``, for rows a database crash may take back without harm (quota counts,
        which are soft, and page pins, whose cursor then answers as an expired one): its
        transaction commits with ``synchronous_commit = off``, visible to every core at once but
        not waiting for the WAL flush (the WAL writer flushes it within a few hundred ms)."""
        return self._engine.autocommit([(sql, params, durable)])[0]

    def _sweep_due(self, what: str) -> bool:
        """True at most once per ``SWEEP_EVERY_S`` per kind of shared row: expired rows are deleted
        then, by the statement that found it due (no round trip of its own)."""
        now = time.monotonic()
        with self._sweep_lock:
            if what in self._swept and now - self._swept[what] < SWEEP_EVERY_S:
                return False
            self._swept[what] = now
            return True

    def claim_context_nonce(self, ref: str, expires_at_ms: int) -> bool:
        """Claim a context's nonce for every core of the database: True when no core claimed it
        before (the primary key is the arbiter; a claim is never replaced). Claims whose context
        expired more than ``CLAIM_RETAIN_MS`` before this one's expiry are swept now and then: no
        context lives that long (SPEC §2: 300 s), so those contexts are refused by their expiry
        anyway. Every bound here is taken from the caller's instants, not this host's clock."""
        sweep = self._sweep_due("nonces")
        rows = self._autocommit(
            ("WITH swept AS (DELETE FROM context_nonce_claims WHERE expires_at_ms < %s) " if sweep else "")
            + "INSERT INTO context_nonce_claims VALUES (%s, %s) ON CONFLICT (ref) DO NOTHING RETURNING true",
            ([expires_at_ms - CLAIM_RETAIN_MS] if sweep else []) + [ref, expires_at_ms])
        return bool(rows)

    def claim_context_nonce_and_trust(self, ref: str, expires_at_ms: int, *, usage: UsageRead | None = None,
                                      ) -> tuple[bool, int, dict[tuple[str, str], list[tuple[int, str, int]]] | None]:
        """``claim_context_nonce`` and the host-key trust version (``host_keys_version``), read by
        the same statement: one round trip, the one every call that spends its context makes
        anyway. The version is the statement's snapshot's, so it is at least as new as every
        host-key change committed before the claim began. ``usage``: the same round trip adds
        its held-back rows and reads its buckets (``usage_buckets``; the third value, None
        without it), so the call's quota check makes no round trip of its own. They go in a
        transaction of their own ahead of the claim's, committed without waiting for the WAL
        flush as ``usage_buckets`` commits them: every call of a scope adds to the scope's
        bucket rows, and in the claim's durable transaction their row locks were held through
        its flush, so the scope's calls queued behind one another's flushes. A failure after
        the adds committed may send them again with the next read (soft counts, as the
        flusher's retry)."""
        sweep = self._sweep_due("nonces")
        clauses = ["swept AS (DELETE FROM context_nonce_claims WHERE expires_at_ms < %s)"] if sweep else []
        params: list[Any] = [expires_at_ms - CLAIM_RETAIN_MS] if sweep else []
        clauses.append("claimed AS (INSERT INTO context_nonce_claims VALUES (%s, %s) ON CONFLICT (ref) DO NOTHING "
                       "RETURNING true)")
        params += [ref, expires_at_ms]
        claim = ("WITH " + ", ".join(clauses) + " SELECT EXISTS (SELECT 1 FROM claimed), "
                 "(SELECT version FROM host_key_trust WHERE id = 1)")
        if usage is None:
            rows = self._autocommit(claim, params)
            return bool(rows[0][0]), int(rows[0][1]), None
        added, added_params = self._usage_insert(usage.adding) if usage.adding else ([], [])
        buckets, bucket_params = self._bucket_query(usage.wanted)
        # One round trip: the adds' transaction commits (unflushed), then the claim runs in a
        # transaction of its own after it, committed durably.
        read, claimed = self._engine.autocommit([
            (("WITH " + ", ".join(added) + " " if added else "") + buckets, added_params + bucket_params, False),
            (claim, params, True)])
        return bool(claimed[0][0]), int(claimed[0][1]), self._buckets_found(usage.wanted, read)

    def host_keys_version(self) -> int:
        """The trust version as last committed: migration 6's ``host_key_trust`` row, which a
        trigger on ``trusted_host_keys`` moves in the transaction of every insert, re-binding or
        delete of a key (whichever core, or a restore, made it)."""
        return int(self._autocommit("SELECT version FROM host_key_trust WHERE id = 1", [])[0][0])

    @contextmanager
    def leader_lease(self, job: str) -> Iterator[bool]:
        """``Store.leader_lease`` on PostgreSQL: ``leases.LeaderLeases`` (a session advisory lock
        per job, held while this core leads it)."""
        if not self._engine.is_open():
            raise EngramError(Code.STORE_UNAVAILABLE, "store closed")
        yield self._engine.leases.hold(job)

    def put_page_pin(self, pin_id: str, scope: Scope, pin: bytes, expires_at_ms: int) -> None:
        """A search pin where every core reads it (``page_pins.PinShelf``)."""
        self._autocommit("INSERT INTO page_pins VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING true",
                         [pin_id, scope.tenant, scope.workspace, pin, expires_at_ms], durable=False)

    def page_pin(self, pin_id: str, now_ms: int) -> bytes | None:
        """The pin, unless it expired by ``now_ms`` (expired pins are swept now and then)."""
        sweep = self._sweep_due("pins")
        rows = self._autocommit(
            ("WITH swept AS (DELETE FROM page_pins WHERE expires_at_ms < %s) " if sweep else "")
            + "SELECT pin FROM page_pins WHERE pin_id = %s AND expires_at_ms >= %s",
            ([now_ms] if sweep else []) + [pin_id, now_ms])
        return bytes(rows[0][0]) if rows else None

    def _usage_insert(self, rows: list[tuple[str, str, int, str, int]]) -> tuple[list[str], list[Any]]:
        """The statements adding ``rows`` to the usage buckets, as WITH clauses (the old buckets'
        sweep, now and then: those ``USAGE_RETAIN_MS`` older than the first row's), and their
        parameters. A data-modifying WITH clause runs once, whether the statement reads it or not."""
        summed: dict[tuple[str, str, int, str], int] = {}
        for subject, window, start, metric, amount in rows:  # ON CONFLICT may touch a row only once
            k = (_subject(subject), window, start, metric)
            summed[k] = summed.get(k, 0) + amount
        cols = [list(c) for c in zip(*[(*k, v) for k, v in summed.items()], strict=True)]
        clauses: list[str] = []
        params: list[Any] = []
        if self._sweep_due("usage"):
            clauses.append("swept AS (DELETE FROM usage_buckets WHERE bucket_start_ms < %s)")
            params.append(min(r[2] for r in rows) - USAGE_RETAIN_MS)
        # The statement's ORDER BY locks the rows in key order whichever order they were counted
        # in: two adds that lock the same bucket rows in different orders deadlock, and one of them
        # fails its call (seen under load on two cores as STORE_UNAVAILABLE).
        clauses.append("added AS (INSERT INTO usage_buckets AS u SELECT * FROM unnest(%s::text[], %s::text[], "
                       "%s::bigint[], %s::text[], %s::bigint[]) AS n(s, w, b, m, a) ORDER BY s, w, b, m "
                       "ON CONFLICT (subject, time_window, bucket_start_ms, metric) DO UPDATE SET amount = "
                       "u.amount + EXCLUDED.amount RETURNING true)")
        return clauses, params + cols

    def add_usage(self, rows: list[tuple[str, str, int, str, int]]) -> None:
        """Add to usage buckets every core adds to (``usage_counters.SharedUsage``): all of
        ``rows`` (subject, window, bucket start, metric, amount) in one statement."""
        if rows:
            clauses, params = self._usage_insert(rows)
            self._autocommit("WITH " + ", ".join(clauses) + " SELECT count(*) FROM added", params, durable=False)

    def usage_buckets(self, wanted: list[tuple[str, str, int]], *, adding: Sequence[tuple[str, str, int, str, int]] = (),
                      ) -> dict[tuple[str, str], list[tuple[int, str, int]]]:
        """For each (subject, window, floor) of ``wanted``, in one statement with the insert of
        ``adding`` (whose rows it does not see: one statement reads one snapshot): (bucket start,
        metric, total) of the subject's buckets of that window that start after the floor."""
        if not wanted:
            self.add_usage(list(adding))
            return {}
        clauses, params = self._usage_insert(list(adding)) if adding else ([], [])
        query, query_params = self._bucket_query(wanted)
        rows = self._autocommit(("WITH " + ", ".join(clauses) + " " if clauses else "") + query,
                                params + query_params, durable=not adding)
        return self._buckets_found(wanted, rows)

    @staticmethod
    def _bucket_query(wanted: Sequence[tuple[str, str, int]]) -> tuple[str, list[Any]]:
        """The SELECT of ``usage_buckets``' rows (subject, window, start, metric, amount) and its
        parameters."""
        return ("SELECT u.subject, u.time_window, u.bucket_start_ms, u.metric, u.amount FROM usage_buckets u "
                "JOIN unnest(%s::text[], %s::text[], %s::bigint[]) AS q(subject, time_window, floor_ms) "
                "ON u.subject = q.subject AND u.time_window = q.time_window AND u.bucket_start_ms > q.floor_ms",
                [[_subject(s) for s, _, _ in wanted], [w for _, w, _ in wanted], [f for _, _, f in wanted]])

    @staticmethod
    def _buckets_found(wanted: Sequence[tuple[str, str, int]], rows: Sequence[Sequence[Any]],
                       ) -> dict[tuple[str, str], list[tuple[int, str, int]]]:
        found: dict[tuple[str, str], list[tuple[int, str, int]]] = {(s, w): [] for s, w, _ in wanted}
        stored = {_subject(s): s for s, _, _ in wanted}
        for subject, window, start, metric, amount in rows:
            found[(stored[subject], window)].append((int(start), metric, int(amount)))
        return found
