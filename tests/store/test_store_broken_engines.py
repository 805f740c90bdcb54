"""The conformance suite catches what a careless engine gets wrong: each broken engine here makes
one shortcut an engine is tempted by, and the checks that guard against it fail on it (while the
real engine passes them, test_store_conformance.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engram_core.contract.scope import Scope
from engram_core.store.conformance import validate
from engram_core.store.conformance.checks_rows import (
    check_a_key_written_is_found_again_after_reopening,
    check_journal_cursors_stay_dense_under_racing_writers,
    check_the_scope_head_is_read_from_storage_not_remembered,
)
from engram_core.store.duckdb.engine import DuckDBEngine, DuckDBEngineTx
from engram_core.store.key_digests import KeyDigests
from engram_core.store.port import ScopeRow
from tests.support.store_targets import DuckDBTarget


class _ForgetfulDigests(DuckDBEngine):
    """A negative-lookup cache that answers "absent" wrongly: built empty at open instead of from
    the table, so a key written before the store was reopened reads as never written."""

    def _load_key_digests(self) -> None:
        super()._load_key_digests()
        self.idempotency_keys = KeyDigests()
        self.used_grants = KeyDigests()
        self.payload_keys = KeyDigests()


class _RememberedCursorTx(DuckDBEngineTx):
    """A cursor taken from memory: the scope head as it was when the engine opened, never the
    committed one."""

    def scope_for_update(self, scope: Scope) -> ScopeRow:
        remembered = self._store.opened_heads.get(scope)
        if remembered is None:
            remembered = self._store.opened_heads[scope] = super().scope_for_update(scope)
        return remembered


class _RememberedCursor(DuckDBEngine):
    tx_class = _RememberedCursorTx

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.opened_heads: dict[Scope, ScopeRow] = {}
        super().__init__(*args, **kw)


@pytest.mark.parametrize(("engine", "check"), [
    (_ForgetfulDigests, check_a_key_written_is_found_again_after_reopening),
    (_RememberedCursor, check_the_scope_head_is_read_from_storage_not_remembered),
    (_RememberedCursor, check_journal_cursors_stay_dense_under_racing_writers),
], ids=["negative-cache-answers-absent", "cursor-from-memory", "cursor-from-memory-racing"])
def test_a_broken_engine_fails_the_check_that_guards_its_shortcut(
        tmp_path: Path, engine: type[DuckDBEngine], check: Callable[[Any], None]) -> None:
    target = DuckDBTarget(tmp_path, engine_class=engine)
    try:
        with pytest.raises(Exception) as err:  # an assertion, or the database's own constraint refusing
            check(target)
    finally:
        target.close_all()
    # The check failed on what it guards, not on a mistake of the test's own.
    assert not isinstance(err.value, (TypeError, AttributeError, NameError, ImportError, KeyError)), err.value


def test_the_suites_entry_point_reports_a_broken_engine(tmp_path: Path) -> None:
    """``validate`` (what an engine written elsewhere calls) fails an engine that answers
    "absent" from a cache built wrong, naming the check that caught it."""
    report = validate(lambda root: DuckDBTarget(root, engine_class=_ForgetfulDigests),
                      checks=[check_a_key_written_is_found_again_after_reopening], root=tmp_path)
    assert not report.passed and list(report.failures) == ["a_key_written_is_found_again_after_reopening"]
    assert "AssertionError" in report.failures["a_key_written_is_found_again_after_reopening"]
