"""The store conformance suite, importable: every guarantee of the engine port
(``store/engine.py``) and the ``Store``/``Tx`` port (``port.py``) as a check an engine runs.

An engine is ready when it passes every check. An engine written outside this repository runs
the suite the same way the repository's engines do (tests/store/test_store_conformance.py), by
handing it a *target*: something that opens stores (the store kernel over its engine and a key
vault) on one database, with the capabilities of that database::

    from engram_core.store.conformance import validate

    report = validate(lambda root: MyTarget(root))   # a fresh target (and database) per check
    assert report.passed, report.describe()

or one check per pytest test, over ``CHECKS`` (see ``Target`` for what a target provides).

Capability flags decide which parts of a check apply, never whether the suite runs: a target
with ``several_writers`` gets checks with several cores over one database, one without gets the
same checks with one store (and a sole writer's answers: every claim succeeds, every lease is
held); ``processes`` False (an engine no other process can reach) checks that a second store on
the database is fenced off instead of starting a second process. What the engine says of itself
(``EngineCapabilities``, read through ``store.capabilities``) is checked as it says.
"""

from __future__ import annotations

import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any, Protocol

from engram_core.store.conformance.checks_cores import CORE_CHECKS
from engram_core.store.conformance.checks_rows import ROW_CHECKS

CHECKS: list[Callable[[Any], None]] = ROW_CHECKS + CORE_CHECKS


class Target(Protocol):
    """One database an engine keeps, and how to open stores on it.

    ``name``: the engine's name (reports). ``several_writers``: several stores (cores) may be open
    on the database at once, each a ``StoreKernel`` of its own. ``processes``: another process can
    open the database (``run_process`` runs Python there)."""

    name: str
    several_writers: bool
    processes: bool

    def open(self) -> Any:
        """A store (``kernel.StoreKernel`` over the engine) on the database, with the key vault as
        its ``vault`` attribute (checks destroy and inspect keys); FENCE_LOST where the database
        is one writer's and a store is open on it."""
        ...

    def reopen(self, store: Any) -> Any:
        """Close ``store`` and open another on the same database (what it committed is there)."""
        ...

    def close(self, store: Any) -> None: ...

    def run_process(self, body: str, timeout: float = 120) -> CompletedProcess[str]:
        """Run ``body`` (Python, with ``store`` opened on the database) in a process of its own."""
        ...

    def close_all(self) -> None:
        """Close every store still open (after each check, whatever it left)."""
        ...


@dataclass
class Report:
    """What ``validate`` found: each check's name and failure (a traceback), per target."""

    target: str
    passed_checks: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures and bool(self.passed_checks)

    def describe(self) -> str:
        lines = [f"{self.target}: {len(self.passed_checks)} passed, {len(self.failures)} failed"]
        lines += [f"FAILED {name}\n{trace}" for name, trace in self.failures.items()]
        return "\n".join(lines)


def check_name(check: Callable[[Any], None]) -> str:
    return check.__name__.removeprefix("check_")


def validate(make_target: Callable[[Path], Target], *, checks: list[Callable[[Any], None]] | None = None,
             root: Path | None = None) -> Report:
    """Run ``checks`` (every check) each on a fresh target ``make_target(directory)`` (a directory
    of its own, under ``root`` or a temporary one); a check fails by raising."""
    report: Report | None = None
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        for n, check in enumerate(checks if checks is not None else CHECKS):
            directory = Path(tmp) / f"{n:02d}"
            directory.mkdir()
            target = make_target(directory)
            report = report or Report(target.name)
            try:
                check(target)
                report.passed_checks.append(check_name(check))
            except Exception:  # noqa: BLE001 - the report says what failed and why
                report.failures[check_name(check)] = traceback.format_exc()
            finally:
                target.close_all()
    return report if report is not None else Report("none")


__all__ = ["CHECKS", "CORE_CHECKS", "ROW_CHECKS", "Report", "Target", "check_name", "validate"]
