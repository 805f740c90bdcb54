"""The store conformance suite: every guarantee of the storage contract
(``engram_core/store/conformance``), on every engine. An engine is ready when it passes this file
unchanged.

PostgreSQL runs on the session's own test cluster (tests/support/pg_cluster.py), a fresh database per
check; a missing PostgreSQL fails the run (tools/setup installs it), it never skips."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_core.store.conformance import CHECKS, check_name, validate
from tests.support.store_targets import DuckDBTarget, MemoryTarget, PostgresTarget

# name -> (the test's request, a directory of its own) -> target
ENGINES: dict[str, Callable[[pytest.FixtureRequest, Path], Any]] = {
    "duckdb": lambda request, root: DuckDBTarget(root),
    "memory": lambda request, root: MemoryTarget(root),
    "postgresql": lambda request, root: PostgresTarget(root, request.getfixturevalue("pg_database")),
}


@pytest.fixture(params=sorted(ENGINES))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made = ENGINES[request.param](request, tmp_path)
    yield made
    made.close_all()


@pytest.mark.parametrize("check", CHECKS, ids=check_name)
def test_store_contract(target: Any, check: Callable[[Any], None]) -> None:
    check(target)


def test_an_engine_runs_the_whole_suite_through_its_entry_point(tmp_path: Path) -> None:
    """What an engine written elsewhere calls (``validate`` with a target factory): every check
    runs, and a report says which passed (here the in-memory engine's target, all of them)."""
    report = validate(MemoryTarget, root=tmp_path)
    assert report.passed, report.describe()
    assert report.passed_checks == [check_name(c) for c in CHECKS] and report.target == "memory"


def test_a_store_refuses_to_open_with_other_key_files(tmp_path: Path) -> None:
    """Every core of a store needs the key files it was written with: one opened with another
    index.key would find nothing, another page.key refuse every cursor, another ring unwrap no
    key. The first open records their fingerprints; a later open with a different one refuses,
    naming the file, and with the right ones opens again."""
    import secrets

    from engram_core.app.composition import open_core
    from engram_core.contract.errors import Code, EngramError

    data = tmp_path / "data"
    core, _, _ = open_core(data, semantic=False)
    core.close()
    for name in ("index.key", "page.key"):
        original = (data / name).read_bytes()
        (data / name).write_bytes(secrets.token_bytes(32))
        with pytest.raises(EngramError) as err:
            open_core(data, semantic=False)
        assert err.value.code is Code.STORE_UNAVAILABLE and name in err.value.detail
        (data / name).write_bytes(original)
    kek = (data / "store.kek").read_bytes()
    (data / "store.kek").unlink()  # a ring made afresh: another identity
    with pytest.raises(EngramError) as err:
        open_core(data, semantic=False)
    assert "store.kek" in err.value.detail
    (data / "store.kek").write_bytes(kek)
    core, _, _ = open_core(data, semantic=False)
    core.close()


def test_a_postgresql_core_with_other_key_files_refuses_to_start(pg_database: Any, tmp_path: Path) -> None:
    """Where several cores share one store, each mounts a key directory: one whose files differ
    from those the store was written with refuses to start, naming the file (an operator copied
    the wrong directory), and one with the same files starts beside the first."""
    import secrets
    import shutil

    from engram_core.app.composition import open_core
    from engram_core.contract.errors import Code, EngramError

    first_dir, second_dir = tmp_path / "keys-a", tmp_path / "keys-b"
    first, _, _ = open_core(first_dir, semantic=False, store_url=pg_database.conninfo)
    try:
        shutil.copytree(first_dir, second_dir)
        for name in ("index.key", "page.key", "confirmation.key"):
            original = (second_dir / name).read_bytes()
            if name.endswith(".key") and original.startswith(b"-----"):
                (second_dir / name).unlink()  # a signing key (PEM): a fresh one is made at open
            else:
                (second_dir / name).write_bytes(secrets.token_bytes(32))
            with pytest.raises(EngramError) as err:
                open_core(second_dir, semantic=False, store_url=pg_database.conninfo)
            assert err.value.code is Code.STORE_UNAVAILABLE and name in err.value.detail, err.value.detail
            (second_dir / name).write_bytes(original)
        (second_dir / "store.kek").unlink()  # a ring made afresh: another identity
        with pytest.raises(EngramError) as err:
            open_core(second_dir, semantic=False, store_url=pg_database.conninfo)
        assert "store.kek" in err.value.detail or "ring" in err.value.detail, err.value.detail
        shutil.copy2(first_dir / "store.kek", second_dir / "store.kek")
        second, _, _ = open_core(second_dir, semantic=False, store_url=pg_database.conninfo)
        second.close()
    finally:
        first.close()
