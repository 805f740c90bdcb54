"""Where masked decision-log events go: a file of JSON lines with size rotation, or a
decision-log service in OPA's upload format (``POST`` of a gzipped JSON array of events,
``Content-Encoding: gzip``, retried with exponential backoff on anything but 2xx).

Sinks run on the logger's own thread, never on a call's: a slow disk or collector fills the
logger's bounded buffer (whose overflow is counted and said), it does not hold up a decision.
"""

from __future__ import annotations

import gzip
import logging
import os
import random
import time
from collections import deque
from pathlib import Path
from typing import Protocol

import requests

from engram_core.store.file_modes import narrow_to_owner

log = logging.getLogger("engram.decision_log")


class Sink(Protocol):
    name: str

    def write(self, lines: list[bytes]) -> None:
        """Accept serialized events (one JSON object each, no newline)."""
        ...

    def tick(self, now: float) -> None:
        """Do due work (an upload whose backoff has passed)."""
        ...

    def close(self, deadline: float) -> int:
        """Deliver what it can before ``deadline`` (monotonic); returns the events left undelivered."""
        ...


class FileSink:
    """JSON Lines in ``path``; past ``max_bytes`` the file becomes ``path.1`` (``path.1`` ->
    ``path.2``, ...) and a new one starts; ``max_files`` files are kept in all. Owner-only
    (0600): the events hold identifiers and pseudonyms, never content, but they are the
    operator's, like the audit log."""

    name = "file"

    def __init__(self, path: Path, *, max_bytes: int = 100 * 1024 * 1024, max_files: int = 5,
                 fsync: bool = False) -> None:
        if max_bytes < 1024 or max_files < 1:
            raise ValueError("max_file_bytes must be at least 1024 and max_files at least 1")
        self.path = Path(path)
        self.max_bytes, self.max_files, self.fsync = max_bytes, max_files, fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # Its events name pseudonyms, paths and audit ids (issue 57.6), as the audit device's rows do.
            narrow_to_owner(fd, f"decision log {self.path}", "events", log)
        except OSError as exc:
            os.close(fd)
            raise OSError(exc.errno, f"decision log {self.path}: {exc.strerror}") from None
        return fd

    def write(self, lines: list[bytes]) -> None:
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if self._size + size + len(line) + 1 > self.max_bytes and (self._size + size) > 0:
                self._flush(chunk)
                chunk, size = [], 0
                self._rotate()
            chunk.append(line + b"\n")
            size += len(line) + 1
        self._flush(chunk)

    def _flush(self, chunk: list[bytes]) -> None:
        if not chunk:
            return
        data = b"".join(chunk)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(data)
        if self.fsync:
            os.fsync(self._fd)

    def _rotate(self) -> None:
        os.close(self._fd)
        for i in range(self.max_files - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if i == self.max_files - 1 and older.exists():
                older.unlink()
            if i > 1:
                newer = self.path.with_name(f"{self.path.name}.{i - 1}")
                if newer.exists():
                    newer.rename(older)
        if self.max_files > 1:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        self._fd = self._open()
        self._size = 0

    def tick(self, now: float) -> None:
        pass

    def close(self, deadline: float) -> int:
        os.close(self._fd)
        return 0


class HttpSink:
    """OPA's decision-log upload API: events are sent in chunks of at most
    ``upload_size_limit_bytes`` (uncompressed JSON), every ``min_delay_seconds`` while events
    wait (at once when a chunk is full); a failed upload keeps its chunk and backs off exponentially (from
    ``min_delay_seconds``, jittered, capped at ``max_delay_seconds``). Events waiting beyond
    ``backlog_bytes`` are dropped oldest first and counted (``dropped``)."""

    name = "http"

    def __init__(self, url: str, *, upload_size_limit_bytes: int = 32768, min_delay_seconds: float = 1.0,
                 max_delay_seconds: float = 10.0, backlog_bytes: int = 16 * 1024 * 1024, timeout_s: float = 10.0,
                 bearer_token: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"decision log URL must be http:// or https://, got {url!r}")
        self.url = url
        self.limit = upload_size_limit_bytes
        self.min_delay, self.max_delay = min_delay_seconds, max_delay_seconds
        self.backlog_bytes, self.timeout_s = backlog_bytes, timeout_s
        self._session = requests.Session()
        self._session.headers.update({"Content-Type": "application/json", "Content-Encoding": "gzip",
                                      "User-Agent": "engram-decision-log"})
        if bearer_token:
            self._session.headers["Authorization"] = f"Bearer {bearer_token}"
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._next_upload = 0.0
        self._failures = 0
        self.uploads = 0  # chunks delivered
        self.upload_failures = 0
        self.dropped = 0  # events dropped from the backlog

    def write(self, lines: list[bytes]) -> None:
        for line in lines:
            self._pending.append(line)
            self._pending_bytes += len(line)
        while self._pending_bytes > self.backlog_bytes and self._pending:
            self._pending_bytes -= len(self._pending.popleft())
            self.dropped += 1
        if self._pending_bytes >= self.limit and self._failures == 0:
            self._next_upload = 0.0  # a full chunk goes now

    def tick(self, now: float) -> None:
        if self._pending and now >= self._next_upload:
            self._upload_all(now)

    def _chunk(self) -> tuple[int, bytes]:
        parts: list[bytes] = []
        size = 2
        for line in self._pending:
            if parts and size + len(line) + 1 > self.limit:
                break
            parts.append(line)
            size += len(line) + 1
        return len(parts), b"[" + b",".join(parts) + b"]"

    def _upload_all(self, now: float) -> None:
        while self._pending:
            count, body = self._chunk()
            try:
                response = self._session.post(self.url, data=gzip.compress(body, compresslevel=5),
                                              timeout=self.timeout_s)
                ok = 200 <= response.status_code < 300
                status = str(response.status_code)
            except requests.RequestException as exc:
                ok, status = False, type(exc).__name__
            if not ok:
                self._failures += 1
                self.upload_failures += 1
                delay = min(self.max_delay, self.min_delay * 2 ** min(self._failures - 1, 16))
                self._next_upload = now + delay * random.uniform(0.8, 1.2)
                if self._failures in (1, 10) or self._failures % 100 == 0:
                    log.warning("decision log upload failed (%s); %d events wait; next try in %.1fs",
                                status, len(self._pending), delay)
                return
            for _ in range(count):
                self._pending_bytes -= len(self._pending.popleft())
            self._failures = 0
            self.uploads += 1
        self._next_upload = now + self.min_delay

    def close(self, deadline: float) -> int:
        while self._pending and time.monotonic() < deadline:
            self._next_upload = 0.0
            before = len(self._pending)
            self._upload_all(time.monotonic())
            if len(self._pending) == before:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        self._session.close()
        return len(self._pending)
