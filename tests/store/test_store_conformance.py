"""The store conformance suite: every guarantee of the storage contract (store_checks.py), on
every engine. An engine is ready when it passes this file unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_checks import CHECKS
from store_targets import DuckDBTarget

ENGINES: dict[str, Callable[[Path], Any]] = {"duckdb": DuckDBTarget}


@pytest.fixture(params=sorted(ENGINES))
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made = ENGINES[request.param](tmp_path)
    yield made
    made.close_all()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_store_contract(target: Any, check: Callable[[Any], None]) -> None:
    check(target)


def test_a_store_refuses_to_open_with_other_key_files(tmp_path: Path) -> None:
    """Every core of a store needs the key files it was written with: one opened with another
    index.key would find nothing, another page.key refuse every cursor, another ring unwrap no
    key. The first open records their fingerprints; a later open with a different one refuses,
    naming the file, and with the right ones opens again."""
    import secrets

    from engram_core.errors import Code, EngramError
    from engram_core.rpc.server import open_core

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
