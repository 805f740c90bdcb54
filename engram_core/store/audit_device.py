"""Audit devices: every audit row also streamed to a sink outside the data directory.

Whoever can write the data directory can rewrite the ``audit`` table and recompute its hash
chain. An audit device is a copy the core only ever appends to, somewhere that attacker
cannot reach (another disk, another user's file, a log shipper's socket). Vault's audit
devices are the model: a row is written to the devices *before* the call it records answers,
and if no device accepts it the call fails closed (SPEC §10: a mutation whose audit row cannot
be written does not happen).

- Transactional rows (mutations) are written when the transaction is about to commit; a
  device failure rolls it back. Should the COMMIT itself then fail (MUTATION_OUTCOME_UNKNOWN),
  the device keeps the rows; if they did not commit, the next rows reuse their positions and
  ``check_device`` reports a fork there for the operator to look at. Rows written just before a
  crash that never reached the store show at the next open as ``device_lost_at_restart``.
- Spooled rows (reads, refusals; audit_spool.py) are written before they are appended to the
  spool; if that append fails, an ``abort`` line follows.

Line format (one canonical-JSON document per line, ``engram-audit-device/v1``):
``{"kind": "audit", ...the audit row: seq, prev_digest, row_digest, ...}`` or
``{"kind": "abort", "seqs": [...]}`` or, when the store opens, ``{"kind": "open", "seq": …,
"row_digest": …}`` (its audit head then). Rows carry their chain position and digest, so
``check_device`` can compare the database against the device (``engram admin verify --device``).

Devices (``engram serve --audit-device SPEC``, repeatable):
- ``file:/path`` — appended with O_APPEND, mode 0600; each batch is one ``write(2)`` (the
  kernel has it when the call answers: it survives a crash of the core, not of the machine).
  ``file:/path?fsync=1`` also ``fdatasync``s each batch (survives power loss; ~0.3 ms a row).
- ``unix:/path`` — a Unix stream socket (a log shipper, syslog-ng's ``unix-stream()``
  source); one ``sendall`` per batch; a broken connection is retried once.

syslog through ``/dev/log`` is not offered: a datagram syslog client cannot tell whether the
row was accepted, so it cannot fail closed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs

from engram_core.canonical import canonical_json
from engram_core.errors import Code, EngramError
from engram_core.store.chain import GENESIS, audit_digest_of

log = logging.getLogger("engram.audit_device")


class AuditDevice(Protocol):
    name: str

    def write(self, data: bytes) -> None:
        """Write whole lines or raise OSError."""

    def close(self) -> None: ...


class FileDevice:
    def __init__(self, path: Path, *, fsync: bool) -> None:
        self.name = f"file:{path}"
        self._fsync = fsync
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            _owner_only(self._fd, self.name)
        except OSError:
            os.close(self._fd)
            raise

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            if n <= 0:
                raise OSError("short write")
            view = view[n:]
        if self._fsync:
            os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def _owner_only(fd: int, name: str) -> None:
    """A device file that already existed with a wider mode is tightened to 0600 (issue 26.7):
    its rows name principals, operations and digests, which other local users must not read, and
    the data directory's files are tightened the same way at every open (store/file_modes.py).
    If it cannot be (another user owns it), the device is refused: OSError, and `engram serve`
    stops. Only regular files: a character device or FIFO given as the sink keeps its mode."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o077:
        return
    try:
        os.fchmod(fd, 0o600)
    except OSError as exc:
        raise OSError(exc.errno, f"mode {stat.S_IMODE(st.st_mode):04o} and not ours to make 0600") from None
    log.warning("audit device %s had mode %04o; now 0600 (whoever could read it may have read its rows)",
                name, stat.S_IMODE(st.st_mode))


class UnixSocketDevice:
    def __init__(self, path: str) -> None:
        self.name = f"unix:{path}"
        self._path = path
        self._sock: socket.socket | None = None
        self._connect()

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        sock.connect(self._path)
        self._sock = sock

    def write(self, data: bytes) -> None:
        for attempt in range(2):
            try:
                if self._sock is None:
                    self._connect()
                self._sock.sendall(data)  # type: ignore[union-attr]
                return
            except OSError:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                if attempt == 1:
                    raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()


def open_device(spec: str) -> AuditDevice:
    """``file:/path[?fsync=1]`` or ``unix:/path``; ValueError names what is wrong."""
    kind, _, rest = spec.partition(":")
    path, _, query = rest.partition("?")
    if not path:
        raise ValueError(f"audit device {spec!r}: expected file:/path or unix:/path")
    options = parse_qs(query)
    if kind == "file":
        try:
            return FileDevice(Path(path), fsync=options.get("fsync", ["0"])[0] in ("1", "true"))
        except OSError as exc:
            raise ValueError(f"audit device {spec!r}: {exc.strerror}") from None
    if kind == "unix":
        try:
            return UnixSocketDevice(path)
        except OSError as exc:
            raise ValueError(f"audit device {spec!r}: {exc.strerror}") from None
    raise ValueError(f"audit device {spec!r}: unknown kind {kind!r} (file or unix)")


class AuditDevices:
    """The configured devices. A batch of rows is accepted when at least one device took it."""

    def __init__(self, devices: list[AuditDevice]) -> None:
        self._devices = devices
        self._lock = threading.Lock()  # callers hold the store's write lock; this guards close()
        # Failed writes per device since start (metrics: engram_audit_device_write_failures_total).
        self.failures: dict[str, int] = {dev.name: 0 for dev in devices}

    def __bool__(self) -> bool:
        return bool(self._devices)

    def write_rows(self, docs: list[dict[str, Any]]) -> None:
        """Write the rows to every device; STORE_UNAVAILABLE when none accepted them."""
        self._write(b"".join(canonical_json({"kind": "audit", **d}) + b"\n" for d in docs), fail_closed=True)

    def opened(self, head: tuple[int, str]) -> None:
        """Best effort: the store (re)opened at this audit head. Rows on the device past it never
        reached the store (a crash between the device write and COMMIT, or a truncation)."""
        try:
            self._write(canonical_json({"kind": "open", "seq": head[0], "row_digest": head[1]}) + b"\n",
                        fail_closed=True)
        except EngramError:
            log.error("no audit device took the open line")

    def abort(self, seqs: list[int]) -> None:
        """Best effort: these rows were written but never became durable in the store."""
        try:
            self._write(canonical_json({"kind": "abort", "seqs": seqs}) + b"\n", fail_closed=True)
        except EngramError:
            log.error("audit rows %s aborted but no device took the abort line", seqs)

    def _write(self, data: bytes, *, fail_closed: bool) -> None:
        accepted = 0
        with self._lock:
            for dev in self._devices:
                try:
                    dev.write(data)
                    accepted += 1
                except OSError as exc:
                    self.failures[dev.name] = self.failures.get(dev.name, 0) + 1
                    log.error("audit device %s failed: %s", dev.name, exc.strerror or type(exc).__name__)
        if not accepted and fail_closed:
            raise EngramError(Code.STORE_UNAVAILABLE, "no audit device accepted the row")

    def close(self) -> None:
        with self._lock:
            for dev in self._devices:
                try:
                    dev.close()
                except OSError:
                    pass
            self._devices = []


# -- comparing the store with a device file ---------------------------------------------------
def check_device(rows: list[dict[str, Any]], lines: list[bytes]) -> dict[str, Any]:
    """Problems between the store's audit rows and a device's lines.

    The device is read as the chain the core wrote: each row must follow the one before it
    (``seq`` + 1, ``prev_digest`` = its digest). A row that does not — the store's chain was cut
    back or rewritten and the core went on from there — is ``device_fork``; only an ``abort``
    line (a row that never became durable) rewinds the chain legitimately. Then every row of the
    store must be on the device with the same digest (``device_missing`` / ``device_mismatch``),
    except rows older than the device's first line (a device added to a running store). Lines
    past the store's head are rows of calls made after the rows were read (this check's own).
    """
    problems: list[dict[str, Any]] = []
    chain: dict[int, tuple[str, str]] = {}  # seq -> (prev_digest, row_digest) along the device's chain
    heads: set[tuple[int, str]] = set()  # where the next row may attach (empty: anywhere, first line)
    first: int | None = None
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
            kind = doc.pop("kind")
            if kind == "abort":
                seqs = sorted(int(x) for x in doc["seqs"])
            elif kind == "open":
                seq, digest = int(doc["seq"]), str(doc["row_digest"])
            else:
                seq, prev, digest = int(doc["seq"]), str(doc["prev_digest"]), str(doc["row_digest"])
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append({"seq": f"line {n}", "problem": "device_line_unreadable"})
            continue
        if kind == "abort":
            if seqs and seqs[0] in chain:
                before = (seqs[0] - 1, chain[seqs[0]][0])
                for x in seqs:
                    chain.pop(x, None)
                heads = {before}
            continue
        if kind == "open":
            if first is None:
                first = seq + 1  # rows up to the head at the first open predate the device
            elif seq > 0 and chain.get(seq, ("", ""))[1] != digest:
                problems.append({"seq": str(seq), "problem": "device_fork"})  # the store's head is not ours
            lost = sorted(x for x in chain if x > seq)
            if lost:
                problems.append({"seq": str(lost[0]), "problem": "device_lost_at_restart", "count": len(lost)})
                for x in lost:
                    chain.pop(x)
            heads = {(seq, digest if seq > 0 else GENESIS)}
            continue
        if audit_digest_of(doc) != digest:
            problems.append({"seq": str(seq), "problem": "device_line_digest"})
            continue
        if heads and (seq - 1, prev) not in heads:
            problems.append({"seq": str(seq), "problem": "device_fork"})
        first = seq if first is None else first
        for x in [x for x in chain if x >= seq]:
            chain.pop(x)  # a fork (already reported) replaces what followed
        chain[seq] = (prev, digest)
        heads = {(seq, digest)}
    for r in rows:
        seq = int(r["seq"])
        if first is None or seq < first:
            continue
        if seq not in chain:
            problems.append({"seq": str(seq), "problem": "device_missing"})
        elif chain[seq][1] != r["row_digest"]:
            problems.append({"seq": str(seq), "problem": "device_mismatch"})
    return {"ok": not problems, "rows": len(rows), "lines": len(chain), "first_seq": str(first or 0),
            "problems": problems}


def check_device_file(path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return check_device(rows, path.read_bytes().split(b"\n"))
