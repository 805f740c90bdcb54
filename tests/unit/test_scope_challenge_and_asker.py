"""Two small guards of the OAuth adapter, on their own: which request bodies the scope challenge
answers 403 (adapters/mcp/http_app.py), and a pending confirmation that only the one asked can
finish (adapters/mcp/confirmation.py)."""

from __future__ import annotations

import json

from adapters.mcp.confirmation import InMemoryConfirmationLedger, PendingConfirmation
from adapters.mcp.http_app import challenged_scope
from adapters.mcp.oauth.caller_binding import policy_input

STEP_UP = {"engram_memory_forget": "engram:forget", "engram_memory_withdraw": "engram:forget"}


def _call(name: str, **extra) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": name, "arguments": {}}, **extra}).encode()


def test_a_call_of_a_stepped_up_tool_is_challenged_with_its_scope() -> None:
    assert challenged_scope(_call("engram_memory_forget"), STEP_UP) == ("engram_memory_forget", "engram:forget")
    batch = b"[" + _call("engram_memory_search") + b"," + _call("engram_memory_withdraw") + b"]"
    assert challenged_scope(batch, STEP_UP) == ("engram_memory_withdraw", "engram:forget")


def test_everything_else_passes_to_the_transport() -> None:
    assert challenged_scope(_call("engram_memory_search"), STEP_UP) is None
    # A tool name in the arguments (say, a record's text) is not a call of that tool.
    quoted = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "engram_memory_capture", "arguments": {"text": "engram_memory_forget"}}}).encode()
    assert challenged_scope(quoted, STEP_UP) is None
    listing = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                          "params": {"note": "tools/call engram_memory_forget"}}).encode()
    assert challenged_scope(listing, STEP_UP) is None
    assert challenged_scope(b"{not json tools/call engram_memory_forget", STEP_UP) is None
    assert challenged_scope(_call("engram_memory_forget"), {}) is None


def test_a_confirmation_is_finished_only_by_the_one_who_was_asked() -> None:
    ledger = InMemoryConfirmationLedger()
    nonce = ledger.open(PendingConfirmation(tool="engram_memory_forget", operation_digest="sha256:x",
                                            scope_principal=("acme", "w", "user:alice"), expires_at_ms=10_000,
                                            asker='["mcp-client","https://idp","alice"]'))
    assert ledger.consume(nonce, now_ms=1, asker='["mcp-client","https://idp","bob"]') is None
    assert ledger.consume(nonce, now_ms=1, asker="") is None
    taken = ledger.consume(nonce, now_ms=1, asker='["mcp-client","https://idp","alice"]')
    assert taken is not None and taken.operation_digest == "sha256:x"
    assert ledger.consume(nonce, now_ms=1, asker='["mcp-client","https://idp","alice"]') is None  # single use


def test_the_policy_sees_identifiers_not_nested_or_oversized_claims() -> None:
    from mcp.server.auth.provider import AccessToken

    token = AccessToken(token="t", client_id="vscode", scopes=["engram:read", "engram:read"], subject="ada",
                        resource="https://m/mcp", expires_at=1,
                        claims={"iss": "https://idp", "sub": "ada", "groups": ["eng", "ops"], "tenant": "acme",
                                "address": {"street": "x"}, "blob": "x" * 5000, "nested": [["a"]], "n": 3})
    facts = policy_input(token, now_ms=5)
    assert facts == {"issuer": "https://idp", "subject": "ada", "client_id": "vscode", "scopes": ["engram:read"],
                     "audience": "https://m/mcp", "now_ms": 5,
                     "claims": {"iss": "https://idp", "sub": "ada", "groups": ["eng", "ops"], "tenant": "acme",
                                "n": 3}}


def test_issuer_metadata_is_looked_for_where_providers_publish_it() -> None:
    from adapters.mcp.oauth.fetch import metadata_urls

    assert metadata_urls("https://sso.example.com/realms/acme") == [
        "https://sso.example.com/.well-known/oauth-authorization-server/realms/acme",   # RFC 8414
        "https://sso.example.com/realms/acme/.well-known/openid-configuration",        # Keycloak, OIDC
        "https://sso.example.com/realms/acme/.well-known/oauth-authorization-server",  # Okta custom AS
    ]
    assert metadata_urls("https://idp.example.com") == [
        "https://idp.example.com/.well-known/oauth-authorization-server",
        "https://idp.example.com/.well-known/openid-configuration",
    ]
