"""Structured logs: one line per call (``engram.call``) and one per operational event
(``engram.event``: policy reloads, key rotations, restores, migrations, start-up, drain).

``--log-format text`` (default) keeps the classic ``time LEVEL logger message`` lines;
``--log-format json`` turns every log record of the process into one JSON object per line,
call and event records carrying their fields as top-level keys. Fields are identifiers, codes,
counts and durations only: never memory text, query text, arguments or secrets.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from engram_core.observability.calls import CallObservation

CALL_LOGGER = logging.getLogger("engram.call")
EVENT_LOGGER = logging.getLogger("engram.event")
LOG_FORMATS = ("text", "json")
_FIELDS = "engram_fields"  # LogRecord attribute carrying the structured fields
_json = False


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, _FIELDS, None) or {})
        if record.exc_info:
            doc["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else ""
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"), default=str)


def configure_logging(fmt: str = "text", *, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Route every log record of the process to ``stream`` (stderr) in ``fmt``."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}")
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    global _json
    _json = fmt == "json"
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def json_enabled() -> bool:
    """True once ``configure_logging("json")`` ran: then stderr must carry JSON lines only."""
    return _json


def notice(text: str, event: str, **fields: Any) -> None:
    """A start-up notice for the operator: the plain line on stderr, or a JSON event line."""
    if _json:
        log_event(event, summary=text, **fields)
    else:
        print(text, file=sys.stderr, flush=True)


def call_fields(obs: CallObservation, seconds: float) -> dict[str, Any]:
    revisions = sorted({d.revision for d in obs.decisions if d.revision})
    return {
        "event": "call",
        "operation": obs.operation,
        "tenant": obs.tenant,
        "workspace": obs.workspace,
        "principal": obs.principal,
        "agent_id": obs.agent_id,
        "audit_id": obs.audit_id,
        "outcome": obs.outcome,
        "reasons": sorted(obs.reasons),
        "reason_class": obs.reason_class,
        "pointer": obs.pointer,
        "decisions": [f"{d.family}:{d.outcome}" for d in obs.decisions],
        "policy_revision": revisions[0] if len(revisions) == 1 else revisions,
        "duration_ms": round(seconds * 1000, 3),
    }


def log_call(obs: CallObservation, seconds: float) -> None:
    # Failures that are not the caller's own mistake are worth a warning in any log setup.
    level = logging.WARNING if obs.code and obs.code not in _CALLER_CODES else logging.INFO
    if not CALL_LOGGER.isEnabledFor(level):
        return
    f = call_fields(obs, seconds)
    scope = f"{f['tenant']}/{f['workspace']}" if f["tenant"] else "-"
    text = (f"{f['operation']} {scope} principal={f['principal'] or '-'} audit={f['audit_id'] or '-'} "
            f"outcome={f['outcome']} reasons={','.join(f['reasons']) or '-'} "
            + (f"class={f['reason_class']} " if f["reason_class"] else "")
            + (f"pointer={f['pointer']} " if f["pointer"] else "")
            + f"{f['duration_ms']}ms")
    CALL_LOGGER.log(level, text, extra={_FIELDS: f})


def log_with_fields(logger: logging.Logger, level: int, text: str, fields: dict[str, Any]) -> None:
    """``text`` for text logs; ``fields`` as top-level keys of the JSON line."""
    logger.log(level, text, extra={_FIELDS: fields})


def log_event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """An operational event (``name``) with identifier/count fields, never content."""
    if not EVENT_LOGGER.isEnabledFor(level):
        return
    text = name + "".join(f" {k}={v}" for k, v in fields.items())
    EVENT_LOGGER.log(level, text, extra={_FIELDS: {"event": name, **fields}})


# Codes that answer the caller's own request (bad input, not allowed, not there): info, not warning.
_CALLER_CODES = frozenset({
    "INVALID_SCHEMA", "INVALID_DIGEST", "UNAUTHORIZED", "AUTHORIZATION_EXPIRED", "AUTHORIZATION_REVOKED",
    "NOT_FOUND", "DIGEST_CONFLICT", "ILLEGAL_TRANSITION", "ALREADY_TERMINAL", "gate_failed", "STALE_PAGE",
    "RESULT_TOO_LARGE", "PROJECTION_OVERSIZED", "CANCELLED", "DEADLINE_EXCEEDED", "RATE_LIMITED",
    "TRUSTED_CONTEXT_UNAVAILABLE", "CAPABILITY_UNAVAILABLE", "RESTORE_REFUSED", "BACKUP_INVALID",
})
