"""A signed-in person whom the binding policy gives no tools learns why from the text log too
(issue 60 item 14): the adapter logs a refusal at warning with the policy's reason codes, never
"caller bound". Real parts: the bundled binding policy on OPA's engine, the SDK's AccessToken."""

from __future__ import annotations

import logging
import time

import pytest
from mcp.server.auth.provider import AccessToken

from adapters.mcp.oauth.caller_binding import CallerBindings
from engram_core.policy import default_bundle_dir
from engram_core.policy.embedded import EmbeddedPolicyEngine


def _token(issuer: str) -> AccessToken:
    now = int(time.time())
    claims = {"iss": issuer, "sub": "alice", "aud": "https://memory.example.com/mcp", "exp": now + 300,
              "client_id": "mcp-client", "scope": "engram:read"}
    return AccessToken(token="t-" + str(now), client_id="mcp-client", scopes=["engram:read"], expires_at=now + 300,
                       resource="https://memory.example.com/mcp", subject="alice", claims=claims)


def test_a_caller_the_policy_binds_to_nothing_is_logged_as_a_refusal_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    engine = EmbeddedPolicyEngine(default_bundle_dir())
    engine.reload()
    callers = CallerBindings(engine, cache_s=0)
    caplog.set_level(logging.INFO)
    resolved = callers.resolve(_token("https://unknown-issuer.example.com"))  # no binding configured for it
    assert resolved.binding is None and not resolved.tools
    [record] = [r for r in caplog.records if "caller" in r.getMessage()]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert message.startswith("caller refused: the binding policy gave this caller no binding")
    assert "UNKNOWN_ISSUER" in message and "caller bound" not in message
