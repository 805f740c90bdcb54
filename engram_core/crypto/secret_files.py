"""The core's 32-byte secret files (``index.key``, ``page.key``, the decision log's pseudonym
key): made once, owner-only from the first byte, and never seen half-written.

Several cores over one PostgreSQL share a key directory and may start at the same moment, so
"create if absent" must have one winner and no reader of a partial file: the secret is written
and synced under a temporary name, then linked into place (``link`` fails where the name
exists); a loser reads the winner's whole file."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

SECRET_BYTES = 32


def load_or_create_secret(path: Path) -> bytes:
    """The secret in ``path``, made (32 random bytes, mode 0600) if there is none yet."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(SECRET_BYTES))
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another core made it first: theirs is kept
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _sync_dir(path.parent)
    return path.read_bytes()


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
