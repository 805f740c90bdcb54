"""Fixtures for search tests: real gRPC servers over a real store on each engine leg (a DuckDB
file, a PostgreSQL database: ``stores``/``module_stores``, tests/conftest.py) and the bundled
Rego policies; one with the semantic channel (the local ONNX model) and one without."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.app.composition import RunningCore
from engram_core.clock import FixedClock
from engram_core.embedding.onnx_minilm import try_load_local_embedder
from tests.support.core_engines import EngineStores
from tests.support.search_support import Client, activate


@pytest.fixture(scope="session")
def semantic_installed() -> bool:
    return try_load_local_embedder() is not None


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, semantic_installed: bool,
         module_stores: EngineStores) -> Iterator[RunningCore]:
    # tools/setup installs the semantic extra: its absence is a broken set-up, not a reason to skip
    assert semantic_installed, "the 'semantic' extra is missing: run tools/setup"
    running = module_stores.start_core(tmp_path_factory.mktemp("search"), semantic=True)
    activate(running)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def lexical_core(tmp_path_factory: pytest.TempPathFactory, module_stores: EngineStores) -> Iterator[RunningCore]:
    running = module_stores.start_core(tmp_path_factory.mktemp("lexical"), semantic=False)
    activate(running)
    yield running
    running.stop()


@pytest.fixture
def ana(core: RunningCore) -> Client:
    return Client(core)


class TestClock(FixedClock):
    """A settable clock starting at the real time (host contexts are signed with it too)."""

    __test__ = False


def _clocked(data_dir: Path, stores: EngineStores, *, semantic: bool) -> Iterator[tuple[RunningCore, TestClock]]:
    import time

    clock = TestClock(time.time_ns() // 1_000_000)
    running = stores.start_core(data_dir, clock=clock, semantic=semantic)
    activate(running, clock=clock)
    yield running, clock
    running.stop()


@pytest.fixture
def clocked(tmp_path: Path, stores: EngineStores) -> Iterator[tuple[RunningCore, TestClock]]:
    """A fresh core on a settable clock, the lexical channel alone."""
    yield from _clocked(tmp_path / "data", stores, semantic=False)


@pytest.fixture
def semantic_clocked(tmp_path: Path, stores: EngineStores, semantic_installed: bool) -> Iterator[tuple[RunningCore, TestClock]]:
    """As ``clocked``, with the semantic channel (the local ONNX model)."""
    assert semantic_installed, "the 'semantic' extra is missing: run tools/setup"
    yield from _clocked(tmp_path / "data", stores, semantic=True)
