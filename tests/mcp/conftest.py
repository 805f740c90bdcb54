"""Fixtures for the MCP adapter tests: one real core per module, the real adapter, the SDK's
own client.

Nothing of ours is mocked: the core is `engram_core.app.composition.start_core` (on each
engine: tests/conftest.py); the adapter is built as `engram mcp` builds it and served in the
test process over the SDK's memory streams (``mcp_helpers.adapter_client``), or, where the
process itself is tested (stdio, HTTP, start-up, stderr, exit codes), the installed console
script as a subprocess; scopes are activated through AdminService exactly as
`engram admin activate` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import WORKSPACE, Core, activate


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, module_stores: EngineStores) -> Iterator[Core]:
    running = module_stores.start_core(tmp_path_factory.mktemp("core-data"))
    try:
        found = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(found, "acme", WORKSPACE)
        activate(found, "globex", WORKSPACE)
        yield found
    finally:
        running.stop()
