"""Where a bundle comes from: a directory or archive on disk, or a bundle server
(``engram_core/policy/pull.py``). A source returns the bundle's files as read; the engine
verifies and compiles them, so every source gets the same checks."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from engram_core.policy.bundle import Bundle, read_bundle


class SourceUnavailable(Exception):
    """The source could not be reached (a bundle server down): unlike a refused bundle,
    trying again later can help."""


class BundleSource(Protocol):
    def load(self) -> Bundle:
        """The bundle as it is now; BundleError when it cannot be read, SourceUnavailable when
        it cannot be fetched."""
        ...

    def describe(self) -> str:
        """Where the bundle comes from, for logs (a path or URL, never a credential)."""
        ...


class DiskSource:
    """A bundle directory (``policies/``) or a bundle archive (``.tar.gz``), read on each load."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> Bundle:
        return read_bundle(self.path)

    def describe(self) -> str:
        return str(self.path)
