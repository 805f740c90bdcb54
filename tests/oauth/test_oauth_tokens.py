"""Which access tokens the adapter accepts (issue 29), against the real provider's keys.

The refused tokens are made with the provider's own signing key (the test made it) from the
claims a genuine token carries, changing one thing each: another audience, expired, another key
under the provider's key id, an unknown key id, ``alg: none``, HMAC keyed with the public key,
another issuer, no expiry, a logout token's type. The control, the same claims unchanged, is
accepted, so each refusal is for the one thing changed. Scopes, expiry with refresh, opaque
tokens and callers no rule binds run the real flow.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import httpx2
import jwt
import pytest
from mcp.shared.exceptions import MCPError

from engram_core.contract.schemas import TOOL_NAMES
from tests.support.idp_support import (
    PUBLIC_CLIENT,
    SCOPES,
    SHORT_LIVED_CLIENT,
    Person,
    new_key,
    oauth_client,
)
from tests.support.mcp_helpers import PURPOSE, approve, capture_args, error_code, token, unique, value_of

pytestmark = pytest.mark.anyio
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}


def _post(url: str, access_token: str | None, body: dict[str, Any] = INITIALIZE) -> httpx2.Response:
    headers = dict(ACCEPT)
    if access_token is not None:
        headers["Authorization"] = f"Bearer {access_token}"
    return httpx2.post(url, json=body, headers=headers, timeout=30)


def _claims(world: Any, **changed: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {"iss": world.idp.issuer, "sub": "alice", "aud": world.jwt.url, "iat": now, "exp": now + 300,
              "jti": uuid.uuid4().hex, "scope": SCOPES, "client_id": PUBLIC_CLIENT, "engram_tenant": "acme"}
    claims.update(changed)
    return {k: v for k, v in claims.items() if v is not None}


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def _forged(world: Any, case: str) -> str:
    key = world.idp.key
    if case == "control":
        return key.sign(_claims(world), headers={"typ": "at+jwt"})
    if case == "other_audience":
        return key.sign(_claims(world, aud="http://127.0.0.1:1/mcp"))
    if case == "expired":
        return key.sign(_claims(world, iat=int(time.time()) - 900, exp=int(time.time()) - 600))
    if case == "other_key_same_kid":
        return new_key(key.kid).sign(_claims(world))
    if case == "unknown_kid":
        return new_key("not-the-providers").sign(_claims(world))
    if case == "alg_none":
        return f"{_b64({'alg': 'none', 'typ': 'at+jwt', 'kid': key.kid})}.{_b64(_claims(world))}."
    if case == "hmac_with_public_key":  # RFC 8725 §2.1: the public JWK used as an HMAC secret
        public = json.dumps({k: v for k, v in key.private_jwk().items() if k != "d"}).encode()
        header = {"alg": "HS256", "kid": key.kid}
        signing_input = f"{_b64(header)}.{_b64(_claims(world))}".encode()
        import hashlib
        import hmac

        signature = base64.urlsafe_b64encode(hmac.new(public, signing_input, hashlib.sha256).digest())
        return signing_input.decode() + "." + signature.rstrip(b"=").decode()
    if case == "other_issuer":
        return key.sign(_claims(world, iss="http://127.0.0.1:1"))
    if case == "no_expiry":
        return key.sign(_claims(world, exp=None))
    if case == "logout_token_type":
        return key.sign(_claims(world), headers={"typ": "logout+jwt"})
    raise AssertionError(case)


def test_a_token_with_the_providers_claims_and_key_is_accepted(world) -> None:
    assert _post(world.jwt.url, _forged(world, "control")).status_code == 200


@pytest.mark.parametrize("case", ["other_audience", "expired", "other_key_same_kid", "unknown_kid", "alg_none",
                                  "hmac_with_public_key", "other_issuer", "no_expiry", "logout_token_type"])
def test_a_token_that_differs_in_one_thing_is_401(world, case) -> None:
    reply = _post(world.jwt.url, _forged(world, case))
    assert reply.status_code == 401, reply.text
    assert 'error="invalid_token"' in reply.headers["www-authenticate"]
    assert "resource_metadata=" in reply.headers["www-authenticate"]


def test_garbage_tokens_are_401(world) -> None:
    for bad in ("x", "a.b.c", "Zm9v." * 3, "x" * 20_000, str(uuid.uuid4())):
        assert _post(world.jwt.url, bad).status_code == 401, bad


async def test_a_token_without_the_forget_scope_gets_403_then_steps_up(world) -> None:
    """Alice consents to read and write, not to forget: she sees four tools; forget is 403
    insufficient_scope naming engram:forget; her client re-authorizes for it (SEP-2350 union)
    and, once she consents, the forget goes through her confirmation."""
    alice = Person("alice", refuse=("engram:forget",))
    client, tokens = oauth_client(world.jwt.url, world.idp, alice, elicitation=approve)
    async with client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert names == [t for t in TOOL_NAMES if t not in ("engram_memory_forget", "engram_memory_withdraw")]
        assert set(tokens.tokens.scope.split()) >= {"engram:read", "engram:write"}
        assert "engram:forget" not in tokens.tokens.scope.split()
        cap = value_of(await client.call_tool("engram_memory_capture", capture_args(unique("c"), f"Note {token('x')}")))
        record_id = value_of(await client.call_tool("engram_memory_request_admission", {
            "candidate_id": cap["candidate_id"], "idempotency_key": unique("a")}))["outcome"]["record_id"]
        forget = {"record_id": record_id, "idempotency_key": unique("f"), "reason_ref": "reason:obsolete"}
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "engram_memory_forget", "arguments": forget}}
        refused = _post(world.jwt.url, tokens.tokens.access_token, call)
        assert refused.status_code == 403
        challenge = refused.headers["www-authenticate"]
        assert 'error="insufficient_scope"' in challenge and "engram:forget" in challenge.split('scope="')[1]
        assert "resource_metadata=" in challenge
        alice.refuse = ()  # asked again, she consents
        done = value_of(await client.call_tool("engram_memory_forget", forget))
        assert done["receipt"]["to_state"] == "tombstoned"
        assert "engram:forget" in tokens.tokens.scope.split() and alice.sign_ins == 2


async def test_an_expired_token_is_refused_at_the_next_call_and_the_client_refreshes(world) -> None:
    alice = Person("alice")
    client, tokens = oauth_client(world.jwt.url, world.idp, alice, mode="legacy", client_id=SHORT_LIVED_CLIENT)
    async with client:
        await client.list_tools()
        first = tokens.tokens
        assert first.refresh_token, "the provider issues a refresh token for offline_access"
        expires = jwt.decode(first.access_token, options={"verify_signature": False})["exp"]
        time.sleep(max(0.0, expires - time.time()) + 1.5)
        stale = _post(world.jwt.url, first.access_token)
        assert stale.status_code == 401 and 'error="invalid_token"' in stale.headers["www-authenticate"]
        # Same MCP session, next call: the client refreshes (no new sign-in) and is served.
        found = value_of(await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE}))
        assert "records" in found
    assert tokens.tokens.access_token != first.access_token and alice.sign_ins == 1


async def test_opaque_tokens_are_checked_by_introspection(world) -> None:
    alice = Person("alice")
    client, tokens = oauth_client(world.opaque.url, world.idp, alice)
    async with client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
        assert value_of(await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE}))
        access = tokens.tokens.access_token
        assert access.count(".") != 2  # the provider issued an opaque token for this resource
        assert _post(world.opaque.url, access).status_code == 200
        revoked = httpx2.post(f"{world.idp.issuer}/token/revocation",
                              data={"token": access, "client_id": PUBLIC_CLIENT, "token_type_hint": "access_token"})
        assert revoked.status_code == 200
        assert _post(world.opaque.url, access).status_code == 401  # inactive at the issuer now
    assert _post(world.opaque.url, "opaque-" + uuid.uuid4().hex).status_code == 401
    # A JWT minted for the JWT resource is not a token for this one.
    assert _post(world.opaque.url, _forged(world, "control")).status_code == 401


async def test_a_caller_no_rule_binds_sees_no_tools(world) -> None:
    """Carol's tenant claim names a tenant the issuer entry does not allow: memory is off for her."""
    client, _ = oauth_client(world.jwt.url, world.idp, Person("carol"))
    async with client:
        assert (await client.list_tools()).tools == []
        with pytest.raises(MCPError) as err:
            await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": PURPOSE})
        assert (err.value.code, err.value.message) == (-32602, "Unknown tool")


async def test_an_unknown_purpose_is_still_the_protocol_refusal(world) -> None:
    client, _ = oauth_client(world.jwt.url, world.idp, Person("bob"))
    async with client:
        with pytest.raises(MCPError) as err:
            await client.call_tool("engram_memory_search", {"query": "x", "purpose_ref": "purpose:other"})
        assert err.value.code == -32603
        assert error_code(await client.call_tool("engram_memory_get", {
            "record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE})) == "NOT_FOUND"
