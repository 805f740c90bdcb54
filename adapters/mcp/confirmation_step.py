"""The confirmation step of a tool call (SPEC §8): whether a human approved this exact operation.

The pipeline (``adapters.mcp.pipeline``) runs this step for withdraw and forget always, and for
capture and request_admission when the policy gates them. The step only decides; it never calls
the tool. Its answer is one of:

* :class:`Approved`: a human approved the operation of this digest; the pipeline invokes the tool
  under a grant it signs for that digest;
* :class:`Replay`: the same key and arguments as a committed withdraw or forget; the pipeline
  invokes it without a grant, and the core answers the stored outcome (nobody is asked again);
* :class:`GateRefused`: gate_failed for this reason (declined, timed out, cannot elicit, a state
  that is not this operation's); the adapter's refusal, audited under the call;
* :class:`CoreRefused`: the core refused a question the step asked it (the target's state, a
  parked confirmation); its refusal is the answer;
* ``types.InputRequiredResult``: a 2026-07-28 first leg; the client asks the human and re-sends
  the call with the answer.

The carriers: form elicitation (``adapters.mcp.confirmation``: inside the call on 2025-11-25, as
an input request on 2026-07-28) or, for a client that can only open a URL, the console's page
(``adapters.mcp.url_confirmation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from adapters.mcp.confirmation import (
    CONFIRM_KEY,
    REQUESTED_SCHEMA,
    ConfirmationLedger,
    PendingConfirmation,
    approved,
    confirmation_message,
    consume_matching,
    decode_state,
    encode_state,
)
from adapters.mcp.core_client import CoreClient
from adapters.mcp.host_context import CallContext, now_ms
from adapters.mcp.url_confirmation import HostCall, UrlConfirmations
from engram_core.contract.errors import EngramError
from engram_core.contract.operation import operation_digest, target_of
from engram_core.contract.tools import GATED_TOOLS


@dataclass(frozen=True)
class Approved:
    digest: str  # the operation a human approved; the grant is signed for it


@dataclass(frozen=True)
class Replay:
    """A retry of a committed withdraw or forget: its stored outcome answers, nobody is asked."""


@dataclass(frozen=True)
class GateRefused:
    reason_class: str
    reason: str  # the reason code
    target: str  # recorded with the refusal's audit row


@dataclass(frozen=True)
class CoreRefused:
    error: EngramError


Outcome = Approved | Replay | GateRefused | CoreRefused | types.InputRequiredResult


def can_elicit_form(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Client declared form elicitation (an empty elicitation object means form)."""
    caps = ctx.session.client_capabilities
    elicitation = caps.elicitation if caps is not None else None
    if elicitation is None:
        return False
    return elicitation.form is not None or elicitation.url is None


class ConfirmationStep:
    """The confirmation step of one adapter process; the ledger holds the 2026-07-28 round trips
    in flight, single use."""

    def __init__(self, core: CoreClient, ledger: ConfirmationLedger, timeout_ms: int,
                 console_url: str | None) -> None:
        self._core = core
        self._ledger = ledger
        self._timeout_ms = timeout_ms
        # Clients with URL-mode elicitation only are sent to the console's page (issue 61).
        self._url = UrlConfirmations(core, console_url, ledger, timeout_ms) if console_url else None

    async def run(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, name: str,
                  arguments: dict[str, Any], call: CallContext, host_call: HostCall[Any]) -> Outcome:
        """``host_call`` runs one gRPC call under a host-call context of the call's binding."""
        b = call.binding
        digest = operation_digest(
            tool=name, tenant=b.tenant, workspace=b.workspace, principal=b.principal, arguments=arguments
        )
        target = target_of(name, arguments)
        first_leg = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or params.request_state is None
        if first_leg and name in GATED_TOOLS:
            # Ask nobody about a target that is not there (or cannot make this transition): the
            # core answers what the tool itself would, audited as that tool's refusal.
            try:
                status = await host_call(lambda c: self._core.check_gated(name, arguments, context=c))
            except EngramError as exc:
                return CoreRefused(exc)
            if status == "replay":
                # SPEC §7: the same key and arguments as a committed withdraw or forget (a retry after
                # MUTATION_OUTCOME_UNKNOWN, say). Its stored outcome is the answer and changes
                # nothing, so no human is asked again (issue 26.8): a decline now would tell the
                # agent "nothing was changed" about a record already forgotten.
                return Replay()
        if self._url is not None and self._url.applies(ctx, params, name, can_elicit_form(ctx)):
            try:
                outcome = await self._url.confirm(ctx, params, name, arguments, call, digest, target, host_call)
            except EngramError as exc:
                return CoreRefused(exc)
            if isinstance(outcome, types.InputRequiredResult):
                return outcome
            return Approved(digest) if outcome is None else GateRefused(*outcome, target)
        if first_leg and not can_elicit_form(ctx):
            return GateRefused("cannot_elicit", "ELICITATION_UNSUPPORTED", target)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            if params.request_state is None:
                return self._ask(name, arguments, call, digest, target)
            refusal = self._round_trip_refusal(params, name, digest, call)
        else:
            refusal = await self._elicit(ctx, name, arguments, call, target)
        return Approved(digest) if refusal is None else GateRefused(*refusal, target)

    def _ask(self, name: str, arguments: dict[str, Any], call: CallContext, digest: str,
             target: str) -> types.InputRequiredResult:
        """2026-07-28 first leg: the form for the client to show, and the state of its retry."""
        b = call.binding
        nonce = self._ledger.open(
            PendingConfirmation(
                tool=name,
                operation_digest=digest,
                scope_principal=(b.tenant, b.workspace, b.principal),
                expires_at_ms=now_ms() + self._timeout_ms,
                asker=call.asker,
            )
        )
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=confirmation_message(name, target, arguments, b),
                requested_schema=REQUESTED_SCHEMA,
            )
        )
        return types.InputRequiredResult(
            input_requests={CONFIRM_KEY: request}, request_state=encode_state(nonce, digest)
        )

    async def _elicit(self, ctx: ServerRequestContext[Any, Any], name: str, arguments: dict[str, Any],
                      call: CallContext, target: str) -> tuple[str, str] | None:
        """2025-11-25: the form inside the call. None when approved; else the refusal's (class, reason)."""
        try:
            with anyio.fail_after(self._timeout_ms / 1000):
                answer = await ctx.session.elicit_form(
                    confirmation_message(name, target, arguments, call.binding),
                    REQUESTED_SCHEMA,
                    related_request_id=ctx.request_id,
                )
        except TimeoutError:
            return "timed_out", "CONFIRMATION_TIMED_OUT"
        except MCPError:
            return "cannot_elicit", "ELICITATION_FAILED"
        if not approved(answer.action, answer.content):
            return "declined", "CONFIRMATION_DECLINED"
        return None

    def _round_trip_refusal(
        self, params: types.CallToolRequestParams, name: str, digest: str, call: CallContext
    ) -> tuple[str, str] | None:
        """2026-07-28 retry: None when the state names a live, unused nonce for this exact
        operation and the human approved; else the refusal's (class, reason code)."""
        invalid = ("confirmation_invalid", "CONFIRMATION_STATE_INVALID")
        decoded = decode_state(params.request_state or "")
        if decoded is None:
            return invalid
        nonce, state_digest = decoded
        if not consume_matching(self._ledger, nonce, state_digest, tool=name, digest=digest, binding=call.binding,
                                asker=call.asker, now_ms=now_ms()):
            return invalid
        response = (params.input_responses or {}).get(CONFIRM_KEY)
        action = getattr(response, "action", None)
        content = getattr(response, "content", None)
        if isinstance(action, str) and approved(action, content):
            return None
        return "declined", "CONFIRMATION_DECLINED"
