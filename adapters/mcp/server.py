"""The MCP server agents talk to (SPEC §1–§3, §5, §8).

A translator and host-side guard on the low-level SDK server: it lists the
tools the policy grants the binding, serves the guide, and hands every tool
call to the one pipeline (``adapters.mcp.pipeline``: validation, the purpose
check, the confirmation step, the call to the core over gRPC with the signed
host context, the envelope). It stores nothing and decides nothing a policy
decides.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError

from adapters.mcp import envelope
from adapters.mcp.confirmation import ConfirmationLedger, InMemoryConfirmationLedger
from adapters.mcp.confirmation_step import ConfirmationStep
from adapters.mcp.core_client import CoreClient
from adapters.mcp.guidance import GUIDE_PROMPT_NAME, GUIDE_RESOURCE_URI, TOOL_DESCRIPTIONS, TOOL_TITLES, guide
from adapters.mcp.host_context import ContextSource, ContextUnavailable
from adapters.mcp.pipeline import ToolCallPipeline, access_token, request_headers
from adapters.mcp.refusal_log import log_list_refusal
from engram_core.contract.errors import EngramError
from engram_core.contract.schema_examples import EXAMPLE_PURPOSE
from engram_core.contract.schemas import INPUT_SCHEMAS, output_schema
from engram_core.contract.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    FORGET_TOOL,
    GET_TOOL,
    SEARCH_TOOL,
    TOOL_NAMES,
    WITHDRAW_TOOL,
)

SERVER_NAME = "engram"
SERVER_VERSION = "0.1.0"

_STATE_TTL_S = 300.0  # SPEC §8: a confirmation lives at most 300 s
_GUIDE_TITLE = "How to use Engram memory"  # the guide's title as prompt and as resource

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
        confirmation = ConfirmationStep(core, ledger or InMemoryConfirmationLedger(), confirmation_timeout_ms,
                                        console_url)
        self._pipeline = ToolCallPipeline(core=core, contexts=contexts, signing_key=signing_key,
                                          confirmation=confirmation)

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
            on_call_tool=self._pipeline.call_tool,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
            on_list_resources=self.list_resources,
            on_read_resource=self.read_resource,
            on_list_resource_templates=self.list_resource_templates,
        )
        # Outermost first: the observer sees final answers, our mapping the boundary's rejections.
        if self._observer is not None:
            server.middleware.append(self._observer)
        server.middleware.append(self._pipeline.map_confirmation_errors)
        server.middleware.append(
            RequestStateBoundary(
                RequestStateSecurity.ephemeral(ttl=_STATE_TTL_S), default_audience=SERVER_NAME
            )
        )
        return server

    # ---- tools ---------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        call = self._pipeline.context(ctx)
        try:
            granted, _ = await self._pipeline.granted(call)
        except EngramError as exc:
            # The agent sees only a JSON-RPC error, so this line is where an operator learns why
            # (e.g. the core stopped after start-up).
            log_list_refusal(call, exc)
            if exc.retriable:  # a core not answering is transient: say retry, not stop
                raise envelope.temporarily_unavailable(exc) from None
            raise envelope.trusted_context_unavailable() from None
        return types.ListToolsResult(tools=[tool_definition(name, call.binding.purpose_ref)
                                            for name in TOOL_NAMES if name in granted])

    # ---- guide as prompt and resource ------------------------------------------

    async def list_prompts(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(
            name=GUIDE_PROMPT_NAME, title=_GUIDE_TITLE,
            description="When to use memory, the discipline, and how to read results and errors.")])

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if params.name != GUIDE_PROMPT_NAME:
            raise MCPError(code=types.INVALID_PARAMS, message="Unknown prompt")
        return types.GetPromptResult(description=_GUIDE_TITLE, messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=self._guide_for(ctx)))])

    async def list_resources(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(
            uri=GUIDE_RESOURCE_URI, name="engram-guide", title=_GUIDE_TITLE, mime_type="text/markdown")])

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
                purpose = self._contexts.for_request(request_headers(ctx), access_token(ctx)).binding.purpose_ref or None
            except ContextUnavailable:
                purpose = None
        return guide(purpose)
