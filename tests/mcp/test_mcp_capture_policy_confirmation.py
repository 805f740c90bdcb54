"""When only the capture policy asks for a confirmation (SPEC §8; issue 13 finding 10),
the adapter asks the human by elicitation, as for forget, instead of answering the agent
-32603. The capture policy decides on the capture's own facts, so the tool list cannot
say so beforehand. The SDK's own client, the real adapter in process (as `engram mcp`
builds it), a real core, a bundle whose Rego a policy author edited (no Python change)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mcp_types as types
import pytest

from tests.support.core_engines import EngineStores
from tests.support.mcp_helpers import (
    WORKSPACE,
    Core,
    activate,
    adapter_client,
    binding_for,
    capture_args,
    error_code,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio
MODES = ["auto", "legacy"]

# A policy author's rule: a capture of more than one component needs a human's yes.
_AUTHOR_RULE = """

_confirmation_required if input.components.count > 1
"""


@pytest.fixture(scope="module")
def capture_gated(module_stores: EngineStores, tmp_path_factory) -> Path:
    from engram_core.app.composition import default_policies_dir

    root = tmp_path_factory.mktemp("capture-gated")
    bundle = root / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    rego = bundle / "engram" / "capture" / "capture.rego"
    rego.write_text(rego.read_text() + _AUTHOR_RULE)
    data = json.loads((bundle / "data.json").read_text())
    assert data["engram"]["config"]["tenants"]["*"]["confirmation_required_tools"] == []  # authz asks nothing
    running = module_stores.start_core(root / "data", policies_dir=bundle, semantic=False)
    try:
        core = Core(address=running.address, host_key_path=Path(running.host_key_path))
        activate(core, "acme", WORKSPACE)
        yield write_config(root / "acme.toml", address=core.address, signing_key=core.host_key_path,
                           binding=binding_for("acme"))
    finally:
        running.stop()


def _two_components(text: str) -> dict:
    args = capture_args(unique("cap-key"), text)
    args["payload"]["components"].append(
        {"component_id": "c2", "kind": "context", "text": "Context of " + text, "citation_ids": ["cit1"]})
    return args


class _Human:
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked: list[str] = []

    async def __call__(self, context, params) -> types.ElicitResult:
        self.asked.append(params.message)
        if self.answer == "accept":
            return types.ElicitResult(action="accept", content={"approve": True})
        return types.ElicitResult(action=self.answer)


@pytest.mark.parametrize("mode", MODES)
async def test_capture_policy_confirmation_asks_the_human_and_proceeds(capture_gated, mode):
    human = _Human("accept")
    async with adapter_client(capture_gated, mode=mode, elicitation=human) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert "engram_memory_capture" in tools
        single = value_of(await client.call_tool("engram_memory_capture",
                                                 capture_args(unique("cap-key"), f"One part okapi {mode}")))
        assert single["status"] == "committed_pending" and human.asked == []  # the policy asked nothing
        cap = value_of(await client.call_tool("engram_memory_capture", _two_components(f"Two part okapi {mode}")))
        assert cap["status"] == "committed_pending"
        assert len(human.asked) == 1 and "CAPTURE" in human.asked[0]


@pytest.mark.parametrize("mode", MODES)
async def test_capture_policy_confirmation_declined_or_impossible_is_gate_failed(capture_gated, mode):
    human = _Human("decline")
    async with adapter_client(capture_gated, mode=mode, elicitation=human) as client:
        result = await client.call_tool("engram_memory_capture", _two_components("Declined two part okapi"))
        assert error_code(result) == "gate_failed" and len(human.asked) == 1
    async with adapter_client(capture_gated, mode=mode) as client:  # a client that cannot elicit
        result = await client.call_tool("engram_memory_capture", _two_components("Silent two part okapi"))
        assert error_code(result) == "gate_failed"
