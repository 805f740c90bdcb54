"""Closed shapes of every decision object (SPEC §9).

A backend checks each answer against these before core sees it: a result of
the wrong shape is treated exactly like no answer (POLICY_UNAVAILABLE). Only
``obligations`` may carry keys the core does not know yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import fastjsonschema

from engram_core.policy import port

_REASONS: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"code": {"type": "string", "minLength": 1}, "message": {"type": "string"}},
        "required": ["code", "message"],
        "additionalProperties": False,
    },
}


def _closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


_TOOL_NAMES = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}

SCHEMAS: dict[str, dict[str, Any]] = {
    port.AUTHZ: _closed(
        {
            "allow": {"type": "boolean"},
            "reasons": _REASONS,
            "obligations": {
                "type": "object",
                "properties": {"confirmation_required": {"type": "boolean"}},
                "required": ["confirmation_required"],
                "additionalProperties": True,
            },
            # Present only on a denial that is a quota: RATE_LIMITED, retry after this long.
            "retry_after_ms": {"type": "integer", "minimum": 0},
        },
        required=["allow", "reasons", "obligations"],
    ),
    port.TOOLS: _closed({"tools": _TOOL_NAMES, "reasons": _REASONS}),
    port.CAPTURE: _closed(
        {
            "allow": {"type": "boolean"},
            "reasons": _REASONS,
            "retention": _closed(
                {
                    "derivative_rule": {"enum": ["retain", "make-ineligible"]},
                    "expires_at_ms": {"type": "integer"},
                },
                required=["derivative_rule"],
            ),
            "confirmation_required": {"type": "boolean"},
        }
    ),
    port.ADMISSION: _closed(
        {"decision": {"enum": ["accept", "reject", "duplicate", "adjudication_required"]}, "reasons": _REASONS}
    ),
    port.REDACTION: _closed(
        {
            "allow_fields": {
                "type": "array",
                "items": {"type": "string", "pattern": "^/"},
                "uniqueItems": True,
                "contains": {"const": "/record_id"},
            },
            "max_packet_bytes": {"type": "integer", "minimum": 1},
            "reasons": _REASONS,
        }
    ),
    port.RETENTION: _closed(
        {"allow": {"type": "boolean"}, "action": {"enum": ["expire", "none"]}, "reasons": _REASONS}
    ),
    port.RECONCILIATION: _closed(
        {
            "admission": {"enum": ["proceed", "adjudication_required"]},
            "members": {
                "type": "array",
                "items": _closed({"record_id": {"type": "string", "minLength": 1},
                                  "action": {"enum": ["keep", "supersede", "dispute"]}}),
            },
            "reasons": _REASONS,
        }
    ),
    port.BINDING: {
        "oneOf": [
            _closed({
                "allow": {"const": True},
                "binding": _closed({name: {"type": "string"} for name in
                                    ("tenant", "workspace", "principal", "agent_id", "purpose_ref")}),
                "tools": _TOOL_NAMES,
                "step_up": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
                "reasons": _REASONS,
            }),
            _closed({
                "allow": {"const": False},
                "tools": {"type": "array", "maxItems": 0},
                "step_up": {"type": "object", "maxProperties": 0},
                "reasons": _REASONS,
            }),
        ]
    },
    port.BINDING_SCOPES: _closed({"scopes": {"type": "array", "items": {"type": "string", "minLength": 1},
                                             "uniqueItems": True}, "reasons": _REASONS}),
}

_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    path: fastjsonschema.compile(schema) for path, schema in SCHEMAS.items()
}


def shape_error(path: str, result: Any) -> str | None:
    """Why ``result`` is not a well-formed answer for ``path`` (None when it is).

    An unknown path only has to be an object with a ``reasons`` list: every
    decision explains itself, and a bare boolean is never an answer.
    """
    validate = _VALIDATORS.get(path)
    if validate is None:
        if not isinstance(result, Mapping) or not isinstance(result.get("reasons"), list):
            return "decision is not an object with reasons"
        return None
    try:
        validate(result)
    except fastjsonschema.JsonSchemaException as exc:
        return f"decision does not match its shape: {exc.message}"
    return None
