"""The adapter's share of operability: one observation per ``tools/call`` (a log line, the
``engram_mcp_tool_*`` metrics, and the trace's root span, whose context the gRPC client
interceptor carries to the core as W3C ``traceparent``). Installed as the outermost MCP
middleware, so it sees the final answer. Tool names outside the six are labelled ``unknown``
(they come from the client); arguments are never looked at."""

from __future__ import annotations

import logging
import time
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError

from adapters.mcp import envelope
from engram_core.contract.tools import TOOL_NAMES
from engram_core.observability import tracing
from engram_core.observability.logs import log_with_fields
from engram_core.observability.metrics import AdapterMetrics

log = logging.getLogger("engram.mcp.call")


def outcome_of(result: Any) -> tuple[str, str]:
    """(outcome code, audit id) of a tools/call answer: the envelope's, a confirmation round
    trip's ``input_required``, or OK."""
    if isinstance(result, dict):
        structured = result.get("structuredContent")
        result_type = result.get("resultType")
    else:
        structured = getattr(result, "structured_content", None)
        result_type = getattr(result, "result_type", None)
    if result_type == "input_required" or type(result).__name__ == "InputRequiredResult":
        return "input_required", ""
    if isinstance(structured, dict):
        audit_id = str(structured.get("auditId", ""))
        if structured.get("ok") is False:
            return str(structured.get("error", {}).get("code", "UNKNOWN")), audit_id
        return "OK", audit_id
    return "OK", ""


def _protocol_code(exc: MCPError) -> str:
    if exc.message == envelope.TRUSTED_CONTEXT_UNAVAILABLE:
        return "TRUSTED_CONTEXT_UNAVAILABLE"
    if exc.message == envelope.UNKNOWN_TOOL:
        return "UNKNOWN_TOOL"
    return f"JSONRPC_{exc.code}"


class ToolCallObserver:
    """MCP middleware: observes ``tools/call`` only; every other request passes untouched."""

    def __init__(self, metrics: AdapterMetrics | None) -> None:
        self._metrics = metrics

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call":
            return await call_next(ctx)
        name = (ctx.params or {}).get("name")
        tool = name if isinstance(name, str) and name in TOOL_NAMES else "unknown"
        started = time.perf_counter()
        code, audit_id = "INTERNAL", ""
        with tracing.server_span(f"tools/call {tool}", **{"mcp.method.name": "tools/call", "gen_ai.tool.name": tool}):
            try:
                result = await call_next(ctx)
                code, audit_id = outcome_of(result)
                tracing.set_attributes(**{"engram.outcome": code, "engram.audit_id": audit_id})
                return result
            except MCPError as exc:
                code = _protocol_code(exc)
                tracing.set_attributes(**{"engram.outcome": code})
                raise
            finally:
                seconds = time.perf_counter() - started
                if self._metrics is not None:
                    self._metrics.observe(tool, code, seconds)
                if log.isEnabledFor(logging.INFO):
                    fields = {"event": "tool_call", "tool": tool, "outcome": code, "audit_id": audit_id,
                              "duration_ms": round(seconds * 1000, 3)}
                    log_with_fields(log, logging.INFO, f"{tool} outcome={code} audit={audit_id or '-'} "
                                    f"{fields['duration_ms']}ms", fields)
