"""The KeyVault port: data keys wrapped by a ring of key-encryption keys (SPEC §10).

Each candidate and record has its own data key, wrapped (AES-256-GCM, associated data binding
the owner and the KEK generation) by the ring's **active generation** and kept outside the
database, so that destroying a key makes every copy of what it sealed unreadable.

The protocol is in three phases, in this order around the transaction that names the key
(the store kernel keeps the order, ``engram_core/store/kernel.py``):

1. ``new_data_key(owner, durable=False)``: the key is created and written, not yet synced;
2. ``sync()``: before the transaction naming the key commits (one sync serves a whole group
   commit); a transaction that never commits leaves an unreferenced key that ``reconcile``
   zeroes at the next start;
3. ``destroy_many(refs)``: after the transaction that destroys the key commits.

**Generations.** ``rotate`` makes a new generation active and callers ``rewrap`` every live
key under it; the generation before stays in the ring, unwrapping only, for the configured
retention (backups and copies of the key files made under it stay restorable), and is then
**retired**: its KEK is removed from the ring and never comes back. A destroyed key is gone
from this vault at once (its slot zeroed), but copies of the vault's files made earlier
(backups an operator keeps) still hold it, wrapped by the generations that wrapped it while
it lived; its destruction is **complete** once every one of those generations is retired
(``destruction_complete``). docs/admin.md says which key material to keep for how long.

``FileKeyVault`` keeps the ring in ``store.kek`` and the wrapped keys in fixed 64-byte slots
of ``datakeys.bin``: a row deleted from a database can survive in freed pages, a zeroed slot
cannot. A reference (``ref``) is the slot's number; the engines store it with the row that
owns the key and never interpret it.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_NONCE = 12
_SLOT = 64
# Slot layout. v1: [KEK index u8][1][nonce 12][wrapped key 32 + tag 16][2 zero bytes].
# v2: [generation bits 0-7][2][nonce 12][wrapped key 32 + tag 16][generation bits 8-23, big-endian],
# so the version byte stays where v1 had it and a v1 slot still opens.
_V1, _V2 = 1, 2
MAX_GENERATION = (1 << 24) - 1
RING_FORMAT = 2


@dataclass(frozen=True)
class WrappedKey:
    """A data key as a vault stores it (wrapped by a KEK generation), read by someone other than
    the vault: the PostgreSQL engine reads it with the records that name it, in the same query,
    and hands it to the vault to unwrap (``KeyVault.data_keys``'s ``stored``), which saves the
    vault's own round trip. Nothing here is key material until the ring unwraps it."""

    owner: str
    version: int
    generation: int
    wrapped: bytes


class KeyVault(Protocol):
    """Data keys by owner, wrapped by a ring of KEK generations (see the module docstring)."""

    # Whether ``sync`` has work to do. False: a key is durable no later than the commit that
    # names it (PgKeyVault), so that commit waits for nothing (the store kernel then skips it:
    # handing a no-op to another thread would cost the writer two thread switches under its lock).
    syncs: bool

    def new_data_key(self, owner: str, *, durable: bool = True) -> tuple[int, bytes]:
        """Create a data key for ``owner``, wrapped by the active generation; returns (ref, key).
        ``durable=False``: written but not yet synced; ``sync`` must run before anything naming
        the ref commits."""
        ...

    def data_key(self, ref: int, owner: str) -> bytes | None:
        """``owner``'s data key at ``ref``, or None: destroyed, another owner's, or wrapped by a
        generation no longer in the ring."""
        ...

    def data_keys(self, wanted: list[tuple[int, str]], *,
                  stored: Mapping[int, WrappedKey] | None = None) -> dict[int, bytes]:
        """``data_key`` for many (ref, owner) pairs (each ref once), by ref, leaving out those it
        would answer None for. One read of the vault for all of them where the vault is remote (a scope's load
        opens every record's projection: one query per key made a cold 10k-record scope cost
        seconds). ``stored``: wrapped keys by ref that the caller read from where this vault
        keeps them, in the same committed state (the PostgreSQL engine's catch-up reads them
        with the records); a vault that keeps its keys there unwraps those instead of reading
        them again (the owner and the ring decide as for a read), and reads the others; any
        other vault ignores them."""
        ...

    def sync(self) -> None:
        """Make every key written so far durable."""
        ...

    def destroy(self, ref: int) -> None:
        """Destroy one key, durably."""
        ...

    def destroy_many(self, refs: list[int]) -> None:
        """Destroy keys, durably (one sync for all)."""
        ...

    def is_destroyed(self, ref: int) -> bool:
        """True when the slot holds no key at all (destroyed), as opposed to one this ring cannot unwrap."""
        ...

    def reconcile(self, live_refs: set[int]) -> int:
        """Destroy every key not in ``live_refs`` (keys of transactions that never committed, and
        destructions a crash interrupted); returns how many."""
        ...

    def generation_of(self, ref: int) -> int | None:
        """The generation wrapping the key at ``ref`` now (None: no key there)."""
        ...

    def active_generation(self) -> int: ...

    def rotate(self, now_ms: int) -> int:
        """Make a new generation active (durable first); returns it. Callers then ``rewrap``
        every live key and ``sync``."""
        ...

    def rewrap(self, ref: int, owner: str) -> bool:
        """Wrap the key at ``ref`` by the active generation (False: no key there)."""
        ...

    def retire(self, generation: int, now_ms: int) -> None:
        """Remove a generation's KEK from the ring, durably and for good. Callers retire only a
        generation no live key is wrapped by."""
        ...

    def generations(self) -> list[GenerationState]: ...

    def wrapping_generations(self) -> set[int]:
        """The generations some key (live, or created by a transaction in flight) is wrapped by."""
        ...

    def is_retired(self, generation: int) -> bool:
        """This ring retired ``generation`` (its KEK is gone from it for good)."""
        ...

    def destruction_complete(self, generation: int | None) -> bool:
        """Whether a key destroyed while wrapped by ``generation`` is gone from every copy made as
        the admin docs say: every generation up to it retired. None (unknown): not complete
        while any generation is in the ring but the active one."""
        ...

    def status(self) -> dict[str, int | str]: ...

    def close(self) -> None: ...


class KeyedRecord(Protocol):
    """What ``record_data_key(s)`` read of a record row: its id and the ref its key is at."""

    @property
    def record_id(self) -> str: ...

    @property
    def key_slot(self) -> int | None: ...


class OpensDataKeys(Protocol):
    """A vault as ``record_data_key`` uses it: the store's view (``projection.DataKeys``) will do."""

    def data_key(self, ref: int, owner: str, /) -> bytes | None: ...


def record_data_key(vault: OpensDataKeys, record: KeyedRecord) -> bytes | None:
    """The live data key of one record; None when it names no ref or its key is destroyed."""
    if record.key_slot is None:
        return None
    return vault.data_key(int(record.key_slot), f"record:{record.record_id}")


def record_data_keys(vault: KeyVault, records: Iterable[KeyedRecord], *,
                     stored: Mapping[int, WrappedKey] | None = None) -> dict[str, tuple[int, bytes]]:
    """The live data keys of many records, by record id, with the ref each is at: one
    ``data_keys`` read for all (``stored``: see there). A record naming no ref, or whose key is
    destroyed, is left out."""
    owners = {int(r.key_slot): r.record_id for r in records if r.key_slot is not None}
    found = vault.data_keys([(ref, f"record:{rid}") for ref, rid in owners.items()], stored=stored)
    return {owners[ref]: (ref, key) for ref, key in found.items()}


@dataclass(frozen=True)
class GenerationState:
    """One KEK generation: ``active`` (wraps new keys), ``retained`` (unwraps only, until it
    retires) or ``retired`` (its KEK is gone)."""

    generation: int
    state: str
    created_at_ms: int
    deactivated_at_ms: int | None  # when it stopped being the active one
    retired_at_ms: int | None


def _ad(version: int, generation: int, owner: str) -> bytes:
    if version == _V1:
        return f"engram/data-key/v1\x00{generation}\x00{owner}".encode()
    return f"engram/data-key/v2\x00{generation}\x00{owner}".encode()


def _slot_generation(raw: bytes) -> tuple[int, int] | None:
    """(version, generation) of a slot's bytes, None when it holds no key."""
    if len(raw) < _SLOT:
        return None
    if raw[1] == _V1:
        return _V1, raw[0]
    if raw[1] == _V2:
        return _V2, raw[0] | (int.from_bytes(raw[62:64], "big") << 8)
    return None


class KekRing:
    """The generations of key-encryption keys in one file (``store.kek``, mode 0600): wrapping by
    the active one, unwrapping by any still in the ring, rotation and retirement. Shared by the
    vaults, wherever they keep the wrapped keys; every core of one store mounts the same file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._keks: dict[int, bytes] = {}
        self._meta: dict[int, tuple[int, int | None]] = {}  # generation -> (created_at_ms, deactivated_at_ms)
        self._retired: dict[int, int] = {}  # generation -> retired_at_ms
        self.ring_id = ""  # the ring's identity: kept while its generations rotate (shared_secrets.py)
        if path.exists():
            self._load(json.loads(path.read_text()))
            if not self.ring_id:  # a ring from before rings had an identity
                self.ring_id = secrets.token_hex(16)
                self._persist()
        else:
            self._keks = {1: secrets.token_bytes(32)}
            self._meta = {1: (time.time_ns() // 1_000_000, None)}  # its rotation is due one interval from now
            self._active = 1
            self.ring_id = secrets.token_hex(16)
            self._persist()

    def _load(self, state: dict) -> None:
        self._active = int(state["active"])
        self.ring_id = str(state.get("ring_id", ""))
        if state.get("format") == RING_FORMAT:
            for g, entry in state["generations"].items():
                self._keks[int(g)] = bytes.fromhex(entry["key"])
                self._meta[int(g)] = (int(entry["created_at_ms"]), entry.get("deactivated_at_ms"))
            self._retired = {int(g): int(at) for g, at in state.get("retired", {}).items()}
        else:  # the first format: {"active": n, "keks": {n: hex}}; older KEKs were dropped unrecorded
            for g, hexkey in state["keks"].items():
                self._keks[int(g)] = bytes.fromhex(hexkey)
                self._meta[int(g)] = (0, None if int(g) == self._active else 0)
            self._retired = {g: 0 for g in range(1, max(self._keks)) if g not in self._keks}

    def _persist(self) -> None:
        state = {
            "format": RING_FORMAT, "ring_id": self.ring_id, "active": self._active,
            "generations": {str(g): {"key": k.hex(), "created_at_ms": self._meta[g][0],
                                     "deactivated_at_ms": self._meta[g][1]} for g, k in sorted(self._keks.items())},
            "retired": {str(g): at for g, at in sorted(self._retired.items())},
        }
        _write_private(self._path, json.dumps(state).encode())

    def reload(self) -> None:
        """Read the ring file again (another core of the same store rotated or retired)."""
        # Loaded aside and swapped in at once: a vault serving calls reloads while other threads
        # wrap and unwrap, which must never see a half-loaded ring.
        fresh = KekRing.__new__(KekRing)
        fresh._keks, fresh._meta, fresh._retired = {}, {}, {}
        fresh._load(json.loads(self._path.read_text()))
        with self._lock:
            self._keks, self._meta, self._retired, self._active = fresh._keks, fresh._meta, fresh._retired, fresh._active

    # -- wrapping: the 62 bytes of a wrapped key, and its generation --------------------------------
    def wrap(self, key: bytes, owner: str) -> tuple[int, bytes]:
        """(generation, nonce + ciphertext + tag) of ``key`` wrapped by the active generation."""
        generation = self._active
        nonce = secrets.token_bytes(_NONCE)
        return generation, nonce + AESGCM(self._keks[generation]).encrypt(nonce, key, _ad(_V2, generation, owner))

    def unwrap(self, version: int, generation: int, wrapped: bytes, owner: str) -> bytes | None:
        kek = self._keks.get(generation)
        if kek is None:
            return None
        try:
            return AESGCM(kek).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _ad(version, generation, owner))
        except Exception:
            return None

    # -- generations -------------------------------------------------------------------------------------
    def active_generation(self) -> int:
        return self._active

    def rotate(self, now_ms: int) -> int:
        with self._lock:
            new = max([*self._keks, *self._retired]) + 1
            if new > MAX_GENERATION:
                raise RuntimeError("KEK generation space exhausted")
            self._keks[new] = secrets.token_bytes(32)
            self._meta[new] = (now_ms, None)
            created, _ = self._meta[self._active]
            self._meta[self._active] = (created, now_ms)
            self._active = new
            self._persist()
            return new

    def retire(self, generation: int, now_ms: int) -> None:
        with self._lock:
            if generation == self._active:
                raise ValueError("the active generation cannot retire")
            if generation not in self._keks:
                return
            del self._keks[generation]
            del self._meta[generation]
            self._retired[generation] = now_ms
            self._persist()

    def generations(self) -> list[GenerationState]:
        with self._lock:
            out = [GenerationState(g, "active" if g == self._active else "retained", created, deactivated, None)
                   for g, (created, deactivated) in self._meta.items()]
            out += [GenerationState(g, "retired", 0, None, at) for g, at in self._retired.items()]
        return sorted(out, key=lambda s: s.generation)

    def is_retired(self, generation: int) -> bool:
        with self._lock:
            return generation in self._retired

    def destruction_complete(self, generation: int | None) -> bool:
        with self._lock:
            if generation is None:
                return False  # not known which generations wrapped it: never claimed complete
            return not any(g <= generation for g in self._keks)

    def counts(self) -> tuple[int, int]:
        """(generations in the ring, generations retired)."""
        with self._lock:
            return len(self._keks), len(self._retired)


class FileKeyVault:
    """The ring in ``store.kek``, wrapped data keys in fixed 64-byte slots of ``datakeys.bin``.

    Not an HSM: whoever reads the key files and the database reads the bodies. A KMS-backed
    implementation of the same port replaces it in deployments.
    """

    syncs = True  # new keys are written, then fdatasync'd before the row naming them commits

    def __init__(self, directory: Path) -> None:
        self.ring = KekRing(directory / "store.kek")
        self._slots_path = directory / "datakeys.bin"
        self._lock = threading.Lock()
        fd = os.open(self._slots_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = fd
        self._next = os.fstat(fd).st_size // _SLOT

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- slots ----------------------------------------------------------------------------------------
    def _wrap(self, key: bytes, owner: str) -> bytes:
        generation, wrapped = self.ring.wrap(key, owner)
        return bytes([generation & 0xFF, _V2]) + wrapped + (generation >> 8).to_bytes(2, "big")

    def _read(self, slot: int) -> bytes:
        return os.pread(self._fd, _SLOT, slot * _SLOT)

    def new_data_key(self, owner: str, *, durable: bool = True) -> tuple[int, bytes]:
        key = AESGCM.generate_key(bit_length=256)
        with self._lock:
            slot = self._next
            self._next += 1
            os.pwrite(self._fd, self._wrap(key, owner), slot * _SLOT)
            if durable:
                os.fdatasync(self._fd)
        return slot, key

    def data_key(self, ref: int, owner: str) -> bytes | None:
        raw = self._read(ref)
        found = _slot_generation(raw)
        if found is None:
            return None
        version, generation = found
        return self.ring.unwrap(version, generation, raw[2:62], owner)

    def data_keys(self, wanted: list[tuple[int, str]], *,
                  stored: Mapping[int, WrappedKey] | None = None) -> dict[int, bytes]:
        found = {}
        for ref, owner in wanted:  # a local file: a pread each is as cheap as one batch
            key = self.data_key(ref, owner)
            if key is not None:
                found[ref] = key
        return found

    def generation_of(self, ref: int) -> int | None:
        found = _slot_generation(self._read(ref))
        return found[1] if found is not None else None

    # -- destruction --------------------------------------------------------------------------------
    def destroy(self, ref: int) -> None:
        with self._lock:
            os.pwrite(self._fd, b"\x00" * _SLOT, ref * _SLOT)
            os.fdatasync(self._fd)

    def is_destroyed(self, ref: int) -> bool:
        raw = self._read(ref)
        return len(raw) == _SLOT and not any(raw)

    def destroy_many(self, refs: list[int]) -> None:
        with self._lock:
            for slot in refs:
                os.pwrite(self._fd, b"\x00" * _SLOT, slot * _SLOT)
            os.fdatasync(self._fd)

    def reconcile(self, live_refs: set[int]) -> int:
        zeroed = 0
        with self._lock:
            for slot in range(self._next):
                if slot in live_refs:
                    continue
                if any(self._read(slot)):
                    os.pwrite(self._fd, b"\x00" * _SLOT, slot * _SLOT)
                    zeroed += 1
            if zeroed:
                os.fdatasync(self._fd)
        return zeroed

    def sync(self) -> None:
        os.fdatasync(self._fd)

    # -- generations ----------------------------------------------------------------------------------
    def active_generation(self) -> int:
        return self.ring.active_generation()

    def rotate(self, now_ms: int) -> int:
        return self.ring.rotate(now_ms)

    def rewrap(self, ref: int, owner: str) -> bool:
        """Re-wrap one slot under the active generation (KEK rotation); synced by the caller."""
        key = self.data_key(ref, owner)
        if key is None:
            return False
        with self._lock:
            os.pwrite(self._fd, self._wrap(key, owner), ref * _SLOT)
        return True

    def wrapping_generations(self) -> set[int]:
        """The generations some key in the vault is wrapped by now: live keys, and keys created
        by a transaction still in flight (which must not find their generation retired)."""
        with self._lock:
            n = self._next
            raw = os.pread(self._fd, n * _SLOT, 0) if n else b""
        found = set()
        for slot in range(len(raw) // _SLOT):
            g = _slot_generation(raw[slot * _SLOT:(slot + 1) * _SLOT])
            if g is not None:
                found.add(g[1])
        return found

    def retire(self, generation: int, now_ms: int) -> None:
        self.ring.retire(generation, now_ms)

    def generations(self) -> list[GenerationState]:
        return self.ring.generations()

    def is_retired(self, generation: int) -> bool:
        return self.ring.is_retired(generation)

    def destruction_complete(self, generation: int | None) -> bool:
        return self.ring.destruction_complete(generation)

    # -- reports ----------------------------------------------------------------------------------------
    def slot_counts(self) -> tuple[int, int]:
        """(live, destroyed) data-key slots, from one read of the slot file (metrics)."""
        with self._lock:
            n = self._next
            raw = os.pread(self._fd, n * _SLOT, 0) if n else b""
        live = sum(1 for s in range(len(raw) // _SLOT) if any(raw[s * _SLOT:(s + 1) * _SLOT]))
        return live, n - live

    def status(self) -> dict[str, int | str]:
        live, _ = self.slot_counts()
        held, retired = self.ring.counts()
        return {"active_kek": self.active_generation(), "keks": held, "retired_keks": retired,
                "slots": self._next, "live_slots": live}


def open_key_directory(directory: Path) -> FileKeyVault | None:
    """The file vault kept in ``directory`` (a restore's source keys), or None when it holds none."""
    if not (directory / "store.kek").is_file() or not (directory / "datakeys.bin").is_file():
        return None
    return FileKeyVault(directory)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
