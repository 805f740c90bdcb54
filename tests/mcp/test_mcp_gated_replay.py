"""A retried withdraw or forget answers its stored outcome without asking anyone again (issue 26.8;
SPEC §7), through the real adapter (in process, as `engram mcp` builds it) with the SDK's own
client in both protocol versions.

The bug: forget with key K, approved, tombstoned. The same call again (same key and arguments, as
the contract tells an agent to do after MUTATION_OUTCOME_UNKNOWN) asked the human again; a
decline then answered gate_failed "nothing was changed" although the record was forgotten.
"""

from __future__ import annotations

import mcp_types as types
import pytest

from tests.support.mcp_helpers import (
    PURPOSE,
    adapter_client,
    approve,
    binding_for,
    capture_args,
    error_code,
    token,
    unique,
    value_of,
    write_config,
)

pytestmark = pytest.mark.anyio

MODES = ["auto", "legacy"]  # auto negotiates 2026-07-28; legacy is 2025-11-25


@pytest.fixture(scope="module")
def acme(core, tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("replay") / "acme.toml", address=core.address,
                        signing_key=core.host_key_path, binding=binding_for("acme"))


class Asked:
    """An elicitation callback that declines and counts the times the human was asked."""

    def __init__(self) -> None:
        self.times = 0

    async def __call__(self, context, params) -> types.ElicitResult:
        self.times += 1
        return types.ElicitResult(action="decline")


async def _capture(client, text: str) -> str:
    return value_of(await client.call_tool("engram_memory_capture", capture_args(unique("cap"), text)))["candidate_id"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_retried_forget_answers_its_stored_outcome_without_asking_again(acme, mode):
    word = token("pangolin")
    forget = {"record_id": "", "idempotency_key": unique("fgt"), "reason_ref": "reason:obsolete"}
    async with adapter_client(acme, mode=mode, elicitation=approve) as client:
        cid = await _capture(client, f"The {word} decision we will forget")
        admitted = value_of(await client.call_tool("engram_memory_request_admission",
                                                   {"candidate_id": cid, "idempotency_key": unique("adm")}))
        forget["record_id"] = admitted["outcome"]["record_id"]
        first = value_of(await client.call_tool("engram_memory_forget", forget))
        assert first["replayed"] is False and first["receipt"]["to_state"] == "tombstoned"
    asked = Asked()
    async with adapter_client(acme, mode=mode, elicitation=asked) as client:  # this human would decline
        again = await client.call_tool("engram_memory_forget", forget)
        value = value_of(again)
        assert asked.times == 0
        assert value["replayed"] is True
        assert value["receipt"] == first["receipt"]
        assert value["coverage_receipt_digest"] == first["coverage_receipt_digest"]
        # Still forgotten; a forget with another key is a new operation and does ask (then refuses).
        assert error_code(await client.call_tool("engram_memory_get", {"record_id": forget["record_id"],
                                                                       "purpose_ref": PURPOSE})) == "NOT_FOUND"
        other = {**forget, "idempotency_key": unique("fgt")}
        assert error_code(await client.call_tool("engram_memory_forget", other)) == "ALREADY_TERMINAL"
        assert asked.times == 0  # nothing to ask about: the record is already tombstoned


@pytest.mark.parametrize("mode", MODES)
async def test_a_retried_withdraw_answers_its_stored_outcome_without_asking_again(acme, mode):
    withdraw = {"candidate_id": "", "idempotency_key": unique("wd"), "reason_ref": "reason:draft"}
    async with adapter_client(acme, mode=mode, elicitation=approve) as client:
        withdraw["candidate_id"] = await _capture(client, f"A draft {token('okapi')} to withdraw")
        first = value_of(await client.call_tool("engram_memory_withdraw", withdraw))
        assert first["replayed"] is False and first["receipt"]["to_state"] == "withdrawn"
    asked = Asked()
    async with adapter_client(acme, mode=mode, elicitation=asked) as client:
        value = value_of(await client.call_tool("engram_memory_withdraw", withdraw))
        assert asked.times == 0 and value["replayed"] is True and value["receipt"] == first["receipt"]
        # Other arguments under the same key: not a replay, and refused as a conflict (nobody asked).
        conflict = {**withdraw, "reason_ref": "reason:other"}
        assert error_code(await client.call_tool("engram_memory_withdraw", conflict)) == "DIGEST_CONFLICT"
        assert asked.times == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_new_forget_still_needs_the_human(acme, mode):
    asked = Asked()
    async with adapter_client(acme, mode=mode, elicitation=asked) as client:
        cid = await _capture(client, f"The {token('quoll')} decision that stays")
        admitted = value_of(await client.call_tool("engram_memory_request_admission",
                                                   {"candidate_id": cid, "idempotency_key": unique("adm")}))
        rid = admitted["outcome"]["record_id"]
        forget = {"record_id": rid, "idempotency_key": unique("fgt"), "reason_ref": "reason:obsolete"}
        assert error_code(await client.call_tool("engram_memory_forget", forget)) == "gate_failed"
        assert asked.times == 1
        got = value_of(await client.call_tool("engram_memory_get", {"record_id": rid, "purpose_ref": PURPOSE}))
        assert got["record"]["record_id"] == rid
