"""Fixtures for core tests: a real gRPC server on loopback over a real store (a DuckDB file in a
temp dir, or a fresh database of the session's PostgreSQL cluster: each test runs on both engines,
tests/conftest.py), evaluated by the real bundled Rego policies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.app.composition import RunningCore
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, module_stores: EngineStores) -> Iterator[RunningCore]:
    running = module_stores.start_core(tmp_path_factory.mktemp("core"))
    activate(running)
    activate(running, "acme", "beta")
    activate(running, "globex", "alpha")
    yield running
    running.stop()


@pytest.fixture
def fresh_core(tmp_path: Path, stores: EngineStores) -> Iterator[RunningCore]:
    running = stores.start_core(tmp_path / "data")
    activate(running)
    yield running
    running.stop()


@pytest.fixture
def ana(core: RunningCore) -> Client:
    return Client(core)
