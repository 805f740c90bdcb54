"""The confirmation gate for clients with URL-mode elicitation only (issue 61; MCP 2025-11-25).

A client that cannot show a form (``elicitation.url`` declared, ``elicitation.form`` not) can still
send its user to a web page. For a withdraw or forget the adapter then:

1. parks the exact operation in the core (``HostService.ParkConfirmation``, under the agent call's
   own binding): tool, target, reason and the operation digest, which the core recomputes; the core
   answers an unguessable single-use id;
2. asks the client, with an ``elicitation/create`` of mode ``url``, to open the console's page for
   that id (``<console_url>/confirmations/<id>``; the URL carries nothing else) under a fresh
   ``elicitationId``: inside the call on 2025-11-25, as the input request of an
   ``InputRequiredResult`` on 2026-07-28 (the client re-sends the call with the answer);
3. waits for the person's decision (``HostService.ClaimConfirmation``, long-polled): only a person
   signed in to the console with a role that may confirm can approve it there, with the form's CSRF
   token; the claim succeeds once, for the same binding and operation, within 30 s of the approval;
4. on approval sends ``notifications/elicitation/complete`` (2025-11-25) and signs the same
   single-use grant a form approval yields (``ToolCallPipeline._invoke``); the core checks it unchanged.

The client's own answer to the URL elicitation only says whether the user agreed to open the page:
"accept" never approves anything by itself. Declined, cancelled, denied, expired, timed out, or an
id the core does not know (a restarted core, another core): ``gate_failed``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from adapters.mcp.confirmation import (
    CONFIRM_KEY,
    ConfirmationLedger,
    PendingConfirmation,
    confirmation_message,
    consume_matching,
)
from adapters.mcp.core_client import CoreClient
from adapters.mcp.host_context import CallContext, now_ms
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.tools import GATED_TOOLS

_T = TypeVar("_T")
# Runs one gRPC call under a freshly signed host-call context of the MCP call's binding (following a
# new authorization epoch once, as every adapter call does).
HostCall = Callable[[Callable[[bytes], Awaitable[_T]]], Awaitable[_T]]
Refusal = tuple[str, str]  # (reason class, reason code) of a gate_failed

_DECLINED: Refusal = ("declined", "CONFIRMATION_DECLINED")
_TIMED_OUT: Refusal = ("timed_out", "CONFIRMATION_TIMED_OUT")
_INVALID: Refusal = ("confirmation_invalid", "CONFIRMATION_STATE_INVALID")
_FAILED: Refusal = ("cannot_elicit", "ELICITATION_FAILED")
_POLL_MS = 4_000  # one claim waits this long at most for the decision (the core caps it at 5 s)


def can_elicit_url(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    elicitation = caps.elicitation if caps is not None else None
    return elicitation is not None and elicitation.url is not None


def is_url_state(state: str | None) -> bool:
    """Whether a 2026-07-28 retry's request state is one this module issued."""
    return _decode(state or "") is not None


def _encode(nonce: str, digest: str, confirmation_id: str, expires_at_ms: int) -> str:
    """Plaintext request state; the SDK boundary seals it before it leaves."""
    return json.dumps({"v": 1, "mode": "url", "nonce": nonce, "op": digest, "cid": confirmation_id,
                       "exp": expires_at_ms}, separators=(",", ":"))


def _decode(state: str) -> tuple[str, str, str, int] | None:
    try:
        value = json.loads(state)
        if value.get("v") == 1 and value.get("mode") == "url" and all(
                isinstance(value[k], str) for k in ("nonce", "op", "cid")) and isinstance(value["exp"], int):
            return value["nonce"], value["op"], value["cid"], value["exp"]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


class UrlConfirmations:
    """The URL-mode confirmation flow of one adapter process (see the module doc)."""

    def __init__(self, core: CoreClient, console_url: str, ledger: ConfirmationLedger, timeout_ms: int) -> None:
        self._core = core
        self._console_url = console_url.rstrip("/")
        self._ledger = ledger
        self._timeout_ms = timeout_ms

    def applies(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, name: str,
                can_elicit_form: bool) -> bool:
        """This flow answers the call: a first leg from a client that can open a URL and cannot show
        a form, for a withdraw or forget; or the retry of one this flow began."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and params.request_state is not None:
            return is_url_state(params.request_state)
        return name in GATED_TOOLS and not can_elicit_form and can_elicit_url(ctx)

    async def confirm(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, name: str,
                      arguments: dict[str, Any], call: CallContext, digest: str, target: str,
                      host_call: HostCall[Any]) -> Refusal | types.InputRequiredResult | None:
        """None when a person approved this exact operation (the caller signs the grant and calls);
        a refusal for gate_failed; or, on a 2026-07-28 first leg, the input request to return.
        Raises EngramError for a failure of the core itself."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern and params.request_state is not None:
            return await self._retry(params, name, digest, target, call, host_call)
        confirmation_id, expires_at = await host_call(lambda c: self._core.park_confirmation(
            context=c, tool=name, target=target, reason_ref=str(arguments.get("reason_ref", "")),
            operation_digest=digest, ttl_ms=self._timeout_ms))
        elicitation_id = "engram-" + secrets.token_urlsafe(16)
        url = f"{self._console_url}/confirmations/{confirmation_id}"
        message = (confirmation_message(name, target, arguments, call.binding)
                   + "\nOpen the link to review it in the Engram console: a person who may confirm approves or "
                     "denies it there after signing in.")
        b = call.binding
        if modern:
            nonce = self._ledger.open(PendingConfirmation(
                tool=name, operation_digest=digest, scope_principal=(b.tenant, b.workspace, b.principal),
                expires_at_ms=expires_at, asker=call.asker))
            # No elicitationId at 2026-07-28 (the protocol removed it with the completion notification).
            request = types.ElicitRequest(params=types.ElicitRequestURLParams(message=message, url=url))
            return types.InputRequiredResult(input_requests={CONFIRM_KEY: request},
                                             request_state=_encode(nonce, digest, confirmation_id, expires_at))
        deadline = min(expires_at, now_ms() + self._timeout_ms)
        try:
            with anyio.fail_after(max(0.0, (deadline - now_ms()) / 1000)):
                answer = await ctx.session.elicit_url(message, url, elicitation_id,
                                                      related_request_id=ctx.request_id)
        except TimeoutError:
            return _TIMED_OUT
        except MCPError:
            return _FAILED
        if answer.action != "accept":
            return _DECLINED  # the user would not open the page: nobody will approve it
        outcome = await self._decision(confirmation_id, name, digest, target, deadline, host_call)
        if outcome is None:
            try:  # tell the client the out-of-band step is done (delivery is not guaranteed)
                await ctx.session.send_elicit_complete(elicitation_id, related_request_id=ctx.request_id)
            except Exception:  # noqa: BLE001 - a notification the client cannot take changes nothing
                pass
        return outcome

    async def _retry(self, params: types.CallToolRequestParams, name: str, digest: str, target: str,
                     call: CallContext, host_call: HostCall[Any]) -> Refusal | None:
        """2026-07-28: the re-sent call. Its state must name a live, unused nonce for this exact
        operation and asker; the client's answer must be "accept" (the user opened the page); then
        the person's decision, as in the 2025-11-25 flow."""
        decoded = _decode(params.request_state or "")
        if decoded is None:
            return _INVALID
        nonce, state_digest, confirmation_id, expires_at = decoded
        if not consume_matching(self._ledger, nonce, state_digest, tool=name, digest=digest, binding=call.binding,
                                asker=call.asker, now_ms=now_ms()):
            return _INVALID
        response = (params.input_responses or {}).get(CONFIRM_KEY)
        if getattr(response, "action", None) != "accept":
            return _DECLINED
        return await self._decision(confirmation_id, name, digest, target, expires_at, host_call)

    async def _decision(self, confirmation_id: str, name: str, digest: str, target: str, deadline_ms: int,
                        host_call: HostCall[Any]) -> Refusal | None:
        while True:
            left = deadline_ms - now_ms()
            if left <= 0:
                return _TIMED_OUT
            wait = min(left, _POLL_MS)
            try:
                status = await host_call(lambda c, wait=wait: self._core.claim_confirmation(
                    context=c, confirmation_id=confirmation_id, tool=name, target=target,
                    operation_digest=digest, wait_ms=wait))
            except EngramError as exc:
                if exc.code is Code.NOT_FOUND:  # unknown, already claimed, another binding's: fail closed
                    return _INVALID
                raise
            if status == "approved":
                return None
            if status == "denied":
                return _DECLINED
            if status == "expired":
                return _TIMED_OUT
