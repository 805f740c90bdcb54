"""`engram serve --store postgresql://…` as a subprocess, as an operator starts a replica."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.mcp_helpers import ENGRAM, REPO


@dataclass
class Replica:
    """One running core: what tests/core/core_support.Client needs (``address``, ``host_key_path``)."""

    proc: subprocess.Popen[str]
    address: str
    key_dir: Path
    ready: str
    opened: str
    # (time.monotonic() when read, line): the last lines, filled by ``drain``
    tail: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=2000))

    def drain(self) -> Replica:
        """Read the core's stdout and stderr on threads of their own, keeping the last lines in
        ``tail``: a core that runs long and logs (a pool reconnecting through database restarts)
        otherwise fills a pipe nobody reads and blocks on its next log line, answering nothing."""
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        return self

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.tail.append((time.monotonic(), line))

    def times(self, text: str) -> list[float]:
        """When the kept lines holding ``text`` were read (``drain`` first)."""
        return [at for at, line in list(self.tail) if text in line]

    @property
    def host_key_path(self) -> Path:
        return self.key_dir / "host.key"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_store(conninfo: str, key_dir: Path, env: dict[str, str], *flags: str) -> Replica:
    """Start `engram serve --store` on the database, the password reaching it through PGPASSFILE
    (``env``) only; returns once it listens."""
    proc = subprocess.Popen(
        [ENGRAM, "serve", "--store", conninfo, "--key-dir", str(key_dir), "--listen", "127.0.0.1:0", *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env, "ENGRAM_SEMANTIC": "off"})
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    if "listening on" not in first:
        proc.kill()
        raise AssertionError(f"engram serve --store did not start: {first!r} {proc.stderr.read()[-3000:]}")
    opened = proc.stdout.readline()
    return Replica(proc=proc, address=first.split("listening on ", 1)[1].split()[0], key_dir=key_dir, ready=first,
                   opened=opened)


@contextmanager
def replica_pair(conninfo: str, key_dir: Path, env: dict[str, str], flags_a: tuple[str, ...] = (),
                 flags_b: tuple[str, ...] = ()) -> Iterator[tuple[Replica, Replica]]:
    """Two replicas over one database and key directory (the first creates the ring and the
    secrets, the second mounts them), stopped on leaving."""
    a = serve_store(conninfo, key_dir, env, *flags_a)
    try:
        b = serve_store(conninfo, key_dir, env, *flags_b)
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()
