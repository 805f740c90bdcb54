"""An agent over MCP sees RATE_LIMITED as a retriable envelope when its quota is used up (issue 18)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    PURPOSE,
    WORKSPACE,
    Core,
    activate,
    adapter_client,
    binding_for,
    envelope_of,
    write_config,
)

pytestmark = pytest.mark.anyio


async def test_used_up_search_quota_is_a_retriable_rate_limited_envelope(stores: EngineStores, tmp_path) -> None:
    from engram_core.app.composition import default_policies_dir

    bundle = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["tenants"]["*"]["quotas"] = {"principal": {"minute": {"searches": 2}}}
    (bundle / "data.json").write_text(json.dumps(data))
    running = stores.start_core(tmp_path / "data", policies_dir=bundle, semantic=False)
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        config = write_config(tmp_path / "acme.toml", address=core.address, signing_key=core.host_key_path,
                              binding=binding_for("acme"))
        async with adapter_client(config) as client:
            args = {"query": "anything", "purpose_ref": PURPOSE}
            for _ in range(2):
                assert envelope_of(await client.call_tool("engram_memory_search", args))["ok"] is True
            env = envelope_of(await client.call_tool("engram_memory_search", args))
            assert env["ok"] is False
            assert env["error"] == {"code": "RATE_LIMITED", "message": "Rate limited; retry later.", "retriable": True}
    finally:
        running.stop()
