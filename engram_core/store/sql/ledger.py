"""The migration ledger checked against an engine's code: each version the ledger records must
be one the code knows with the same checksum, and the versions dense from 1."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from engram_core.contract.errors import Code, EngramError


class Versioned(Protocol):
    @property
    def version(self) -> int: ...
    @property
    def checksum(self) -> str: ...


M = TypeVar("M", bound=Versioned)


def pending_migrations(ledger: Mapping[int, str], migrations: Sequence[M], *, newer_engine: bool = False) -> list[M]:
    """What of ``migrations`` the ledger (version → checksum) lacks, after checking it against
    them: another checksum, a version the code does not know, or a gap is
    MIGRATION_LEDGER_INVALID. ``newer_engine``: an unknown version is reported as the work of a
    newer engine (the database is shared by cores of several releases)."""
    known = {m.version: m for m in migrations}
    newer = sorted(v for v in ledger if v not in known)
    if newer and newer_engine:
        raise EngramError(Code.MIGRATION_LEDGER_INVALID,
                          f"the database was migrated by a newer engine (ledger versions {newer}; this engine "
                          f"knows up to {max(known)}): upgrade this core")
    for version, checksum in ledger.items():
        if version not in known or known[version].checksum != checksum:
            raise EngramError(Code.MIGRATION_LEDGER_INVALID, f"ledger version {version} does not match code")
    if ledger and sorted(ledger) != list(range(1, max(ledger) + 1)):
        raise EngramError(Code.MIGRATION_LEDGER_INVALID, "ledger has gaps")
    return [m for m in migrations if m.version not in ledger]
