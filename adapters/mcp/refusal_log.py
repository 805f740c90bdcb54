"""The adapter's one line per refusal (logger ``engram.mcp.refusal``), in every log setup.

The agent sees a constant message; this line is where an operator reads the exact reason:
who decided it, the tool, the scope, the principal, the audit id (which joins it to the
audit row and the core's call line), the code, the class, the reason codes and the JSON
pointer. In text logs the fields are ``key=value`` pairs of the message; with
``--log-format json`` they are top-level fields of the JSON line, so a log pipeline can
filter on them. Never input values: the fields are identifiers and catalogue values only.

Also here: the hints a refused capture's line may add (:func:`time_unit_hint`), and the warning
(logger ``engram.mcp``) for an adapter refusal whose audit row could not be written.
"""

from __future__ import annotations

import logging
from typing import Any

from adapters.mcp.host_context import CallContext
from engram_core.contract.errors import EngramError
from engram_core.contract.tools import CAPTURE_TOOL
from engram_core.observability.logs import log_with_fields

refusal_log = logging.getLogger("engram.mcp.refusal")
_adapter_log = logging.getLogger("engram.mcp")

# The capture refusals for payload times outside the host's window (capture policy, issue 26.5).
_TIME_CLASSES = frozenset({"time_before_floor", "time_beyond_horizon"})
_TIME_POINTERS = (("/payload/valid_time/t", ("valid_time", "t")), ("/payload/valid_time/t_end", ("valid_time", "t_end")),
                  ("/payload/primary_event/at", ("primary_event", "at")))


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


def log_unaudited(tool: str, call: CallContext, failed: EngramError) -> None:
    """An adapter refusal whose audit row the core could not write (the agent is told so)."""
    _adapter_log.warning("refusal not audited: tool=%s audit_id=%s code=%s", tool, call.audit_id, failed.code.value)


def _likely_unit(value: int) -> str:
    """The unit an epoch time of this size was most likely written in, if not milliseconds."""
    if 10**8 <= abs(value) < 10**11:
        return "seconds"  # 1973 .. 5138 in seconds; 1970-01-02 .. 1973 read as milliseconds
    if abs(value) >= 10**14:
        return "microseconds"  # 1973 onwards in microseconds; year 5138 onwards read as milliseconds
    return ""


def time_unit_hint(tool: str, arguments: Any, exc: EngramError) -> dict[str, str]:
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
