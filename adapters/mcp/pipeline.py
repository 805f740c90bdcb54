"""The one pipeline every ``tools/call`` goes through (SPEC §2, §5, §8).

Its steps, in order:

1. **bind** the call's host context (``adapters.mcp.host_context``); an unknown tool, or one the
   caller's token does not open, is unknown before anything is asked;
2. **grants**: whether the policy grants the tool, from the tool list the core gives the binding.
   Asked first, except for a call that may go straight (search and get always; capture and
   request_admission once the binding's last list granted them without a confirmation): then it
   is asked only when a later step fails, to tell a refusal from a tool that must look unknown;
3. **validate** the arguments against the closed schema;
4. **purpose**: the purpose the arguments name must be the bound one;
5. **confirm** (``adapters.mcp.confirmation_step``): withdraw and forget always, capture and
   request_admission when the policy gates them, or when the core answers that it does;
6. **invoke** the core, under a grant the adapter signs when a human approved;
7. **map** the outcome: the success envelope, or the refusal envelope with its constant message;
8. **log** each refusal (``adapters.mcp.refusal_log``): the exact reason goes to the operator's
   log line and the audit row, never to the agent.

:meth:`ToolCallPipeline.map_confirmation_errors` wraps it as MCP middleware: the SDK's own
rejections of a confirmation's state become the same gate_failed refusal.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import mcp_types as types
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from adapters.mcp import envelope
from adapters.mcp.config import AgentBinding
from adapters.mcp.confirmation_step import Approved, ConfirmationStep, CoreRefused, GateRefused
from adapters.mcp.core_client import CoreClient
from adapters.mcp.host_context import CallContext, ContextSource, ContextUnavailable, now_ms
from adapters.mcp.refusal_log import log_call_refusal, log_unaudited, time_unit_hint
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import target_of
from engram_core.contract.schemas import INPUT_SCHEMAS
from engram_core.contract.tools import CAPTURE_TOOL, CONFIRMED_ON_POLICY, GATED_TOOLS, READ_TOOLS, TOOL_NAMES
from engram_core.contract.validation import validate_arguments
from engram_core.trust.hostctx import HOST_CALL, TOOLS_LIST_CALL, make_grant

logger = logging.getLogger("engram.mcp")
_T = TypeVar("_T")
# The host-bound field a protocol refusal's reason is about, said in the error's data (issue 60 item 1).
_MISMATCHED = {"PURPOSE_MISMATCH": "purpose_ref"}
_LIST_HINTS_MAX = 1024  # bindings whose last tool list is remembered (HTTP serves many)

# The SDK's wire errors that collide with the contract's protocol errors
# (MCP_NOTES.md): both mean a confirmation did not complete.
_INVALID_REQUEST_STATE = "Invalid or expired requestState"
_INVALID_RESULT = "Handler returned an invalid result"

Answer = types.CallToolResult | types.InputRequiredResult


def request_headers(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, str] | None:
    request = ctx.request
    return getattr(request, "headers", None) if request is not None else None


def access_token(ctx: ServerRequestContext[Any, Any]) -> AccessToken | None:
    """The bearer token the HTTP layer verified for this request (None on stdio)."""
    request = ctx.request
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    return user.access_token if isinstance(user, AuthenticatedUser) else None


def _purpose_mismatch(tool: str, arguments: dict[str, Any], bound: str) -> bool:
    """SPEC §2: purpose_ref (search, get) and payload.purpose_ref (capture) must equal the bound one."""
    if tool in READ_TOOLS:
        return arguments["purpose_ref"] != bound
    if tool == CAPTURE_TOOL:
        return arguments["payload"]["purpose_ref"] != bound
    return False


@dataclass
class _CallState:
    """Per tools/call facts the error-mapping middleware needs."""

    call: CallContext | None = None
    tool: str = ""
    asked_confirmation: bool = False


# Set by the middleware, read by the pipeline: both run in the request's task.
_CALL_STATE: ContextVar[_CallState | None] = ContextVar("engram_mcp_call_state", default=None)


class _GrantCheck:
    """Step 2 of one call: asked first (:meth:`first`), or only once a later step fails
    (:meth:`after_failure`) for a call that went straight. Either raises unknown tool for a tool
    the policy does not grant: an ungranted tool looks like no tool."""

    def __init__(self, pipeline: ToolCallPipeline, call: CallContext, name: str, straight: bool) -> None:
        self._pipeline, self._call, self._name, self._straight = pipeline, call, name, straight
        self.gated: frozenset[str] = frozenset()  # known only when asked first

    async def first(self) -> types.CallToolResult | None:
        if self._straight:
            return None
        refused, self.gated = await self._pipeline.check_granted(self._name, self._call)
        return refused

    async def after_failure(self) -> types.CallToolResult | None:
        if not self._straight:
            return None
        return (await self._pipeline.check_granted(self._name, self._call))[0]


class ToolCallPipeline:
    """The steps of a tools/call (see the module doc); one instance serves every connection."""

    def __init__(self, *, core: CoreClient, contexts: ContextSource, signing_key: Ed25519PrivateKey,
                 confirmation: ConfirmationStep) -> None:
        self._core = core
        self._contexts = contexts
        self._key = signing_key
        self._confirmation = confirmation
        # The last tool list the core gave each binding: the tools it may call straight (granted,
        # not gated behind a confirmation). Only a hint to skip asking again: the core authorizes
        # every call itself, and any failure asks for the list afresh (:class:`_GrantCheck`).
        self._straight_tools: dict[AgentBinding, frozenset[str]] = {}

    # ---- the steps -------------------------------------------------------------

    async def call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Answer:
        name = params.name
        call = self._bind(ctx, name)
        state = _CALL_STATE.get()
        if state is not None:
            state.call, state.tool = call, name
        arguments: Any = params.arguments if params.arguments is not None else {}
        grants = _GrantCheck(self, call, name, self._goes_straight(call, name, params))
        refused = await grants.first()
        if refused is not None:
            return refused
        try:
            validate_arguments(name, arguments)
        except EngramError as exc:
            # Nothing sent to the core but the audit row.
            return await grants.after_failure() or await self.refuse(call, name, exc)
        if _purpose_mismatch(name, arguments, call.binding.purpose_ref):
            refused = await grants.after_failure()
            if refused is not None:
                return refused
            raise await self._protocol_refusal(call, name, "PURPOSE_MISMATCH")
        if name in GATED_TOOLS or (name in CONFIRMED_ON_POLICY and (
                name in grants.gated or params.request_state is not None)):
            return await self._confirm_then_invoke(ctx, params, name, arguments, call, state)
        try:
            value = await self._invoke(name, arguments, call)
        except EngramError as exc:
            refused = await grants.after_failure()
            if refused is not None:
                return refused
            # The tool list said no confirmation, but the core wants one: the capture policy
            # decides on the capture's own facts, or the policy changed in between. Ask the
            # human now, as for forget (SPEC §8), instead of refusing the agent.
            if name in CONFIRMED_ON_POLICY and (exc.code is Code.GATE_FAILED or exc.confirmation_required):
                return await self._confirm_then_invoke(ctx, params, name, arguments, call, state)
            return self._core_refused(call, name, exc, arguments)
        return envelope.success(value, audit_id=call.audit_id)

    def _bind(self, ctx: ServerRequestContext[Any, Any], name: str) -> CallContext:
        """Step 1: the call's host context; a tool outside the six, or one the caller's token does
        not open, is unknown."""
        if name not in INPUT_SCHEMAS:
            raise envelope.unknown_tool()
        call = self.context(ctx, name)
        if call.tools is not None and name not in call.tools:
            # A tool the caller's token does not open looks like no tool (SPEC §2). A tool a further
            # scope would open was answered 403 insufficient_scope before this, by the scope
            # challenge (adapters/mcp/http_app.py); what reaches here no scope opens.
            raise envelope.unknown_tool()
        return call

    def context(self, ctx: ServerRequestContext[Any, Any], call: str = TOOLS_LIST_CALL) -> CallContext:
        """The request's host context, for ``call`` (a tool name, or the listing)."""
        try:
            return self._contexts.for_request(request_headers(ctx), access_token(ctx), call)
        except ContextUnavailable as exc:
            logger.info("host context unavailable: %s", exc)
            raise envelope.trusted_context_unavailable() from None

    def _goes_straight(self, call: CallContext, name: str, params: types.CallToolRequestParams) -> bool:
        """A call sent without asking for the tool list first. The core authorizes it with the
        same policy, so the list (a second gRPC round trip, ~2.5 ms of an MCP search, ~3 ms of a
        write) only tells a refusal from a tool that must look unknown, and is asked only on
        failure. Every answer is the one the list-first order gives; a write gated since the last
        list reaches the core without a grant once, is refused there (audited) and goes on to the
        human, as a capture only its policy gates does. A write goes straight only where the
        adapter signs each call's context: a fronting host's one context is spent by the write,
        and a write the core then gates would need it again (for the grant, or to record the
        human's refusal; the core spends every context it sees)."""
        return call.memory_enabled and (name in READ_TOOLS or (
            name in CONFIRMED_ON_POLICY and params.request_state is None and call.resignable
            and name in self._straight_tools.get(call.binding, ())))

    async def granted(self, call: CallContext) -> tuple[frozenset[str], frozenset[str]]:
        """(granted tools, granted tools the policy gates behind a confirmation)."""
        if not call.memory_enabled:
            return frozenset(), frozenset()  # SPEC §2: memory is off unless the host opted in
        names, gated_names = await self._following_epoch(call, self._core.granted_tools, TOOLS_LIST_CALL)
        granted, gated = frozenset(names) & frozenset(TOOL_NAMES), frozenset(gated_names) & frozenset(TOOL_NAMES)
        if call.tools is not None:  # token binding: only what the caller's scopes open
            granted, gated = granted & call.tools, gated & call.tools
        if len(self._straight_tools) >= _LIST_HINTS_MAX and call.binding not in self._straight_tools:
            self._straight_tools.pop(next(iter(self._straight_tools)))
        self._straight_tools[call.binding] = granted - gated
        return granted, gated

    async def check_granted(self, name: str, call: CallContext) -> tuple[types.CallToolResult | None, frozenset[str]]:
        """(the failure envelope if the tool list itself was refused, else None; the gated tools).
        Raises unknown tool if ``name`` is not granted."""
        try:
            granted, gated = await self.granted(call)
        except EngramError as exc:
            return self._core_refused(call, name, exc), frozenset()
        if name not in granted:
            raise envelope.unknown_tool()
        return None, gated

    async def _confirm_then_invoke(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams,
                                   name: str, arguments: dict[str, Any], call: CallContext,
                                   state: _CallState | None) -> Answer:
        outcome = await self._confirmation.run(ctx, params, name, arguments, call,
                                               lambda rpc: self._following_epoch(call, rpc, HOST_CALL))
        if isinstance(outcome, types.InputRequiredResult):
            if state is not None:
                state.asked_confirmation = True
            return outcome
        if isinstance(outcome, CoreRefused):
            return self._core_refused(call, name, outcome.error)
        if isinstance(outcome, GateRefused):
            return await self.refuse(call, name, EngramError(
                Code.GATE_FAILED, outcome.reason.lower(), reason_class=outcome.reason_class,
                reasons=(outcome.reason,)), outcome.target)
        digest = outcome.digest if isinstance(outcome, Approved) else None  # a Replay needs no grant
        try:
            value = await self._invoke(name, arguments, call, confirmed_digest=digest)
        except EngramError as exc:
            return self._core_refused(call, name, exc, arguments)
        return envelope.success(value, audit_id=call.audit_id)

    # ---- the core ----------------------------------------------------------------

    async def _following_epoch(self, call: CallContext, rpc: Callable[[bytes], Awaitable[_T]],
                               for_call: str | None = None) -> _T:
        """One gRPC call under a context signed right before it is sent, for that call
        (``for_call``; default the MCP request's own call): the call spends it, so nothing
        signed here is left able to act. After AUTHORIZATION_REVOKED, an adapter that signs
        its own contexts asks the core for the bound scope's current epoch (a host-only call)
        once and retries once under a new context: revoke cuts off contexts and grants signed
        before it, not the host that holds the key (docs/security.md)."""
        def signed() -> bytes:
            return call.signed() if for_call is None else call.signed_for(for_call)

        try:
            return await rpc(signed())
        except EngramError as exc:
            if exc.code is not Code.AUTHORIZATION_REVOKED or not call.resignable:
                raise
            refused = exc
        try:
            epoch = await self._core.authorization_epoch(self._contexts.host_context(call))
        except (EngramError, ContextUnavailable) as exc:
            logger.info("authorization epoch not refreshed: %s", exc)
            raise refused from None
        logger.info("following authorization epoch %d of the bound scope", epoch)
        self._contexts.follow_epoch(epoch, (call.binding.tenant, call.binding.workspace))
        return await rpc(signed())

    async def _invoke(self, name: str, arguments: dict[str, Any], call: CallContext,
                      confirmed_digest: str | None = None) -> dict[str, Any]:
        """The tool call to the core; with ``confirmed_digest`` (a human approved this exact
        operation) a grant the adapter signs, under the same epoch as the context."""
        async def rpc(context: bytes) -> dict[str, Any]:
            grant = None if confirmed_digest is None else self._grant(name, arguments, call, confirmed_digest)
            return await self._core.invoke(name, arguments, context=context, grant=grant)

        return await self._following_epoch(call, rpc)

    def _grant(self, name: str, arguments: dict[str, Any], call: CallContext, digest: str) -> bytes:
        b = call.binding
        return make_grant(
            self._key,
            tenant=b.tenant,
            workspace=b.workspace,
            principal=b.principal,
            tool=name,
            target=target_of(name, arguments),
            operation_digest=digest,
            approved_at_ms=now_ms(),
            authorization_epoch=call.authorization_epoch(),
        )

    # ---- refusals: constant messages for the agent, the exact reason in logs and audit -----

    def _core_refused(self, call: CallContext, name: str, exc: EngramError,
                      arguments: Any = None) -> types.CallToolResult:
        """A refusal the core decided (and audited under this call's audit id)."""
        log_call_refusal("core", call, name, exc, time_unit_hint(name, arguments, exc))
        return envelope.refusal(exc, audit_id=call.audit_id)

    async def refuse(self, call: CallContext, name: str, exc: EngramError, target: str = "") -> types.CallToolResult:
        """A refusal the adapter decided: logged, then audited by the core under this call's
        context and audit id (HostService.RecordRefusal), so the envelope's auditId names a real
        row. If the row cannot be written the answer is STORE_UNAVAILABLE (retriable), never an
        auditId that points nowhere."""
        if not await self._audited(call, name, exc, target):
            return envelope.failure(Code.STORE_UNAVAILABLE, audit_id=call.audit_id)
        return envelope.refusal(exc, audit_id=call.audit_id)

    async def _audited(self, call: CallContext, name: str, exc: EngramError, target: str = "") -> bool:
        """Log an adapter refusal and record it with the core under the call's audit id; False
        (and a warning) when the row could not be written."""
        log_call_refusal("adapter", call, name, exc)
        try:
            await self._core.record_refusal(context=call.signed_for(HOST_CALL), operation=name, error=exc,
                                            target=target)
        except EngramError as failed:
            log_unaudited(name, call, failed)
            return False
        return True

    async def _protocol_refusal(self, call: CallContext, name: str, reason: str) -> MCPError:
        """-32603 for a call whose context is valid but not for this request (purpose mismatch):
        recorded like any refusal; the agent sees only the protocol error (SPEC §2)."""
        await self._audited(call, name, EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, reason.lower(), reasons=(reason,)))
        return envelope.trusted_context_unavailable(_MISMATCHED.get(reason))

    # ---- the SDK boundary's confirmation failures ------------------------------------

    async def map_confirmation_errors(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """MCP middleware: turn the SDK's confirmation failures into gate_failed envelopes
        (MCP_NOTES.md).

        A tampered, expired or replayed requestState is rejected by the SDK
        boundary as -32602, and an input-required answer on a 2025-11-25
        connection as -32603; on the wire both would impersonate the
        contract's protocol errors.
        """
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        state = _CallState()
        token = _CALL_STATE.set(state)
        try:
            return await call_next(ctx)
        except MCPError as exc:
            boundary_rejection = exc.code == types.INVALID_PARAMS and exc.message == _INVALID_REQUEST_STATE
            legacy_input_required = (
                exc.code == types.INTERNAL_ERROR
                and exc.message == _INVALID_RESULT
                and state.asked_confirmation
            )
            if not (boundary_rejection or legacy_input_required):
                raise
            # The boundary rejects before our handler runs: this call's context is made here.
            named = (ctx.params or {}).get("name")
            tool = state.tool or (named if named in INPUT_SCHEMAS else "")
            if not tool:
                raise envelope.unknown_tool() from None
            call = state.call or self.context(ctx, tool)
            result = await self.refuse(call, tool, EngramError(
                Code.GATE_FAILED, "confirmation state", reason_class="confirmation_invalid",
                reasons=("CONFIRMATION_STATE_INVALID",)))
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                dumped.pop("resultType", None)
            return dumped
        finally:
            _CALL_STATE.reset(token)
