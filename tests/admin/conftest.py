"""Fixtures for the maintenance API tests (helpers live in admin_support.py): every core on both
engine legs (``stores``, tests/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.clock import FixedClock
from tests.support.admin_support import Env, start_env
from tests.support.core_engines import EngineStores


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(time.time_ns() // 1_000_000)


@pytest.fixture
def env(tmp_path: Path, clock: FixedClock, stores: EngineStores) -> Iterator[Env]:
    e = start_env(stores, tmp_path / "core", clock)
    try:
        yield e
    finally:
        e.stop()
