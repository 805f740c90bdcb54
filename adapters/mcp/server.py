"""The MCP server agents talk to (SPEC §1–§3, §5, §8).

A translator and host-side guard on the low-level SDK server: it lists the
tools the policy grants the binding, validates arguments against the closed
schemas, checks the bound purpose, runs the confirmation flow, forwards each
call to the core over gRPC with the signed host context, and wraps the answer
in the envelope. It stores nothing and decides nothing a policy decides.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp_types as types
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from adapters.mcp import envelope
from adapters.mcp.binding import CallContext, ContextSource, ContextUnavailable, now_ms
from adapters.mcp.config import Binding
from adapters.mcp.confirmation import (
    CONFIRM_KEY,
    REQUESTED_SCHEMA,
    ConfirmationLedger,
    InMemoryConfirmationLedger,
    PendingConfirmation,
    approved,
    confirmation_message,
    decode_state,
    encode_state,
)
from adapters.mcp.core_client import CoreClient
from adapters.mcp.guidance import GUIDE_PROMPT_NAME, GUIDE_RESOURCE_URI, TOOL_DESCRIPTIONS, TOOL_TITLES, guide
from adapters.mcp.refusal_log import log_call_refusal, log_list_refusal
from adapters.mcp.url_confirmation import UrlConfirmations
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import operation_digest, target_of
from engram_core.contract.schema_examples import EXAMPLE_PURPOSE
from engram_core.contract.schemas import INPUT_SCHEMAS, output_schema
from engram_core.contract.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    CONFIRMED_ON_POLICY,
    FORGET_TOOL,
    GATED_TOOLS,
    GET_TOOL,
    READ_TOOLS,
    SEARCH_TOOL,
    TOOL_NAMES,
    WITHDRAW_TOOL,
)
from engram_core.contract.validation import validate_arguments
from engram_core.trust.hostctx import HOST_CALL, TOOLS_LIST_CALL, make_grant

logger = logging.getLogger("engram.mcp")
# The host-bound field a protocol refusal's reason is about, said in the error's data (issue 60 item 1).
_MISMATCHED = {"PURPOSE_MISMATCH": "purpose_ref"}
_T = TypeVar("_T")

SERVER_NAME = "engram"
SERVER_VERSION = "0.1.0"

# SPEC §8: withdraw and forget always need a human confirmation; capture and
# admission when the policy gates them for this binding (ListCapabilities says
# which), or, should the policy change between the two calls, when the core
# answers gate_failed.
ALWAYS_CONFIRMED = GATED_TOOLS
_PURPOSE_TOOLS = READ_TOOLS

# The SDK's wire errors that collide with the contract's protocol errors
# (MCP_NOTES.md): both mean a confirmation did not complete.
_INVALID_REQUEST_STATE = "Invalid or expired requestState"
_INVALID_RESULT = "Handler returned an invalid result"
_STATE_TTL_S = 300.0  # SPEC §8: a confirmation lives at most 300 s
_LIST_HINTS_MAX = 1024  # bindings whose last tool list is remembered (HTTP serves many)

_ANNOTATIONS = {
    SEARCH_TOOL: types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    GET_TOOL: types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    CAPTURE_TOOL: types.ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    ADMISSION_TOOL: types.ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    WITHDRAW_TOOL: types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    FORGET_TOOL: types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
}


def tool_definition(name: str, purpose_ref: str | None = None) -> types.Tool:
    """``purpose_ref``: the call's bound purpose, written into the schema's examples in place of
    the placeholder one, so an example copied verbatim is not refused as a purpose mismatch
    (the guide's worked captures do the same)."""
    schema = INPUT_SCHEMAS[name]
    if purpose_ref and purpose_ref != EXAMPLE_PURPOSE and "examples" in schema:
        schema = {**schema, "examples": json.loads(json.dumps(schema["examples"]).replace(
            json.dumps(EXAMPLE_PURPOSE), json.dumps(purpose_ref)))}
    return types.Tool(
        name=name,
        title=TOOL_TITLES[name],
        description=TOOL_DESCRIPTIONS[name],
        input_schema=schema,
        output_schema=output_schema(name),
        annotations=_ANNOTATIONS[name],
    )


def _headers(ctx: ServerRequestContext[Any, Any]) -> Mapping[str, str] | None:
    request = ctx.request
    return getattr(request, "headers", None) if request is not None else None


def _access_token(ctx: ServerRequestContext[Any, Any]) -> AccessToken | None:
    """The bearer token the HTTP layer verified for this request (None on stdio)."""
    request = ctx.request
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    return user.access_token if isinstance(user, AuthenticatedUser) else None


def _can_elicit_form(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Client declared form elicitation (an empty elicitation object means form)."""
    caps = ctx.session.client_capabilities
    elicitation = caps.elicitation if caps is not None else None
    if elicitation is None:
        return False
    return elicitation.form is not None or elicitation.url is None


def _log_refusal(decided_by: str, call: CallContext, tool: str, exc: EngramError,
                 hints: dict[str, str] | None = None) -> None:
    log_call_refusal(decided_by, call, tool, exc, hints)


# The capture refusals for payload times outside the host's window (capture policy, issue 26.5).
_TIME_CLASSES = frozenset({"time_before_floor", "time_beyond_horizon"})
_TIME_POINTERS = (("/payload/valid_time/t", ("valid_time", "t")), ("/payload/valid_time/t_end", ("valid_time", "t_end")),
                  ("/payload/primary_event/at", ("primary_event", "at")))


def _likely_unit(value: int) -> str:
    """The unit an epoch time of this size was most likely written in, if not milliseconds."""
    if 10**8 <= abs(value) < 10**11:
        return "seconds"  # 1973 .. 5138 in seconds; 1970-01-02 .. 1973 read as milliseconds
    if abs(value) >= 10**14:
        return "microseconds"  # 1973 onwards in microseconds; year 5138 onwards read as milliseconds
    return ""


def _time_unit_hint(tool: str, arguments: Any, exc: EngramError) -> dict[str, str]:
    """For a capture refused for its times (SPEC §4: epoch milliseconds), which fields look like
    another unit, e.g. ``likely_unit_mistake=/payload/valid_time/t:seconds``: pointers and unit
    names only, never the values."""
    if tool != CAPTURE_TOOL or exc.reason_class not in _TIME_CLASSES or not isinstance(arguments, dict):
        return {}
    payload = arguments.get("payload")
    found = []
    for pointer, (outer, inner) in _TIME_POINTERS:
        value = payload.get(outer, {}).get(inner) if isinstance(payload, dict) and isinstance(payload.get(outer), dict) \
            else None
        unit = _likely_unit(value) if isinstance(value, int) and not isinstance(value, bool) else ""
        if unit:
            found.append(f"{pointer}:{unit}")
    return {"likely_unit_mistake": ",".join(found)} if found else {}


def _purpose_mismatch(tool: str, arguments: dict[str, Any], bound: str) -> bool:
    """SPEC §2: purpose_ref (search, get) and payload.purpose_ref (capture) must equal the bound one."""
    if tool in _PURPOSE_TOOLS:
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


# Set by the middleware, read by the handler: both run in the request's task.
_CALL_STATE: ContextVar[_CallState | None] = ContextVar("engram_mcp_call_state", default=None)


class EngramMcp:
    """Handlers of the adapter; one instance serves every connection of a process."""

    def __init__(
        self,
        *,
        core: CoreClient,
        contexts: ContextSource,
        signing_key: Ed25519PrivateKey,
        confirmation_timeout_ms: int,
        ledger: ConfirmationLedger | None = None,
        observer: Any = None,
        console_url: str | None = None,
    ) -> None:
        self._observer = observer  # adapters.mcp.observability.ToolCallObserver: logs, metrics, trace root
        self._core = core
        self._contexts = contexts
        self._key = signing_key
        self._confirmation_timeout_ms = confirmation_timeout_ms
        self._ledger = ledger or InMemoryConfirmationLedger()
        # Clients with URL-mode elicitation only are sent to the console's page (issue 61).
        self._url = (UrlConfirmations(core, console_url, self._ledger, confirmation_timeout_ms)
                     if console_url else None)
        # The last tool list the core gave each binding: the tools it may call straight (granted,
        # not gated behind a confirmation). Only a hint to skip asking again: the core authorizes
        # every call itself, and any failure asks for the list afresh (``_call_straight``).
        self._straight_tools: dict[Binding, frozenset[str]] = {}

    async def close(self) -> None:
        await self._core.close()

    # ---- server assembly ---------------------------------------------------

    def build(self) -> Server[Any]:
        server: Server[Any] = Server(
            SERVER_NAME,
            version=SERVER_VERSION,
            title="Engram memory",
            instructions=guide(self._contexts.bound_purpose),
            # Header validation of Mcp-Param-* on HTTP must not run a caller-scoped
            # tools/list (a gRPC round trip) for every call; the schemas are static.
            get_tool_input_schema=lambda name: INPUT_SCHEMAS.get(name),
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
            on_list_resources=self.list_resources,
            on_read_resource=self.read_resource,
            on_list_resource_templates=self.list_resource_templates,
        )
        # Outermost first: the observer sees final answers, our mapping the boundary's rejections.
        if self._observer is not None:
            server.middleware.append(self._observer)
        server.middleware.append(self.map_confirmation_errors)
        server.middleware.append(
            RequestStateBoundary(
                RequestStateSecurity.ephemeral(ttl=_STATE_TTL_S), default_audience=SERVER_NAME
            )
        )
        return server

    # ---- context and grants --------------------------------------------------

    def _context(self, ctx: ServerRequestContext[Any, Any], call: str = TOOLS_LIST_CALL) -> CallContext:
        try:
            return self._contexts.for_request(_headers(ctx), _access_token(ctx), call)
        except ContextUnavailable as exc:
            logger.info("host context unavailable: %s", exc)
            raise envelope.trusted_context_unavailable() from None

    async def _granted(self, call: CallContext) -> tuple[frozenset[str], frozenset[str]]:
        """(granted tools, granted tools the policy gates behind a confirmation)."""
        if not call.memory_enabled:
            return frozenset(), frozenset()  # SPEC §2: memory is off unless the host opted in
        names, gated = await self._following_epoch(call, self._core.granted_tools, TOOLS_LIST_CALL)
        granted, gated = frozenset(names) & frozenset(TOOL_NAMES), frozenset(gated) & frozenset(TOOL_NAMES)
        if call.tools is not None:  # token binding: only what the caller's scopes open
            granted, gated = granted & call.tools, gated & call.tools
        if len(self._straight_tools) >= _LIST_HINTS_MAX and call.binding not in self._straight_tools:
            self._straight_tools.pop(next(iter(self._straight_tools)))
        self._straight_tools[call.binding] = granted - gated
        return granted, gated

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

    # ---- tools ---------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        call = self._context(ctx)
        try:
            granted, _ = await self._granted(call)
        except EngramError as exc:
            # The agent sees only a JSON-RPC error, so this line is where an operator learns why
            # (e.g. the core stopped after start-up).
            log_list_refusal(call, exc)
            if exc.retriable:  # a core not answering is transient: say retry, not stop
                raise envelope.temporarily_unavailable(exc) from None
            raise envelope.trusted_context_unavailable() from None
        return types.ListToolsResult(tools=[tool_definition(name, call.binding.purpose_ref)
                                            for name in TOOL_NAMES if name in granted])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        name = params.name
        if name not in INPUT_SCHEMAS:
            raise envelope.unknown_tool()
        call = self._context(ctx, name)
        if call.tools is not None and name not in call.tools:
            # A tool the caller's token does not open looks like no tool (SPEC §2). A tool a further
            # scope would open was answered 403 insufficient_scope before this, by the scope
            # challenge (adapters/mcp/http_app.py); what reaches here no scope opens.
            raise envelope.unknown_tool()
        state = _CALL_STATE.get()
        if state is not None:
            state.call, state.tool = call, name
        arguments: Any = params.arguments if params.arguments is not None else {}
        # A write goes straight only where the adapter signs each call's context: a fronting host's
        # one context is spent by the write, and a write the core then gates would need it again
        # (for the grant, or to record the human's refusal; the core spends every context it sees).
        if call.memory_enabled and (name in READ_TOOLS or (
                name in CONFIRMED_ON_POLICY and params.request_state is None and call.resignable
                and name in self._straight_tools.get(call.binding, ()))):
            return await self._call_straight(ctx, params, name, arguments, call, state)
        refused, gated = await self._check_granted(name, call)
        if refused is not None:
            return refused

        try:
            validate_arguments(name, arguments)
        except EngramError as exc:
            return await self._refuse(call, name, exc)  # nothing sent to core but the audit row
        if _purpose_mismatch(name, arguments, call.binding.purpose_ref):
            raise await self._protocol_refusal(call, name, "PURPOSE_MISMATCH")

        if name in ALWAYS_CONFIRMED or (name in CONFIRMED_ON_POLICY and (name in gated or params.request_state is not None)):
            return await self._confirm_then_invoke(ctx, params, name, arguments, call, state)
        try:
            value = await self._invoke(name, arguments, call)
        except EngramError as exc:
            # The tool list said no confirmation, but the core wants one: the capture policy
            # decides on the capture's own facts, or the policy changed in between. Ask the
            # human now, as for forget (SPEC §8), instead of refusing the agent.
            asks_human = exc.code is Code.GATE_FAILED or exc.confirmation_required
            if asks_human and name in CONFIRMED_ON_POLICY:
                return await self._confirm_then_invoke(ctx, params, name, arguments, call, state)
            return self._core_refused(call, name, exc, arguments)
        return envelope.success(value, audit_id=call.audit_id)

    # ---- refusals: constant messages for the agent, the exact reason in logs and audit -----

    def _core_refused(self, call: CallContext, name: str, exc: EngramError,
                      arguments: Any = None) -> types.CallToolResult:
        """A refusal the core decided (and audited under this call's audit id)."""
        _log_refusal("core", call, name, exc, _time_unit_hint(name, arguments, exc))
        return envelope.refusal(exc, audit_id=call.audit_id)

    async def _refuse(self, call: CallContext, name: str, exc: EngramError, target: str = "") -> types.CallToolResult:
        """A refusal the adapter decided: logged, then audited by the core under this call's
        context and audit id (HostService.RecordRefusal), so the envelope's auditId names a real
        row. If the row cannot be written the answer is STORE_UNAVAILABLE (retriable), never an
        auditId that points nowhere."""
        _log_refusal("adapter", call, name, exc)
        try:
            await self._core.record_refusal(context=call.signed_for(HOST_CALL), operation=name, error=exc,
                                            target=target)
        except EngramError as failed:
            logger.warning("refusal not audited: tool=%s audit_id=%s code=%s", name, call.audit_id, failed.code.value)
            return envelope.failure(Code.STORE_UNAVAILABLE, audit_id=call.audit_id)
        return envelope.refusal(exc, audit_id=call.audit_id)

    async def _protocol_refusal(self, call: CallContext, name: str, reason: str) -> MCPError:
        """-32603 for a call whose context is valid but not for this request (purpose mismatch):
        recorded like any refusal; the agent sees only the protocol error (SPEC §2)."""
        exc = EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, reason.lower(), reasons=(reason,))
        _log_refusal("adapter", call, name, exc)
        try:
            await self._core.record_refusal(context=call.signed_for(HOST_CALL), operation=name, error=exc)
        except EngramError as failed:
            logger.warning("refusal not audited: tool=%s audit_id=%s code=%s", name, call.audit_id, failed.code.value)
        return envelope.trusted_context_unavailable(_MISMATCHED.get(reason))

    async def _call_straight(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams, name: str,
                        arguments: Any, call: CallContext, state: _CallState | None,
                        ) -> types.CallToolResult | types.InputRequiredResult:
        """A call sent without asking for the tool list first: search and get always, capture and
        request_admission once the binding's last list granted them without a confirmation. The
        core authorizes the call with the same policy, so the list (a second gRPC round trip,
        ~2.5 ms of an MCP search, ~3 ms of a write) only tells a refusal from a tool that must
        look unknown, and is asked only on failure. Every answer is the one the list-first order
        gives; a write gated since the last list reaches the core without a grant once, is
        refused there (audited) and goes on to the human, as a capture only its policy gates does."""
        try:
            validate_arguments(name, arguments)
        except EngramError as exc:
            return await self._unless_ungranted(name, call) or await self._refuse(call, name, exc)
        if _purpose_mismatch(name, arguments, call.binding.purpose_ref):
            refused = await self._unless_ungranted(name, call)
            if refused is not None:
                return refused
            raise await self._protocol_refusal(call, name, "PURPOSE_MISMATCH")
        try:
            value = await self._invoke(name, arguments, call)
        except EngramError as exc:
            refused = await self._unless_ungranted(name, call)
            if refused is not None:
                return refused
            if name in CONFIRMED_ON_POLICY and (exc.code is Code.GATE_FAILED or exc.confirmation_required):
                return await self._confirm_then_invoke(ctx, params, name, arguments, call, state)
            return self._core_refused(call, name, exc, arguments)
        return envelope.success(value, audit_id=call.audit_id)

    async def _unless_ungranted(self, name: str, call: CallContext) -> types.CallToolResult | None:
        return (await self._check_granted(name, call))[0]

    async def _check_granted(self, name: str, call: CallContext) -> tuple[types.CallToolResult | None, frozenset[str]]:
        """(the failure envelope if the tool list itself was refused, else None; the gated tools).
        Raises unknown tool if ``name`` is not granted: an ungranted tool looks like no tool."""
        try:
            granted, gated = await self._granted(call)
        except EngramError as exc:
            return self._core_refused(call, name, exc), frozenset()
        if name not in granted:
            raise envelope.unknown_tool()
        return None, gated

    async def _confirm_then_invoke(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        name: str,
        arguments: dict[str, Any],
        call: CallContext,
        state: _CallState | None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        b = call.binding
        digest = operation_digest(
            tool=name, tenant=b.tenant, workspace=b.workspace, principal=b.principal, arguments=arguments
        )
        target = target_of(name, arguments)

        def gate_failed(reason_class: str, reason: str) -> Any:
            return self._refuse(call, name, EngramError(Code.GATE_FAILED, reason.lower(), reason_class=reason_class,
                                                        reasons=(reason,)), target)

        first_leg = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or params.request_state is None
        if first_leg and name in ALWAYS_CONFIRMED:
            # Ask nobody about a target that is not there (or cannot make this transition): the
            # core answers what the tool itself would, audited as that tool's refusal.
            try:
                status = await self._following_epoch(
                    call, lambda c: self._core.check_gated(name, arguments, context=c), HOST_CALL)
            except EngramError as exc:
                return self._core_refused(call, name, exc)
            if status == "replay":
                # SPEC §7: the same key and arguments as a committed withdraw or forget (a retry after
                # MUTATION_OUTCOME_UNKNOWN, say). Its stored outcome is the answer and changes
                # nothing, so no human is asked again (issue 26.8): a decline now would tell the
                # agent "nothing was changed" about a record already forgotten.
                try:
                    value = await self._invoke(name, arguments, call)
                except EngramError as exc:
                    return self._core_refused(call, name, exc)
                return envelope.success(value, audit_id=call.audit_id)
        if self._url is not None and self._url.applies(ctx, params, name, _can_elicit_form(ctx)):
            try:
                outcome = await self._url.confirm(ctx, params, name, arguments, call, digest, target,
                                                  lambda rpc: self._following_epoch(call, rpc, HOST_CALL))
            except EngramError as exc:
                return self._core_refused(call, name, exc)
            if isinstance(outcome, types.InputRequiredResult):
                if state is not None:
                    state.asked_confirmation = True
                return outcome
            if outcome is not None:
                return await gate_failed(*outcome)
            return await self._invoke_confirmed(name, arguments, call, digest)
        if first_leg and not _can_elicit_form(ctx):
            return await gate_failed("cannot_elicit", "ELICITATION_UNSUPPORTED")

        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            if params.request_state is None:
                nonce = self._ledger.open(
                    PendingConfirmation(
                        tool=name,
                        operation_digest=digest,
                        scope_principal=(b.tenant, b.workspace, b.principal),
                        expires_at_ms=now_ms() + self._confirmation_timeout_ms,
                        asker=call.asker,
                    )
                )
                if state is not None:
                    state.asked_confirmation = True
                request = types.ElicitRequest(
                    params=types.ElicitRequestFormParams(
                        message=confirmation_message(name, target, arguments, b),
                        requested_schema=REQUESTED_SCHEMA,
                    )
                )
                return types.InputRequiredResult(
                    input_requests={CONFIRM_KEY: request}, request_state=encode_state(nonce, digest)
                )
            refusal = self._round_trip_refusal(params, name, digest, call)
            if refusal is not None:
                return await gate_failed(*refusal)
        else:
            try:
                with anyio.fail_after(self._confirmation_timeout_ms / 1000):
                    answer = await ctx.session.elicit_form(
                        confirmation_message(name, target, arguments, b),
                        REQUESTED_SCHEMA,
                        related_request_id=ctx.request_id,
                    )
            except TimeoutError:
                return await gate_failed("timed_out", "CONFIRMATION_TIMED_OUT")
            except MCPError:
                return await gate_failed("cannot_elicit", "ELICITATION_FAILED")
            if not approved(answer.action, answer.content):
                return await gate_failed("declined", "CONFIRMATION_DECLINED")
        return await self._invoke_confirmed(name, arguments, call, digest)

    async def _invoke_confirmed(self, name: str, arguments: dict[str, Any], call: CallContext,
                                digest: str) -> types.CallToolResult:
        """The call after a human approved this exact operation: under a grant the adapter signs."""
        try:
            value = await self._invoke(name, arguments, call, confirmed_digest=digest)
        except EngramError as exc:
            return self._core_refused(call, name, exc, arguments)
        return envelope.success(value, audit_id=call.audit_id)

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
        pending = self._ledger.consume(nonce, now_ms=now_ms(), asker=call.asker)
        b = call.binding
        if (
            pending is None
            or pending.tool != name
            or pending.operation_digest != digest
            or state_digest != digest
            or pending.scope_principal != (b.tenant, b.workspace, b.principal)
            # Only the authenticated caller who was asked can answer (the ledger keeps the nonce
            # for them): another token of the same principal, or none, cannot finish it.
            or pending.asker != call.asker
        ):
            return invalid
        response = (params.input_responses or {}).get(CONFIRM_KEY)
        action = getattr(response, "action", None)
        content = getattr(response, "content", None)
        if isinstance(action, str) and approved(action, content):
            return None
        return "declined", "CONFIRMATION_DECLINED"

    # ---- error mapping middleware ----------------------------------------------

    async def map_confirmation_errors(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Turn the SDK's confirmation failures into gate_failed envelopes (MCP_NOTES.md).

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
            call = state.call or self._context(ctx, tool)
            result = await self._refuse(call, tool, EngramError(
                Code.GATE_FAILED, "confirmation state", reason_class="confirmation_invalid",
                reasons=("CONFIRMATION_STATE_INVALID",)))
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                dumped.pop("resultType", None)
            return dumped
        finally:
            _CALL_STATE.reset(token)

    # ---- guide as prompt and resource ------------------------------------------

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[
                types.Prompt(
                    name=GUIDE_PROMPT_NAME,
                    title="How to use Engram memory",
                    description="When to use memory, the discipline, and how to read results and errors.",
                )
            ]
        )

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if params.name != GUIDE_PROMPT_NAME:
            raise MCPError(code=types.INVALID_PARAMS, message="Unknown prompt")
        return types.GetPromptResult(
            description="How to use Engram memory",
            messages=[
                types.PromptMessage(
                    role="user", content=types.TextContent(type="text", text=self._guide_for(ctx))
                )
            ],
        )

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=GUIDE_RESOURCE_URI,
                    name="engram-guide",
                    title="How to use Engram memory",
                    mime_type="text/markdown",
                )
            ]
        )

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        """None: the guide is one fixed resource. Answered, not -32601, so inspectors do not
        print an error for a server that has resources (issue 60)."""
        return types.ListResourceTemplatesResult(resource_templates=[])

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if str(params.uri) != GUIDE_RESOURCE_URI:
            raise MCPError(code=types.INVALID_PARAMS, message="Unknown resource")
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=GUIDE_RESOURCE_URI, mime_type="text/markdown", text=self._guide_for(ctx)
                )
            ]
        )

    def _guide_for(self, ctx: ServerRequestContext[Any, Any]) -> str:
        """The guide naming the purpose bound to this request, when one can be read."""
        purpose = self._contexts.bound_purpose
        if purpose is None:
            try:
                purpose = self._contexts.for_request(_headers(ctx), _access_token(ctx)).binding.purpose_ref or None
            except ContextUnavailable:
                purpose = None
        return guide(purpose)
