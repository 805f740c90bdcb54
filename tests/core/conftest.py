"""Fixtures for core tests: a real gRPC server on loopback over a real DuckDB
file in a temp dir, evaluated by the real bundled Rego policies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from core_support import Client, activate

from engram_core.app.composition import RunningCore, start_core


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCore]:
    running = start_core(tmp_path_factory.mktemp("core"))
    activate(running)
    activate(running, "acme", "beta")
    activate(running, "globex", "alpha")
    yield running
    running.stop()


@pytest.fixture
def fresh_core(tmp_path: Path) -> Iterator[RunningCore]:
    running = start_core(tmp_path / "data")
    activate(running)
    yield running
    running.stop()


@pytest.fixture
def ana(core: RunningCore) -> Client:
    return Client(core)
