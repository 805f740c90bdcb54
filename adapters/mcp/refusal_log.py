"""The adapter's one line per refusal (logger ``engram.mcp.refusal``), in every log setup.

The agent sees a constant message; this line is where an operator reads the exact reason:
who decided it, the tool, the scope, the principal, the audit id (which joins it to the
audit row and the core's call line), the code, the class, the reason codes and the JSON
pointer. In text logs the fields are ``key=value`` pairs of the message; with
``--log-format json`` they are top-level fields of the JSON line, so a log pipeline can
filter on them. Never input values: the fields are identifiers and catalogue values only.
"""

from __future__ import annotations

import logging
from typing import Any

from adapters.mcp.binding import CallContext
from engram_core.contract.errors import EngramError
from engram_core.observability.logs import log_with_fields

refusal_log = logging.getLogger("engram.mcp.refusal")


def _fields(event: str, call: CallContext, exc: EngramError, **head: str) -> dict[str, Any]:
    b = call.binding
    return {"event": event, **head, "tenant": b.tenant, "workspace": b.workspace, "principal": b.principal,
            "audit_id": call.audit_id, **exc.log_fields()}


def _text(summary: str, fields: dict[str, Any]) -> str:
    return summary + "".join(f" {k}={v}" for k, v in fields.items() if k != "event")


def log_call_refusal(decided_by: str, call: CallContext, tool: str, exc: EngramError,
                     hints: dict[str, str] | None = None) -> None:
    """A ``tools/call`` refused by the adapter (``decided_by=adapter``) or the core (``core``).
    ``hints``: fields the adapter adds after the reason (e.g. ``likely_unit_mistake``: pointers and
    unit names, never values)."""
    fields = {**_fields("call_refused", call, exc, decided_by=decided_by, tool=tool), **(hints or {})}
    log_with_fields(refusal_log, logging.INFO, _text("call refused:", fields), fields)


def log_list_refusal(call: CallContext, exc: EngramError) -> None:
    """A ``tools/list`` the core did not answer with a tool list."""
    fields = _fields("tools_list_refused", call, exc)
    log_with_fields(refusal_log, logging.INFO, _text("tools/list refused:", fields), fields)
