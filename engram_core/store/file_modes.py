"""Who may read the data directory: its owner only.

The directory holds the store, its key-encryption key, the host and confirmation signing
keys and the audit spool. It is 0700 and every file in it 0600, also when the directory
already existed with looser modes (an older version, a restore, an operator's ``cp``):
``make_private`` tightens what is there at open, and the `engram serve` / `engram mcp`
processes run with umask 077 so files created later (DuckDB's WAL, spools, key slots,
backups) are born private. Embedders that call ``start_core`` in their own process get the
tightening at open; files DuckDB creates later then sit in a 0700 directory.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
PRIVATE_UMASK = 0o077


def make_private(data_dir: Path) -> None:
    """Create ``data_dir`` (0700) if missing, then set it and everything under it to owner-only.
    Symbolic links are neither followed nor changed."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    os.chmod(data_dir, PRIVATE_DIR)
    for root, dirs, files in os.walk(data_dir):
        for name in dirs + files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) and stat.S_IMODE(mode) != PRIVATE_DIR:
                os.chmod(path, PRIVATE_DIR)
            elif stat.S_ISREG(mode) and stat.S_IMODE(mode) != PRIVATE_FILE:
                os.chmod(path, PRIVATE_FILE)


def private_umask() -> None:
    """For the processes that own a data directory: every file they create is owner-only."""
    os.umask(PRIVATE_UMASK)


def narrow_to_owner(fd: int, what: str, holds: str, log: logging.Logger) -> None:
    """An append-only sink opened on a file that already existed with a wider mode (``os.open``'s
    mode only applies to a file it creates) is tightened to 0600, and the widening is logged on ``log``: the
    ``what`` (e.g. "audit device X") ``holds`` things other local users must not read. A file this
    process cannot tighten (another user owns it) is OSError, so the caller refuses the sink. Only
    regular files: a character device or FIFO given as the sink keeps its mode."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o077:
        return
    mode = stat.S_IMODE(st.st_mode)
    try:
        os.fchmod(fd, PRIVATE_FILE)
    except OSError as exc:
        raise OSError(exc.errno, f"mode {mode:04o} and not ours to make 0600") from None
    log.warning("%s had mode %04o; now 0600 (whoever could read it may have read its %s)", what, mode, holds)
