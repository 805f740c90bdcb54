"""A key vault several cores share: wrapped data keys in PostgreSQL, the KEK ring outside it.

``FileKeyVault`` keeps wrapped keys in a slot file of one machine, which cores on several
machines cannot share. ``PgKeyVault`` implements the same ``KeyVault`` protocol
(``engram_core/crypto/keyvault.py``) with the same ``KekRing``: the ring file lives in a key
directory every core mounts (never in the database), and each data key, wrapped by the ring's
active generation (``KekRing.wrap``: 62 bytes of nonce, wrapped key and tag, bound to the owner
and the generation), is a row of ``vault_keys`` addressed by the integer ref the database
allocates, which the engines store in their ``key_slot`` columns. So the database holds only
wrapped keys, and whoever reads it (its files, its WAL, a dump) without the ring reads nothing.

The protocol's phases, around the transaction that names a key:

1. ``new_data_key`` inserts the wrapped key, committed in a transaction of its own before the
   transaction naming the ref begins. With ``durable=False`` that commit does not wait for its
   WAL flush: the naming transaction's COMMIT flushes the WAL past it (``sync`` has nothing left
   to do), so a capture or an admission waits for one flush, not two. This needs the vault's
   tables in the store's own database (they are: the engine's migration 1). A transaction that
   never commits leaves a row nobody names, which ``reconcile`` deletes once it is older than
   ``reconcile_after_s`` (never earlier: another core's transaction may be about to name it).
2. ``data_key`` reads and unwraps, through a bounded cache (``cache_size`` keys, each kept
   ``cache_ttl_s``) that this vault's destructions evict. Another core's destruction is not
   seen by this cache: a destroyed key can stay in this process's memory for at most
   ``cache_ttl_s`` (the rows it sealed are gone from the database by then).
3. ``destroy_many`` deletes the rows after the transaction destroying the keys committed.

Deleted rows are not gone from PostgreSQL: their bytes survive as dead tuples, in the WAL and in
any dump taken before, wrapped by the generation that wrapped them then. That is why a
destruction is complete only once every generation that wrapped the key is retired
(``engram_core/services/keyring.py``): then no KEK anywhere opens those copies.

Several cores, one ring: rotation and retirement hold an advisory lock and re-read the ring file
first, so two cores never rotate from two copies of it (a lost generation would lose every key
it wrapped). The ring's active generation is also recorded in ``vault_state``, and a key is only
inserted wrapped by that generation; a core whose copy of the ring is stale (another core
rotated) finds its insert refused, re-reads the ring and wraps again. Retirement locks
``vault_keys`` against inserts while it checks that no key is wrapped by the generation, so no
key a core is creating at that moment can be left wrapped by a retired KEK.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_core.contract.errors import Code, EngramError
from engram_core.crypto.keyvault import GenerationState, KekRing, WrappedKey
from engram_core.store.postgres.migrations import RING_LOCK
from engram_core.store.postgres.pool import Pool, failure

RING_NAME = "store.kek"


class RingMismatch(EngramError):
    """The key directory's KEK ring is not the store's (behind it, or another ring): a serving
    core cannot open the store (STORE_UNAVAILABLE, until its key directory is fixed); a restore
    reading the store as its key source refuses (app/engines.py)."""


_V2 = 2  # the wrapping format KekRing.wrap makes (associated data v2: generation and owner)
# The constant each generation seals in vault_rings, under an owner no data key can have.
_FETCH_BATCH = 5000  # refs per query of data_keys (a scope's load): bounded parameter arrays
_CANARY, _CANARY_OWNER = b"\0" * 32, "engram/ring-check"
log = logging.getLogger(__name__)


class VaultUnavailable(OSError):
    """The vault's database could not be reached (an ``OSError``, as a failed slot-file write of
    ``FileKeyVault``: the kernel then reports a destruction pending and reconcile completes it)."""


class PgKeyVault:
    """Data keys wrapped by the ring in ``key_dir``, stored in the database at ``conninfo``.

    The database's schema comes from the PostgreSQL engine's migrations (open the engine
    first). ``pool_size``: this vault's connections (it runs one statement at a time per caller,
    outside the engine's transactions). ``read_only``: another store's vault a restore reads its
    keys from; opening it records nothing there (no agreed generation, no ring check constant),
    so a key directory that is not that store's cannot change the ring its cores agree on."""

    syncs = False  # see ``sync``

    def __init__(self, conninfo: str, key_dir: Path, *, pool_size: int = 4, cache_size: int = 4096,
                 cache_ttl_s: float = 30.0, reconcile_after_s: float = 600.0, connect_timeout_s: float = 30.0,
                 pool_timeout_s: float = 30.0, read_only: bool = False) -> None:
        self._read_only = read_only
        self._pool = Pool(conninfo, name="engram-vault", size=pool_size, connect_timeout_s=connect_timeout_s,
                          timeout_s=pool_timeout_s, settings=["SET application_name = 'engram-vault'"])
        self._ring_path = key_dir / RING_NAME
        self._cache: OrderedDict[int, tuple[str, bytes, float]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_ttl_s = cache_ttl_s
        self._reconcile_after_s = reconcile_after_s
        self._lock = threading.Lock()
        try:
            # Two cores starting on an empty key directory must not each create a ring of their own.
            with self._connection() as conn:
                conn.execute("SELECT pg_advisory_lock(%s)", [RING_LOCK])
                try:
                    self.ring = KekRing(self._ring_path)
                    self._ring_seen = self._ring_stamp()
                    self._agree(conn)
                finally:
                    conn.execute("SELECT pg_advisory_unlock(%s)", [RING_LOCK])
        except BaseException:
            self._pool.close()
            raise

    # -- connections and the ring file ---------------------------------------------------------------------
    def _connection(self) -> _Borrowed:
        return _Borrowed(self._pool)

    def _ring_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._ring_path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _fresh_ring(self) -> None:
        """Re-read the ring file when it changed (another core rotated or retired)."""
        stamp = self._ring_stamp()
        if stamp != self._ring_seen:
            self.ring.reload()
            self._ring_seen = stamp

    def _agree(self, conn: psycopg.Connection) -> int:
        """Record the ring's active generation in ``vault_state`` (it only moves forward) and
        return the one the database holds; a ring behind the database is re-read, and one that
        stays behind is not this store's ring."""
        try:
            if self._read_only:
                row = conn.execute("SELECT active_generation FROM vault_state WHERE id = 1").fetchone() or (0,)
            else:
                row = conn.execute(
                    "INSERT INTO vault_state VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET active_generation = "
                    "GREATEST(vault_state.active_generation, EXCLUDED.active_generation) RETURNING active_generation",
                    [self.ring.active_generation()]).fetchone()
        except psycopg.errors.UndefinedTable:
            raise EngramError(Code.STORE_UNAVAILABLE,
                              "the store's schema is missing: open the PostgreSQL engine (it migrates) first") from None
        agreed = int(row[0])  # type: ignore[index]
        if agreed > self.ring.active_generation():
            self.ring.reload()
            self._ring_seen = self._ring_stamp()
            if agreed > self.ring.active_generation():
                raise RingMismatch(Code.STORE_UNAVAILABLE,
                                   f"the KEK ring in {self._ring_path.parent} is behind this store's (generation "
                                   f"{agreed}): every core must mount the same key directory")
        self._check_ring(conn)
        return agreed

    def _check_ring(self, conn: psycopg.Connection) -> None:
        """This ring is the store's: every generation it holds opens the constant the store keeps
        for it, and the active one's is recorded (by the first core to use it)."""
        if not self._read_only:
            active = self.ring.active_generation()
            sealed = self.ring.wrap(_CANARY, _CANARY_OWNER)[1]
            conn.execute("INSERT INTO vault_rings VALUES (%s, %s) ON CONFLICT DO NOTHING", [active, sealed])
        held = {g.generation for g in self.ring.generations() if g.state != "retired"}
        for generation, canary in conn.execute("SELECT generation, canary FROM vault_rings").fetchall():
            if generation in held and self.ring.unwrap(_V2, generation, canary, _CANARY_OWNER) != _CANARY:
                raise RingMismatch(Code.STORE_UNAVAILABLE,
                                   f"the KEK ring in {self._ring_path.parent} is not this store's (its generation "
                                   f"{generation} does not open the store's check): every core must mount the same "
                                   "key directory")

    # -- the cache ------------------------------------------------------------------------------------------------
    def _cached(self, ref: int, owner: str) -> bytes | None:
        with self._lock:
            hit = self._cache.get(ref)
            if hit is None:
                return None
            if hit[2] < time.monotonic():
                del self._cache[ref]
                return None
            self._cache.move_to_end(ref)
            return hit[1] if hit[0] == owner else None

    def _remember(self, ref: int, owner: str, key: bytes) -> None:
        with self._lock:
            self._cache[ref] = (owner, key, time.monotonic() + self._cache_ttl_s)
            self._cache.move_to_end(ref)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _evict(self, refs: list[int]) -> None:
        with self._lock:
            for ref in refs:
                self._cache.pop(ref, None)

    # -- keys -------------------------------------------------------------------------------------------------------
    def new_data_key(self, owner: str, *, durable: bool = True) -> tuple[int, bytes]:
        """A new key for ``owner``, its row committed before this returns: durably (``durable``),
        or with ``synchronous_commit = off``, which the transaction that names the ref makes
        durable when it commits (see ``sync``), so that the key costs that transaction no WAL
        flush of its own."""
        key = AESGCM.generate_key(bit_length=256)
        with self._connection() as conn:
            for _ in range(3):
                self._fresh_ring()
                generation, wrapped = self.ring.wrap(key, owner)
                ref = self._insert_key(conn, owner, generation, wrapped, durable=durable)
                if ref is not None:
                    self._remember(ref, owner, key)
                    return ref, key
                # The ring rotated on another core (or this one's rotation is not recorded yet).
                self._agree(conn)
        raise EngramError(Code.STORE_UNAVAILABLE, "the KEK ring's active generation keeps changing")

    @staticmethod
    def _insert_key(conn: psycopg.Connection, owner: str, generation: int, wrapped: bytes, *,
                    durable: bool) -> int | None:
        """Insert a wrapped key, only under the store's agreed active generation; its ref, or None."""
        insert = ("INSERT INTO vault_keys (owner, version, generation, wrapped) SELECT %s, %s, %s, %s "
                  "FROM vault_state WHERE id = 1 AND active_generation = %s RETURNING ref")
        params = [owner, _V2, generation, wrapped, generation]
        if durable:
            row = conn.execute(insert, params).fetchone()
            return int(row[0]) if row is not None else None
        with conn.pipeline():  # one round trip
            conn.execute("BEGIN")
            conn.execute("SET LOCAL synchronous_commit = off")
            cur = conn.execute(insert, params)
            conn.execute("COMMIT")
        row = cur.fetchone()
        return int(row[0]) if row is not None else None

    def data_key(self, ref: int, owner: str) -> bytes | None:
        return self.data_keys([(ref, owner)]).get(ref)

    def data_keys(self, wanted: list[tuple[int, str]], *,
                  stored: Mapping[int, WrappedKey] | None = None) -> dict[int, bytes]:
        """Cached keys from the cache, those in ``stored`` (rows of ``vault_keys`` the caller
        read in its own query) unwrapped as read, the others in one query per ``_FETCH_BATCH``
        refs."""
        found: dict[int, bytes] = {}
        owners: dict[int, str] = {}
        for ref, owner in wanted:
            cached = self._cached(ref, owner)
            if cached is not None:
                found[ref] = cached
            else:
                owners[ref] = owner
        rows: list[tuple[Any, ...]] = []
        if stored:
            rows = [(ref, k.owner, k.version, k.generation, k.wrapped) for ref in owners
                    if (k := stored.get(ref)) is not None]
        given = {r[0] for r in rows}
        missing = [ref for ref in owners if ref not in given]
        if missing:
            with self._connection() as conn:
                for start in range(0, len(missing), _FETCH_BATCH):
                    rows += conn.execute("SELECT ref, owner, version, generation, wrapped FROM vault_keys "
                                         "WHERE ref = ANY(%s)", [missing[start:start + _FETCH_BATCH]]).fetchall()
        refreshed = False
        for ref, owner, version, generation, wrapped in rows:
            if owners.get(ref) != owner:
                continue
            key = self.ring.unwrap(int(version), int(generation), wrapped, owner)
            if key is None and not refreshed and int(generation) not in {g.generation for g in self.ring.generations()}:
                self._fresh_ring()  # another core made a generation since this ring was read
                refreshed = True
                key = self.ring.unwrap(int(version), int(generation), wrapped, owner)
            if key is not None:
                self._remember(ref, owner, key)
                found[ref] = key
        return found

    def sync(self) -> None:
        """Nothing to do: a key's row was committed by ``new_data_key``, before the transaction that
        names it began, in the same database; that transaction's COMMIT flushes the WAL up to its
        own commit record, which comes after the key's (PostgreSQL writes and flushes WAL in order),
        so the key is durable whenever anything naming it is. A crash before leaves a key nothing
        names, lost or deleted by ``reconcile``."""

    def generation_of(self, ref: int) -> int | None:
        with self._connection() as conn:
            row = conn.execute("SELECT generation FROM vault_keys WHERE ref = %s", [ref]).fetchone()
        return int(row[0]) if row else None

    # -- destruction -----------------------------------------------------------------------------------------------
    def is_destroyed(self, ref: int) -> bool:
        """No row at ``ref``, which this database allocated: it allocates refs and never reuses
        one, so a ref it issued that holds nothing now was destroyed. A ref it never issued is
        not destroyed but another store's key (a backup restored against the wrong key store,
        which restore then refuses instead of restoring every record as forgotten), and so is a
        row this ring cannot unwrap, or one of another owner."""
        with self._connection() as conn:
            present, issued = conn.execute(  # type: ignore[misc]
                "SELECT EXISTS (SELECT 1 FROM vault_keys WHERE ref = %s), "
                "pg_sequence_last_value(pg_get_serial_sequence('vault_keys', 'ref')::regclass)", [ref]).fetchone()
        return not present and issued is not None and ref <= int(issued)

    def destroy(self, ref: int) -> None:
        self.destroy_many([ref])

    def destroy_many(self, refs: list[int]) -> None:
        if not refs:
            return
        self._evict(refs)
        try:
            with self._connection() as conn:
                conn.execute("DELETE FROM vault_keys WHERE ref = ANY(%s)", [list(refs)])
        except (psycopg.Error, EngramError) as exc:
            raise VaultUnavailable(f"data keys not destroyed: {failure(exc)}") from None
        finally:
            self._evict(refs)  # a reader racing the delete may have cached one again

    def reconcile(self, live_refs: set[int]) -> int:
        """Delete keys nobody names: not in ``live_refs`` nor in the store's ``data_keys``, and
        either older than ``reconcile_after_s`` (by the database's clock: a key another core's
        transaction is about to name is younger) or of an owner whose destruction committed
        (a crash between COMMIT and ``destroy_many``; owners are never given a key again)."""
        with self._connection() as conn:
            cur = conn.execute(
                "DELETE FROM vault_keys v WHERE v.ref <> ALL(%s::bigint[]) "
                "AND NOT EXISTS (SELECT 1 FROM data_keys d WHERE d.slot = v.ref) "
                "AND (v.created_at < now() - make_interval(secs => %s) "
                "     OR EXISTS (SELECT 1 FROM key_destructions k WHERE k.owner = v.owner)) RETURNING v.ref",
                [sorted(live_refs), self._reconcile_after_s])
            gone = [int(r[0]) for r in cur.fetchall()]
        self._evict(gone)
        return len(gone)

    # -- generations ---------------------------------------------------------------------------------------------------
    def active_generation(self) -> int:
        self._fresh_ring()
        return self.ring.active_generation()

    def rotate(self, now_ms: int) -> int:
        """A new active generation: in the ring file first (from the latest copy of it, under the
        ring lock), then agreed in the database; callers then ``rewrap`` every live key."""
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [RING_LOCK])
            self.ring.reload()
            new = self.ring.rotate(now_ms)
            self._ring_seen = self._ring_stamp()
            conn.execute("UPDATE vault_state SET active_generation = %s WHERE id = 1", [new])
            conn.execute("INSERT INTO vault_rings VALUES (%s, %s) ON CONFLICT DO NOTHING",
                         [new, self.ring.wrap(_CANARY, _CANARY_OWNER)[1]])
        return new

    def rewrap(self, ref: int, owner: str) -> bool:
        """Wrap the key at ``ref`` by the active generation (False: no live key there).

        Only a live key is re-wrapped: one the store's ``data_keys`` still names, locked (FOR KEY
        SHARE) for the statement. A transaction destroying the key deletes that row first, so a
        re-wrap either finished before (the destruction then records the new generation: the
        engine reads it after its DELETE) or finds the key gone; it never leaves a copy wrapped by
        a generation the destruction did not record. (DuckDB's vault gets this from the writer
        lock rotation holds; several cores hold no lock in common.)"""
        key = self.data_key(ref, owner)
        if key is None:
            return False
        with self._connection() as conn:
            for _ in range(3):
                self._fresh_ring()
                generation, wrapped = self.ring.wrap(key, owner)
                row = conn.execute(
                    "WITH agreed AS (SELECT active_generation = %s AS ok FROM vault_state WHERE id = 1), "
                    "moved AS (UPDATE vault_keys v SET version = %s, generation = %s, wrapped = %s "
                    "  WHERE v.ref = %s AND v.owner = %s AND (SELECT ok FROM agreed) "
                    "  AND EXISTS (SELECT 1 FROM data_keys d WHERE d.slot = v.ref AND d.owner = v.owner FOR KEY SHARE) "
                    "  RETURNING 1) "
                    "SELECT (SELECT ok FROM agreed), EXISTS (SELECT 1 FROM moved)",
                    [generation, _V2, generation, wrapped, ref, owner]).fetchone()
                agreed, moved = bool(row[0]), bool(row[1])  # type: ignore[index]
                if moved:
                    return True
                if agreed:
                    return False  # not live (destroyed, or never named)
                self._agree(conn)  # the ring rotated on another core: wrap by its new generation
        raise EngramError(Code.STORE_UNAVAILABLE, "the KEK ring's active generation keeps changing")

    def retire(self, generation: int, now_ms: int) -> None:
        """Remove ``generation`` from the ring for good. Refused (ValueError) while it is active or
        any key is wrapped by it, checked with inserts of keys held off meanwhile."""
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", [RING_LOCK])
            conn.execute("LOCK TABLE vault_keys IN SHARE MODE")  # waits for keys being inserted now
            self.ring.reload()
            if generation == self.ring.active_generation():
                raise ValueError("the active generation cannot retire")
            if conn.execute("SELECT 1 FROM vault_keys WHERE generation = %s LIMIT 1", [generation]).fetchone():
                raise ValueError(f"a data key is still wrapped by generation {generation}")
            self.ring.retire(generation, now_ms)
            self._ring_seen = self._ring_stamp()
            conn.execute("DELETE FROM vault_rings WHERE generation = %s", [generation])

    def wrapping_generations(self) -> set[int]:
        """The generations some key in the vault is wrapped by now (live keys, and keys of
        transactions in flight: their rows exist before the transaction that names them)."""
        self._fresh_ring()
        known = sorted({g.generation for g in self.ring.generations()})
        with self._connection() as conn:
            rows = conn.execute("SELECT g FROM unnest(%s::int[]) AS g WHERE EXISTS "
                                "(SELECT 1 FROM vault_keys WHERE generation = g)", [known]).fetchall()
        return {int(r[0]) for r in rows}

    def generations(self) -> list[GenerationState]:
        self._fresh_ring()
        return self.ring.generations()

    def is_retired(self, generation: int) -> bool:
        self._fresh_ring()
        return self.ring.is_retired(generation)

    def destruction_complete(self, generation: int | None) -> bool:
        self._fresh_ring()
        return self.ring.destruction_complete(generation)

    # -- reports -------------------------------------------------------------------------------------------------------
    def slot_counts(self) -> tuple[int, int]:
        """(live keys, refs allocated and no longer live) (metrics)."""
        with self._connection() as conn:
            live = int(conn.execute("SELECT count(*) FROM vault_keys").fetchone()[0])  # type: ignore[index]
            allocated = int(conn.execute(
                "SELECT coalesce(last_value, 0) FROM pg_sequences WHERE sequencename = 'vault_keys_ref_seq'"
            ).fetchone()[0] or 0)  # type: ignore[index]
        return live, max(allocated - live, 0)

    def status(self) -> dict[str, int | str]:
        live, destroyed = self.slot_counts()
        held, retired = self.ring.counts()
        return {"active_kek": self.active_generation(), "keks": held, "retired_keks": retired,
                "slots": live + destroyed, "live_slots": live}

    def close(self) -> None:
        self._pool.close()
        with self._lock:
            self._cache.clear()


class _Borrowed:
    """One connection of the vault's pool for a ``with`` block; database failures become
    STORE_UNAVAILABLE (never a message: it could quote a row)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._conn: psycopg.Connection | None = None

    def __enter__(self) -> psycopg.Connection:
        self._conn = self._pool.get()
        return self._conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        conn, self._conn = self._conn, None
        assert conn is not None
        if kind is None:
            self._pool.put(conn)
            return
        if conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._pool.discard(conn)
        else:
            self._pool.put(conn)
        if isinstance(exc, psycopg.Error):
            raise EngramError(Code.STORE_UNAVAILABLE, f"key vault statement failed: {failure(exc)}") from None
