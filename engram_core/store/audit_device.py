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

Line format (one canonical-JSON document per line):
``{"kind": "audit", ...the audit row: chain, seq, prev_digest, row_digest, ...}`` or
``{"kind": "abort", "chain": …, "seqs": [...]}`` or, when the store opens, ``{"kind": "open",
"heads": {chain: [seq, row_digest], ...}}`` (the head of every chain then). Rows carry their
chain, position and digest, so ``check_device`` can compare the database against the device
(``engram admin verify --device``), chain by chain. Lines written before the audit log had
several chains (no ``chain`` field; ``open`` with one ``seq``/``row_digest``) belong to the
legacy chain.

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
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs

from engram_core.contract.canonical import canonical_json
from engram_core.contract.errors import Code, EngramError
from engram_core.store.chain import GENESIS, LEGACY_CHAIN, audit_digest_of
from engram_core.store.file_modes import narrow_to_owner

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
            # Its rows name principals, operations and digests (issue 26.7); the data directory's
            # files are tightened the same way at every open (make_private).
            narrow_to_owner(self._fd, f"audit device {self.name}", "rows", log)
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

    def opened(self, heads: dict[str, tuple[int, str]]) -> None:
        """Best effort: the store (re)opened at these chain heads. Rows on the device past them
        never reached the store (a crash between the device write and COMMIT, or a truncation)."""
        line = {"kind": "open", "heads": {chain: [seq, digest] for chain, (seq, digest) in sorted(heads.items())}}
        try:
            self._write(canonical_json(line) + b"\n", fail_closed=True)
        except EngramError:
            log.error("no audit device took the open line")

    def abort(self, chain: str, seqs: list[int]) -> None:
        """Best effort: these rows of ``chain`` were written but never became durable in the store."""
        try:
            self._write(canonical_json({"kind": "abort", "chain": chain, "seqs": seqs}) + b"\n", fail_closed=True)
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
class _ChainOnDevice:
    """One chain as the device's lines tell it (see ``check_device``)."""

    def __init__(self, shared: bool = False) -> None:
        self.rows: dict[int, tuple[str, str]] = {}  # seq -> (prev_digest, row_digest)
        self.heads: set[tuple[int, str]] = set()  # where the next row may attach (empty: anywhere)
        self.first: int | None = None
        # One of several cores' devices: a chain the cores share (a scope's) has the other cores'
        # rows between this one's, so a gap is no fork here; the merged devices are linked instead.
        self.shared = shared

    def abort(self, seqs: list[int]) -> None:
        if seqs and seqs[0] in self.rows:
            before = (seqs[0] - 1, self.rows[seqs[0]][0])
            for x in seqs:
                self.rows.pop(x, None)
            self.heads = {before}

    def opened(self, chain: str, seq: int, digest: str, problems: list[dict[str, Any]]) -> None:
        if self.first is None:
            self.first = seq + 1  # rows up to the head at the first open predate the device
        elif seq > 0 and (seq in self.rows or not self.shared) and self.rows.get(seq, ("", ""))[1] != digest:
            problems.append(_where(chain, seq, "device_fork"))  # the store's head is not ours
        lost = sorted(x for x in self.rows if x > seq)
        if lost:
            problems.append({**_where(chain, lost[0], "device_lost_at_restart"), "count": len(lost)})
            for x in lost:
                self.rows.pop(x)
        self.heads = {(seq, digest if seq > 0 else GENESIS)}

    def row(self, chain: str, seq: int, prev: str, digest: str, problems: list[dict[str, Any]]) -> None:
        if self.shared:
            if seq in self.rows and self.rows[seq][1] != digest:
                problems.append(_where(chain, seq, "device_fork"))  # this core wrote that position before
        elif self.heads and (seq - 1, prev) not in self.heads:
            problems.append(_where(chain, seq, "device_fork"))
        self.first = seq if self.first is None else self.first
        for x in [x for x in self.rows if x >= seq]:
            self.rows.pop(x)  # a fork (already reported) replaces what followed
        self.rows[seq] = (prev, digest)
        self.heads = {(seq, digest)}


def _where(chain: str, seq: int | str, problem: str) -> dict[str, Any]:
    return {"chain": chain, "seq": str(seq), "problem": problem} if chain else {"seq": str(seq), "problem": problem}


def check_device(rows: list[dict[str, Any]], lines: list[bytes]) -> dict[str, Any]:
    return check_devices(rows, [lines])


def check_devices(rows: list[dict[str, Any]], devices: list[list[bytes]]) -> dict[str, Any]:
    """Problems between the store's audit rows and a device's lines, chain by chain.

    The device is read as the chains the core wrote: each row must follow the one before it in
    its chain (``seq`` + 1, ``prev_digest`` = its digest). A row that does not (the store's chain
    was cut back or rewritten and the core went on from there) is ``device_fork``; only an
    ``abort`` line (a row that never became durable) rewinds a chain legitimately. Then every row
    of the store must be on the device with the same digest (``device_missing`` /
    ``device_mismatch``), except rows older than the chain's first line on the device (a device
    added to a running store). Lines past the store's heads are rows of calls made after the rows
    were read (this check's own).

    Several devices are those of the several cores of one store, each holding the rows its core
    wrote: a chain the cores share has the others' rows between one core's, so each device is read
    without the next-row rule, and the devices merged must link (each row's ``prev_digest`` the
    digest of the row before it, on whichever device) and hold every row from the earliest
    device's first line on.
    """
    problems: list[dict[str, Any]] = []
    shared = len(devices) > 1
    per_device = [_read_device(lines, shared, problems) for lines in devices]
    chains = per_device[0] if not shared else _merged(per_device, problems)
    for r in rows:
        chain, seq = str(r.get("chain", LEGACY_CHAIN)), int(r["seq"])
        on_device = chains.get(chain)
        if on_device is None or on_device.first is None or seq < on_device.first:
            continue
        if seq not in on_device.rows:
            problems.append(_where(chain, seq, "device_missing"))
        elif on_device.rows[seq][1] != r["row_digest"]:
            problems.append(_where(chain, seq, "device_mismatch"))
    firsts = {c: str(ch.first or 0) for c, ch in chains.items()}
    return {"ok": not problems, "rows": len(rows), "lines": sum(len(ch.rows) for ch in chains.values()),
            "first_seq": firsts.get(LEGACY_CHAIN, min(firsts.values(), default="0")), "chains": len(chains),
            "problems": problems}


def _read_device(lines: list[bytes], shared: bool, problems: list[dict[str, Any]]) -> dict[str, _ChainOnDevice]:
    """One device's lines, chain by chain (its forks and unreadable lines added to ``problems``)."""
    chains: dict[str, _ChainOnDevice] = {}
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
            kind = doc.pop("kind")
            if kind == "abort":
                chains.setdefault(str(doc.get("chain", LEGACY_CHAIN)), _ChainOnDevice(shared)).abort(
                    sorted(int(x) for x in doc["seqs"]))
                continue
            if kind == "open":
                heads = ({str(c): (int(h[0]), str(h[1])) for c, h in doc["heads"].items()} if "heads" in doc
                         else {LEGACY_CHAIN: (int(doc["seq"]), str(doc["row_digest"]))})
                # The open line names every chain the store holds: one it does not name has lost
                # every row it had on the device.
                for chain in sorted(set(chains) | set(heads)):
                    seq, digest = heads.get(chain, (0, GENESIS))
                    chains.setdefault(chain, _ChainOnDevice(shared)).opened(chain, seq, digest, problems)
                continue
            chain = str(doc.get("chain", LEGACY_CHAIN))
            seq, prev, digest = int(doc["seq"]), str(doc["prev_digest"]), str(doc["row_digest"])
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append({"seq": f"line {n}", "problem": "device_line_unreadable"})
            continue
        if audit_digest_of(doc) != digest:
            problems.append(_where(chain, seq, "device_line_digest"))
            continue
        chains.setdefault(chain, _ChainOnDevice(shared)).row(chain, seq, prev, digest, problems)
    return chains


def _merged(per_device: list[dict[str, _ChainOnDevice]], problems: list[dict[str, Any]]) -> dict[str, _ChainOnDevice]:
    """The devices of several cores as one: a position two devices hold with different rows, or a
    row that does not link to the one before it on whichever device holds that one, is a fork."""
    merged: dict[str, _ChainOnDevice] = {}
    for chains in per_device:
        for chain, on_device in chains.items():
            into = merged.setdefault(chain, _ChainOnDevice(shared=True))
            if on_device.first is not None:
                into.first = on_device.first if into.first is None else min(into.first, on_device.first)
            for seq, row in on_device.rows.items():
                if seq in into.rows and into.rows[seq] != row:
                    problems.append(_where(chain, seq, "device_fork"))
                into.rows.setdefault(seq, row)
    for chain, into in merged.items():
        for seq, (prev, _digest) in sorted(into.rows.items()):
            before = into.rows.get(seq - 1)
            if before is not None and before[1] != prev:
                problems.append(_where(chain, seq, "device_fork"))
    return merged


def check_device_file(path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return check_device_files([path], rows)


def check_device_files(paths: list[Path], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``engram admin verify --device FILE…``: one file per core (every core of a store with several
    writes a device of its own; together they must hold every row)."""
    return check_devices(rows, [p.read_bytes().split(b"\n") for p in paths])
