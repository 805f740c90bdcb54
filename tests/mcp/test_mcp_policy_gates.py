"""Capture and admission ask the human when the policy says so for the tenant (SPEC §8),
through the same elicitation flow as withdraw and forget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    WORKSPACE,
    Core,
    activate,
    adapter_client,
    approve,
    binding_for,
    capture_args,
    decline,
    error_code,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]


@pytest.fixture(scope="module")
def gated(module_stores: EngineStores, tmp_path_factory) -> Path:
    """A core whose bundle (data only, no Python change) requires confirmation for capture and admission."""
    from engram_core.app.composition import default_policies_dir

    root = tmp_path_factory.mktemp("gated")
    bundle = root / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["tenants"]["*"]["confirmation_required_tools"] = [
        "engram_memory_capture", "engram_memory_request_admission"]
    (bundle / "data.json").write_text(json.dumps(data))
    running = module_stores.start_core(root / "data", policies_dir=bundle, semantic=False)
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        yield write_config(root / "acme.toml", address=core.address, signing_key=core.host_key_path,
                           binding=binding_for("acme"))
    finally:
        running.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_policy_gated_capture_and_admission_ask_and_proceed_on_approval(gated, mode):
    async with adapter_client(gated, mode=mode, elicitation=approve) as client:
        cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("cap-key"), f"Gated okapi {mode}")))
        assert cap["status"] == "committed_pending"
        adm = value_of(await client.call_tool("engram_memory_request_admission",
                                              {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
        assert adm["outcome"]["status"] == "accepted"


@pytest.mark.parametrize("mode", MODES)
async def test_policy_gated_capture_declined_or_impossible_is_gate_failed(gated, mode):
    async with adapter_client(gated, mode=mode, elicitation=decline) as client:
        assert error_code(await client.call_tool("engram_memory_capture",
                                                 capture_args(unique("cap-key"), "Declined okapi"))) == "gate_failed"
    async with adapter_client(gated, mode=mode) as client:  # no elicitation capability
        assert error_code(await client.call_tool("engram_memory_capture",
                                                 capture_args(unique("cap-key"), "Silent okapi"))) == "gate_failed"
