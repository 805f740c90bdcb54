"""The MCP authorization flow end to end, with a real OpenID provider and the SDK's own client
(issue 29): discovery from the 401, authorization code with PKCE (the person signs in and consents
over HTTP), token, tool calls; two users bound by the binding policy to their own scopes; sessions
and confirmations that belong to the person who authenticated."""

from __future__ import annotations

from typing import Any

import httpx2
import mcp_types as types
import pytest

from adapters.mcp.confirmation import CONFIRM_KEY
from engram_core.contract.schemas import TOOL_NAMES
from tests.support.idp_support import Person, oauth_client
from tests.support.mcp_helpers import (
    PURPOSE,
    approve,
    audit_rows,
    capture_args,
    error_code,
    token,
    unique,
    value_of,
)

pytestmark = pytest.mark.anyio
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _remembered(client: Any, word: str) -> str:
    cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("cap"), f"Note {word}")))
    adm = value_of(await client.call_tool("engram_memory_request_admission",
                                          {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
    return adm["outcome"]["record_id"]


def _forget(record_id: str) -> dict[str, str]:
    return {"record_id": record_id, "idempotency_key": unique("fgt"), "reason_ref": "reason:obsolete"}


async def test_unauthenticated_request_names_the_metadata_which_names_the_provider(world) -> None:
    reply = httpx2.post(world.jwt.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=ACCEPT)
    assert reply.status_code == 401
    challenge = reply.headers["www-authenticate"]
    metadata_url = world.jwt.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
    assert challenge.startswith("Bearer ") and f'resource_metadata="{metadata_url}"' in challenge
    for url in (metadata_url, metadata_url.removesuffix("/mcp")):  # RFC 9728 path, and the bare one
        metadata = httpx2.get(url).json()
        assert metadata["resource"] == world.jwt.url
        assert metadata["authorization_servers"] == [world.idp.issuer]
        assert metadata["scopes_supported"] == ["engram:forget", "engram:read", "engram:write"]
    assert "OAuth 2.1 resource" in world.jwt.banner and world.idp.issuer in world.jwt.banner


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_two_users_sign_in_and_land_in_their_own_scopes(world, mode) -> None:
    alice, bob = Person("alice"), Person("bob")
    word = token("heron")
    alice_client, _ = oauth_client(world.jwt.url, world.idp, alice, mode=mode, elicitation=approve)
    bob_client, _ = oauth_client(world.jwt.url, world.idp, bob, mode=mode, elicitation=approve)
    async with alice_client as a, bob_client as b:
        assert [t.name for t in (await a.list_tools()).tools] == list(TOOL_NAMES)
        assert [t.name for t in (await b.list_tools()).tools] == list(TOOL_NAMES)
        record_id = await _remembered(a, word)
        assert [h["record"]["record_id"] for h in value_of(await a.call_tool(
            "engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))["records"]] == [record_id]
        assert value_of(await b.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE}))[
            "records"] == []
        assert error_code(await b.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE})
                          ) == "NOT_FOUND"
        searched = await a.call_tool("engram_memory_search", {"query": word, "purpose_ref": PURPOSE})
    # Each signed in once: the client found the provider from the 401 on its own.
    assert (alice.sign_ins, bob.sign_ins) == (1, 1)
    (row,) = audit_rows(world.core, "acme")[searched.structured_content["auditId"]]
    assert (row["tenant"], row["principal"], row["agent_id"]) == ("acme", "user:alice", "mcp-client")


async def test_a_session_belongs_to_the_subject_and_client_that_opened_it(world) -> None:
    sessions: list[str] = []

    async def remember(response: httpx2.Response) -> None:
        if response.headers.get("mcp-session-id"):
            sessions.append(response.headers["mcp-session-id"])

    alice_client, alice_tokens = oauth_client(world.jwt.url, world.idp, Person("alice"), mode="legacy",
                                              event_hooks={"response": [remember]})
    bob_client, bob_tokens = oauth_client(world.jwt.url, world.idp, Person("bob"), mode="legacy")
    async with alice_client as a, bob_client as b:
        await a.list_tools()
        await b.list_tools()
        ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
        headers = {**ACCEPT, "Mcp-Session-Id": sessions[-1], "Mcp-Protocol-Version": "2025-11-25"}
        own = httpx2.post(world.jwt.url, json=ping, headers={
            **headers, "Authorization": f"Bearer {alice_tokens.tokens.access_token}"})
        other = httpx2.post(world.jwt.url, json=ping, headers={
            **headers, "Authorization": f"Bearer {bob_tokens.tokens.access_token}"})
    assert own.status_code == 200, own.text
    assert other.status_code == 404  # exactly as if the session did not exist


async def test_a_forget_confirmation_cannot_be_answered_from_another_users_session(world) -> None:
    """2025-11-25: the elicitation goes out on the session of the user who called forget. Bob,
    signed in himself, answers it on Alice's session (refused like an unknown session) and on his
    own (it is not his question): Alice's decline stands and her record stays."""
    sessions: dict[str, str] = {}
    attempts: list[int] = []

    def remember(who: str) -> Any:
        async def hook(response: httpx2.Response) -> None:
            if response.headers.get("mcp-session-id"):
                sessions[who] = response.headers["mcp-session-id"]
        return hook

    bob_client, bob_tokens = oauth_client(world.jwt.url, world.idp, Person("bob"), mode="legacy",
                                          event_hooks={"response": [remember("bob")]})

    async def alice_declines(context: Any, params: Any) -> types.ElicitResult:
        answer = {"jsonrpc": "2.0", "id": context.request_id,
                  "result": {"action": "accept", "content": {"approve": True}}}
        async with httpx2.AsyncClient(timeout=30) as http:
            for session in (sessions["alice"], sessions["bob"]):
                reply = await http.post(world.jwt.url, json=answer, headers={
                    **ACCEPT, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-11-25",
                    "Authorization": f"Bearer {bob_tokens.tokens.access_token}"})
                attempts.append(reply.status_code)
        return types.ElicitResult(action="decline")

    alice_client, _ = oauth_client(world.jwt.url, world.idp, Person("alice"), mode="legacy",
                                   elicitation=alice_declines, event_hooks={"response": [remember("alice")]})
    async with alice_client as a, bob_client as b:
        await b.list_tools()
        record_id = await _remembered(a, token("plover"))
        result = await a.call_tool("engram_memory_forget", _forget(record_id))
        assert error_code(result) == "gate_failed"
        assert value_of(await a.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE}))
    assert attempts[0] == 404 and len(attempts) == 2


async def test_a_confirmations_request_state_is_useless_to_another_user(world) -> None:
    """2026-07-28: the confirmation travels as a sealed requestState bound to the one who was
    asked. Bob replays Alice's with an approval: gate_failed, nothing forgotten, and Alice's own
    confirmation still completes."""
    alice_client, _ = oauth_client(world.jwt.url, world.idp, Person("alice"), elicitation=approve)
    bob_client, _ = oauth_client(world.jwt.url, world.idp, Person("bob"), elicitation=approve)
    yes = {CONFIRM_KEY: types.ElicitResult(action="accept", content={"approve": True})}
    async with alice_client as a, bob_client as b:
        record_id = await _remembered(a, token("tern"))
        arguments = _forget(record_id)
        asked = await a.session.call_tool("engram_memory_forget", arguments, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult) and asked.request_state
        await b.list_tools()
        replayed = await b.call_tool("engram_memory_forget", arguments, input_responses=yes,
                                     request_state=asked.request_state)
        assert error_code(replayed) == "gate_failed"
        assert value_of(await a.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE}))
        done = value_of(await a.call_tool("engram_memory_forget", arguments, input_responses=yes,
                                          request_state=asked.request_state))
        assert done["receipt"]["to_state"] == "tombstoned"
