"""The intent log: the lone writer's durability point ahead of DuckDB's COMMIT (issue 63).

A mutation that commits alone pays DuckDB's fixed costs in full: two statements and a COMMIT,
~5 ms of CPU for a dozen rows, where the same rows in a group commit of 64 cost ~0.05 ms each.
So a batch whose members prepared only rows, deletes and updates by key (a capture, an
admission, a withdrawal, a forget: ``group_commit.Batch``) is acknowledged when its prepared
writes are in this file and synced, not when DuckDB commits them; the batch stays open in the
writer and later members join it, and DuckDB commits all of them at once when a reader needs
the database, a writer needs the writer alone, or the batch holds ``MAX_ACKED`` members
(``engine.DuckDBEngine``). After that COMMIT the file is emptied.

What an acknowledged write promises is unchanged: a crash at any point loses nothing
acknowledged. At open the engine applies, in order, every frame of the epoch after the one
DuckDB last committed (``store_meta.intents_epoch``, written in the same COMMIT), then empties
the file: a crash between that COMMIT and the emptying replays nothing twice. A frame is
written whole with its length and digest before the sync; a torn or corrupt frame (a crash
mid-write: never acknowledged) ends the log.

The frames hold exactly the row values the database would hold (sealed bodies and projections,
ids, digests), so the file adds no kind of data the database file does not already keep, and a
forget shreds their copies here with its key as it does DuckDB's (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

INTENTS_NAME = "engram.intents"
EPOCH_KEY = "intents_epoch"  # store_meta: the last epoch whose frames DuckDB committed
_MAGIC = b"EGI1"
_HEADER = struct.Struct("<4sIQ")  # magic, payload length, epoch
_DIGEST = 16
_BYTES = "$b"
MAX_FRAME = 64 << 20


class Unloggable(Exception):
    """A prepared write holds a value the log does not encode: the batch commits instead."""


class IntentLogBroken(Exception):
    """A frame failed to be written and the file could not be cut back to its last whole frame."""


def _encode_value(v: Any) -> Any:
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {_BYTES: base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, (list, tuple)):
        return [_encode_value(x) for x in v]
    raise Unloggable(type(v).__name__)


def _decode_value(v: Any) -> Any:
    if isinstance(v, dict):
        return base64.b64decode(v[_BYTES])
    if isinstance(v, list):
        return [_decode_value(x) for x in v]
    return v


def encode_ops(ops: list[tuple[Any, ...]]) -> bytes:
    """A batch's prepared writes (``group_commit`` ops) as the log's payload. A ``sql`` op's
    tables are recomputed from its text when read back."""
    out = []
    for op in ops:
        if op[0] == "sql":
            out.append(["sql", op[1], _encode_value(list(op[2]))])
        else:
            out.append([op[0], *(_encode_value(x) for x in op[1:])])
    try:
        return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: the database takes it, JSON text does not
        raise Unloggable("not UTF-8") from exc


def decode_ops(payload: bytes) -> list[tuple[Any, ...]]:
    from engram_core.store.duckdb.group_commit import tables_of

    ops: list[tuple[Any, ...]] = []
    for raw in json.loads(payload):
        if raw[0] == "sql":
            ops.append(("sql", raw[1], _decode_value(raw[2]), tables_of(raw[1])))
        elif raw[0] == "row":
            ops.append(("row", raw[1], raw[2], raw[3], _decode_value(raw[4])))
        else:
            ops.append((raw[0], *(_decode_value(x) for x in raw[1:])))
    return ops


class IntentLog:
    """``DIR/engram.intents``: frames of (epoch, prepared writes), appended and synced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        if not existed:  # the file's name must survive a crash before its first frame counts
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        self.size = os.fstat(self._fd).st_size

    def frames(self) -> list[tuple[int, list[tuple[Any, ...]]]]:
        """Every whole frame from the start, up to the first torn or corrupt one."""
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        out: list[tuple[int, list[tuple[Any, ...]]]] = []
        at = 0
        while at + _HEADER.size + _DIGEST <= len(data):
            magic, length, epoch = _HEADER.unpack_from(data, at)
            end = at + _HEADER.size + length
            if magic != _MAGIC or length > MAX_FRAME or end + _DIGEST > len(data):
                break
            if hashlib.sha256(data[at:end]).digest()[:_DIGEST] != data[end:end + _DIGEST]:
                break
            out.append((epoch, decode_ops(data[at + _HEADER.size:end])))
            at = end + _DIGEST
        return out

    def append(self, epoch: int, ops: list[tuple[Any, ...]]) -> None:
        """Write one frame and sync it: when this returns, the frame survives a crash."""
        payload = encode_ops(ops)
        if len(payload) > MAX_FRAME:
            raise Unloggable("frame too large")
        head = _HEADER.pack(_MAGIC, len(payload), epoch) + payload
        frame = head + hashlib.sha256(head).digest()[:_DIGEST]
        view = memoryview(frame)
        try:
            while view:
                view = view[os.write(self._fd, view):]
            os.fdatasync(self._fd)
        except OSError:
            # A frame not answered must not stay before frames that will be: cut it off.
            try:
                os.ftruncate(self._fd, self.size)
            except OSError as exc:
                raise IntentLogBroken(str(exc)) from None
            raise
        self.size += len(frame)

    def clear(self) -> None:
        """Empty the file (its frames are committed in DuckDB)."""
        if self.size == 0:
            return
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        self.size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
