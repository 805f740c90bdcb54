"""The one mapping from Engram outcomes to MCP results and errors (SPEC §3).

Tool outcomes are envelopes in ``structuredContent`` with an identical JSON
copy as the only text item and ``isError = not ok``. The two protocol refusals
are JSON-RPC errors with fixed messages. The one other JSON-RPC error is the
transient failure of a request that has no envelope to carry it (``tools/list``
while the core is not answering): its own code, so it never reads as a refusal.
"""

from __future__ import annotations

import secrets
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic_core import to_json

from engram_core.contract.errors import Code, EngramError, error_body

REDACTION_CLASS = "high"
OUTPUT_SCHEMA_VERSION = 1

TRUSTED_CONTEXT_UNAVAILABLE = "Trusted invocation context unavailable"
UNKNOWN_TOOL = "Unknown tool"
# In the band MCP leaves to implementations (-32000..-32019; the SDK uses -32000 and -32001
# for its own client-side errors), so no client confuses it with -32603, which means "stop".
TEMPORARILY_UNAVAILABLE_CODE = -32010
TEMPORARILY_UNAVAILABLE = "Memory service temporarily unavailable"


def new_audit_id() -> str:
    """A fresh audit id for one call; it is signed into that call's host context."""
    return "aud_" + secrets.token_hex(12)


def _result(envelope: dict[str, Any]) -> types.CallToolResult:
    # The serializer the SDK writes structuredContent with (pydantic-core), so the text is the
    # wire's own spelling of the same JSON (compact, UTF-8 unescaped); ~7x faster than
    # json.dumps on a search page, which made it the adapter's largest serialization cost.
    text = to_json(envelope).decode("utf-8")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=envelope,
        is_error=not envelope["ok"],
    )


def success(value: dict[str, Any], *, audit_id: str) -> types.CallToolResult:
    return _result(
        {
            "ok": True,
            "output": {"schema_version": OUTPUT_SCHEMA_VERSION, "value": value},
            "auditId": audit_id,
            "redactionClass": REDACTION_CLASS,
        }
    )


def failure(code: Code, *, audit_id: str, reason_class: str | None = None) -> types.CallToolResult:
    """The failure envelope: the code's constant message, or the catalogue's message for the
    reason class (``engram_core.contract.errors.REFUSALS``); never anything taken from input."""
    if code is Code.TRUSTED_CONTEXT_UNAVAILABLE:
        # SPEC §2: a protocol refusal, never an envelope.
        raise trusted_context_unavailable()
    return _result(
        {"ok": False, "auditId": audit_id, "redactionClass": REDACTION_CLASS,
         "error": error_body(code, reason_class)}
    )


def refusal(error: EngramError, *, audit_id: str) -> types.CallToolResult:
    return failure(error.code, audit_id=audit_id, reason_class=error.reason_class)


def trusted_context_unavailable(mismatched: str | None = None) -> MCPError:
    """-32603 with the contract's constant message. ``mismatched``: the host-bound field the
    call's argument did not match (``purpose_ref``), said in ``data`` (JSON-RPC allows it) so an
    agent knows what to check; never the bound value, which only the host may tell."""
    data = {"mismatched": mismatched} if mismatched else None
    return MCPError(code=types.INTERNAL_ERROR, message=TRUSTED_CONTEXT_UNAVAILABLE, data=data)


def temporarily_unavailable(error: EngramError) -> MCPError:
    """A retriable failure where no envelope can carry it (``tools/list``): JSON-RPC error
    -32010 with a constant message, and in ``data`` the error object an envelope would hold
    (``{code, message, retriable: true}``), so an agent retries exactly as the envelope says."""
    return MCPError(code=TEMPORARILY_UNAVAILABLE_CODE, message=TEMPORARILY_UNAVAILABLE,
                    data=error_body(error.code, error.reason_class))


def unknown_tool() -> MCPError:
    # Identical for a tool that does not exist and one that is not granted (SPEC §2).
    return MCPError(code=types.INVALID_PARAMS, message=UNKNOWN_TOOL)
