"""The confirmation gate on the MCP side (SPEC §8).

The adapter asks the human through MCP elicitation and, on acceptance, signs a
single-use grant bound to tool, target and operation digest. Nothing a model
writes in arguments reaches this module: the closed input schema rejects it
first, and the approval only ever comes from an elicitation response.

Two protocol versions, two carriers (see MCP_NOTES.md):

* 2026-07-28: the tool call returns ``InputRequiredResult``; the client
  re-sends the call with ``input_responses`` and ``request_state``. The SDK's
  ``RequestStateBoundary`` seals the state and expires it; single use and the
  binding to this exact operation come from :class:`PendingConfirmations`.
* 2025-11-25: ``ctx.session.elicit_form`` inside the call.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from adapters.mcp.config import AgentBinding
from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, FORGET_TOOL, WITHDRAW_TOOL

CONFIRM_KEY = "engram_confirmation"  # the key of our input request in InputRequiredResult

REQUESTED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {
            "type": "boolean",
            "title": "Approve",
            "description": "Approve this memory operation. It is recorded and cannot be undone.",
        }
    },
    "required": ["approve"],
}

_ACTION_TEXT = {
    FORGET_TOOL: "FORGET memory record {target}. Its content will be destroyed and it will "
    "disappear from search and get for good.",
    WITHDRAW_TOOL: "WITHDRAW pending memory candidate {target}. It will never be admitted.",
    CAPTURE_TOOL: "CAPTURE a new memory candidate (host policy asks for confirmation).",
    ADMISSION_TOOL: "REQUEST ADMISSION of memory candidate {target} "
    "(host policy asks for confirmation).",
}


def confirmation_message(tool: str, target: str, arguments: dict[str, Any], binding: AgentBinding) -> str:
    """What the human is asked: the operation, its target, the reason ref, who asks."""
    lines = [
        "An agent asks to " + _ACTION_TEXT[tool].format(target=target),
        f"Reason: {arguments['reason_ref']}" if "reason_ref" in arguments else "",
        f"Agent: {binding.agent_id or '-'} as {binding.principal} in {binding.tenant}/{binding.workspace}.",
        "Approve only if you, the human, want this to happen.",
    ]
    return "\n".join(line for line in lines if line)


def approved(action: str, content: dict[str, Any] | None) -> bool:
    """Only an explicit accept with approve == true counts; decline/cancel/anything else does not."""
    return action == "accept" and isinstance(content, dict) and content.get("approve") is True


@dataclass(frozen=True)
class PendingConfirmation:
    tool: str
    operation_digest: str
    scope_principal: tuple[str, str, str]
    expires_at_ms: int
    asker: str = ""  # who authenticated the call that asked (binding.asker_of); the answer must match


class ConfirmationLedger(Protocol):
    """Single-use nonces for confirmations in flight (2026-07-28 round trip)."""

    def open(self, pending: PendingConfirmation) -> str:
        """Record a pending confirmation; returns its nonce."""
        ...

    def consume(self, nonce: str, *, now_ms: int, asker: str) -> PendingConfirmation | None:
        """Take a nonce exactly once; None if unknown, used, expired, or opened for another asker
        (then it stays open: someone else's attempt cannot spoil the one who was asked)."""
        ...


class InMemoryConfirmationLedger:
    """Process-local ledger.

    Does not survive a restart and is not shared between adapter processes: a
    confirmation begun on one process and finished on another is simply not
    found, which fails closed as ``gate_failed``.
    """

    _MAX_OPEN = 10_000

    def __init__(self) -> None:
        self._open: dict[str, PendingConfirmation] = {}
        self._lock = threading.Lock()

    def open(self, pending: PendingConfirmation) -> str:
        nonce = secrets.token_urlsafe(24)
        with self._lock:
            if len(self._open) >= self._MAX_OPEN:
                oldest = min(self._open, key=lambda n: self._open[n].expires_at_ms)
                del self._open[oldest]
            self._open[nonce] = pending
        return nonce

    def consume(self, nonce: str, *, now_ms: int, asker: str) -> PendingConfirmation | None:
        with self._lock:
            held = self._open.get(nonce)
            if held is not None and held.asker != asker:
                return None
            pending = self._open.pop(nonce, None)
            for stale in [n for n, p in self._open.items() if p.expires_at_ms <= now_ms]:
                del self._open[stale]
        if pending is None or pending.expires_at_ms <= now_ms:
            return None
        return pending


def consume_matching(ledger: ConfirmationLedger, nonce: str, state_digest: str, *, tool: str, digest: str,
                     binding: AgentBinding, asker: str, now_ms: int) -> bool:
    """Take a 2026-07-28 retry's nonce: True only when it named a live, unused confirmation of this
    exact operation (tool, digest, scope and principal) and its state carries the same digest. Only
    the authenticated caller who was asked can answer (the ledger keeps the nonce for them): another
    token of the same principal, or none, cannot finish it."""
    pending = ledger.consume(nonce, now_ms=now_ms, asker=asker)
    return (pending is not None and pending.tool == tool and pending.operation_digest == digest
            and state_digest == digest
            and pending.scope_principal == (binding.tenant, binding.workspace, binding.principal)
            and pending.asker == asker)


def encode_state(nonce: str, operation_digest: str) -> str:
    """Plaintext request state; the SDK boundary seals it before it leaves."""
    return json.dumps({"v": 1, "nonce": nonce, "op": operation_digest}, separators=(",", ":"))


def decode_state(state: str) -> tuple[str, str] | None:
    try:
        value = json.loads(state)
        if value.get("v") == 1 and isinstance(value["nonce"], str) and isinstance(value["op"], str):
            return value["nonce"], value["op"]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None
