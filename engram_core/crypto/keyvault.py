"""The KeyVault port: store KEK and data keys, both outside the database file.

Why outside: a data key deleted from a DuckDB table can linger in freed pages
of the file, which would defeat crypto-shredding. Here each data key is wrapped
by the store KEK (AES-256-GCM, associated data binding the owner and KEK) and
written into a fixed-size slot of ``datakeys.bin``; destroying it overwrites
the slot with zeros and fsyncs. The database only stores the slot number.

Durability order (SPEC §7, §10): a new key's slot is fsynced before the
transaction that references it commits; a destroyed key's slot is zeroed after
the transaction that destroys it commits. ``reconcile`` zeroes every slot the
database does not reference, which completes destructions interrupted by a
crash and clears slots of transactions that never committed.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_NONCE = 12
_SLOT = 64  # 1 byte KEK index + 1 byte version + 12 nonce + 32 key + 16 tag + 2 pad
_VERSION = 1


class KeyVault(Protocol):
    def new_data_key(self, owner: str, *, durable: bool = True) -> tuple[int, bytes]:
        """Create a data key for ``owner``; returns (slot, key). ``durable=False``: written but
        not yet synced; ``sync`` must run before anything naming the slot commits."""
        ...

    def data_key(self, slot: int, owner: str) -> bytes | None:
        """The data key in ``slot`` for ``owner``, or None if destroyed."""
        ...

    def destroy(self, slot: int) -> None:
        """Overwrite the slot with zeros, durably."""
        ...

    def rotate(self) -> int:
        """Create and activate a new KEK; returns its index."""
        ...

    def rewrap(self, slot: int, owner: str) -> bool: ...

    def sync(self) -> None: ...

    def destroy_many(self, slots: list[int]) -> None: ...

    def reconcile(self, live_slots: set[int]) -> int:
        """Zero every non-empty slot not in ``live_slots``; returns how many."""
        ...

    def status(self) -> dict[str, int | str]: ...


def _ad(kek_index: int, owner: str) -> bytes:
    return f"engram/data-key/v1\x00{kek_index}\x00{owner}".encode()


class FileKeyVault:
    """KEKs in ``store.kek`` (mode 0600), wrapped data keys in ``datakeys.bin``.

    Not an HSM: whoever reads the key files and the database reads the bodies.
    A KMS-backed implementation of the same port replaces it in deployments.
    """

    def __init__(self, directory: Path) -> None:
        self._kek_path = directory / "store.kek"
        self._slots_path = directory / "datakeys.bin"
        self._lock = threading.Lock()
        if self._kek_path.exists():
            state = json.loads(self._kek_path.read_text())
        else:
            state = {"active": 1, "keks": {"1": secrets.token_bytes(32).hex()}}
            _write_private(self._kek_path, json.dumps(state).encode())
        self._active = int(state["active"])
        self._keks = {int(k): bytes.fromhex(v) for k, v in state["keks"].items()}
        fd = os.open(self._slots_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._fd = fd
        size = os.fstat(fd).st_size
        self._next = size // _SLOT

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _wrap(self, kek_index: int, key: bytes, owner: str) -> bytes:
        nonce = secrets.token_bytes(_NONCE)
        body = AESGCM(self._keks[kek_index]).encrypt(nonce, key, _ad(kek_index, owner))
        slot = bytes([kek_index, _VERSION]) + nonce + body
        return slot + b"\x00" * (_SLOT - len(slot))

    def _read(self, slot: int) -> bytes:
        return os.pread(self._fd, _SLOT, slot * _SLOT)

    def new_data_key(self, owner: str, *, durable: bool = True) -> tuple[int, bytes]:
        key = AESGCM.generate_key(bit_length=256)
        with self._lock:
            slot = self._next
            self._next += 1
            os.pwrite(self._fd, self._wrap(self._active, key, owner), slot * _SLOT)
            if durable:
                os.fdatasync(self._fd)
        return slot, key

    def data_key(self, slot: int, owner: str) -> bytes | None:
        raw = self._read(slot)
        if len(raw) < _SLOT or raw[1] != _VERSION:
            return None
        kek = self._keks.get(raw[0])
        if kek is None:
            return None
        try:
            return AESGCM(kek).decrypt(raw[2:14], raw[14:62], _ad(raw[0], owner))
        except Exception:
            return None

    def destroy(self, slot: int) -> None:
        with self._lock:
            os.pwrite(self._fd, b"\x00" * _SLOT, slot * _SLOT)
            os.fdatasync(self._fd)

    def destroy_many(self, slots: list[int]) -> None:
        with self._lock:
            for slot in slots:
                os.pwrite(self._fd, b"\x00" * _SLOT, slot * _SLOT)
            os.fdatasync(self._fd)

    def rotate(self) -> int:
        """Create and activate a new KEK (durable first); returns its index.

        Callers then ``rewrap`` every live slot (owners come from the database,
        they are bound in the AD), ``sync``, and ``retire_unused_keks``.
        """
        with self._lock:
            new_index = max(self._keks) + 1
            if new_index > 255:
                raise RuntimeError("KEK index space exhausted")
            self._keks[new_index] = secrets.token_bytes(32)
            self._active = new_index
            self._persist_keks(active=new_index)
            return new_index

    def rewrap(self, slot: int, owner: str) -> bool:
        """Re-wrap one slot under the active KEK (used by KEK rotation)."""
        key = self.data_key(slot, owner)
        if key is None:
            return False
        with self._lock:
            os.pwrite(self._fd, self._wrap(self._active, key, owner), slot * _SLOT)
        return True

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def retire_unused_keks(self, live_slots: set[int]) -> list[int]:
        """Drop KEKs that no live slot is wrapped under any more."""
        with self._lock:
            used = {self._read(s)[0] for s in live_slots}
            retired = [k for k in self._keks if k != self._active and k not in used]
            for k in retired:
                del self._keks[k]
            if retired:
                self._persist_keks(active=self._active)
            return retired

    def _persist_keks(self, *, active: int) -> None:
        state = {"active": active, "keks": {str(k): v.hex() for k, v in self._keks.items()}}
        _write_private(self._kek_path, json.dumps(state).encode())

    def reconcile(self, live_slots: set[int]) -> int:
        zeroed = 0
        with self._lock:
            for slot in range(self._next):
                if slot in live_slots:
                    continue
                if any(self._read(slot)):
                    os.pwrite(self._fd, b"\x00" * _SLOT, slot * _SLOT)
                    zeroed += 1
            if zeroed:
                os.fdatasync(self._fd)
        return zeroed

    def slot_counts(self) -> tuple[int, int]:
        """(live, destroyed) data-key slots, from one read of the slot file (metrics)."""
        with self._lock:
            n = self._next
            raw = os.pread(self._fd, n * _SLOT, 0) if n else b""
        live = sum(1 for s in range(len(raw) // _SLOT) if any(raw[s * _SLOT:(s + 1) * _SLOT]))
        return live, n - live

    def status(self) -> dict[str, int | str]:
        live = sum(1 for s in range(self._next) if any(self._read(s)))
        return {"active_kek": self._active, "keks": len(self._keks), "slots": self._next, "live_slots": live}


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
