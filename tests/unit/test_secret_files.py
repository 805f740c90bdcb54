"""The core's secret files (index.key, page.key, the pseudonym key): one winner among cores
that start at once over a shared key directory, owner-only, never read half-written."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

from engram_core.crypto.secret_files import SECRET_BYTES, load_or_create_secret


def test_cores_starting_at_once_all_read_the_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "index.key"
    start = threading.Barrier(16)
    seen: list[bytes] = []

    def open_core() -> None:
        start.wait()
        seen.append(load_or_create_secret(path))

    threads = [threading.Thread(target=open_core) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 16 and len(set(seen)) == 1
    assert len(seen[0]) == SECRET_BYTES and path.read_bytes() == seen[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.key"]  # no temporary file left


def test_an_existing_secret_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "page.key"
    path.write_bytes(b"k" * SECRET_BYTES)
    assert load_or_create_secret(path) == b"k" * SECRET_BYTES
