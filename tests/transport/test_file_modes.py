"""The data directory is 0700 and every file in it 0600, also when it already existed with
looser modes and for files created while the core runs (docs/security.md, "Smaller
exposures"). A real `engram serve` on a directory an operator made 0755; stat after start
and after writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.support.serve_support import admin, serve


def _loose(data: Path) -> dict[str, int]:
    """Every path under ``data`` whose mode is not owner-only, with its mode."""
    found = {}
    for root, dirs, files in os.walk(data):
        for name in dirs + files:
            path = Path(root, name)
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode != (0o700 if path.is_dir() else 0o600):
                found[str(path.relative_to(data))] = oct(mode)
    mode = stat.S_IMODE(data.stat().st_mode)
    if mode != 0o700:
        found["."] = oct(mode)
    return found


def test_a_preexisting_0755_directory_becomes_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    served = serve(data)
    try:
        assert _loose(data) == {}
        names = {p.name for p in data.iterdir()}
        assert {"engram.duckdb", "engram.lock", "host.key", "store.kek", "confirmation.key"} <= names
        # Writes while running create more files (DuckDB's WAL, key slots): owner-only too.
        for i in range(3):
            done = admin(served, "activate", "--tenant", f"t{i}", "--workspace", "ws")
            assert done.returncode == 0, done.stderr
        assert _loose(data) == {}
    finally:
        served.stop()


def test_loosened_files_are_tightened_at_the_next_start(tmp_path):
    data = tmp_path / "data"
    serve(data).stop()
    data.chmod(0o755)
    for path in data.iterdir():
        path.chmod(0o644)  # an operator's cp, an old version, a restore
    assert _loose(data)
    served = serve(data)
    try:
        assert _loose(data) == {}
    finally:
        served.stop()
