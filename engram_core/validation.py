"""Closed-schema validation of tool arguments (SPEC §4–5), for core and adapter.

Order: size of the serialized arguments, JSON Schema (fastjsonschema, compiled
once), then what JSON Schema cannot say: exact UTF-8 byte bounds, NFC, real
instants, t_end ≥ t, sorted family refs, and the capture cross-references.
Failures raise ``EngramError(INVALID_SCHEMA)`` or ``INVALID_DIGEST`` (a digest
field with the wrong format).
"""

from __future__ import annotations

import datetime as _dt
import json
import unicodedata
from typing import Any

import fastjsonschema

from engram_core.errors import Code, EngramError
from engram_core.observability.tracing import traced
from engram_core.schemas import INPUT_SCHEMAS, MAX_ARGUMENT_BYTES

_VALIDATORS = {name: fastjsonschema.compile(schema) for name, schema in INPUT_SCHEMAS.items()}

# Byte bounds by property name (the schema carries code-point bounds only).
_REF_FIELDS = frozenset(
    {
        "purpose_ref",
        "component_id",
        "primary_component_id",
        "citation_id",
        "source_ref",
        "evidence_ref",
        "reason_ref",
        "type_ref",
        "scheme",
        "value",
    }
)
_BYTE_BOUNDS: dict[str, tuple[int, int]] = {
    "query": (1, 8_192),
    "text": (1, 65_536),
    "attestation": (0, 4_096),
    "idempotency_key": (16, 256),
    **{name: (1, 512) for name in _REF_FIELDS},
}
_MAX_DEPTH = 16


def _fail(detail: str, code: Code = Code.INVALID_SCHEMA) -> EngramError:
    return EngramError(code, detail)


def _check_strings(value: Any, key: str | None, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise _fail("nesting too deep")
    if isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("not valid UTF-8") from None
        if not unicodedata.is_normalized("NFC", value):
            raise _fail("string is not NFC")
        bounds = _BYTE_BOUNDS.get(key or "")
        if bounds and not (bounds[0] <= len(encoded) <= bounds[1]):
            raise _fail(f"{key} byte length out of bounds")
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _fail("non-string key")
            _check_strings(k, None, depth + 1)
            _check_strings(v, k, depth + 1)
    elif isinstance(value, list):
        for item in value:
            # array items inherit the property name (citation_ids, family_refs)
            _check_strings(item, "citation_id" if key in ("citation_ids", "family_refs") else None, depth + 1)
    elif isinstance(value, float):
        raise _fail("numbers must be integers")
    elif value is None:
        raise _fail("null is never valid")


def parse_instant(text: str) -> int:
    """Epoch milliseconds of a contract instant, or INVALID_SCHEMA if not a real date."""
    try:
        parsed = _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC)
    except ValueError:
        raise _fail("not a real instant") from None
    return int(parsed.timestamp() * 1000 + 0.5) if parsed.microsecond % 1000 == 0 else _reject_precision()


def _reject_precision() -> int:
    raise _fail("instant must have exactly milliseconds")


def format_instant(ms: int) -> str:
    dt = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _check_capture(args: dict[str, Any]) -> None:
    payload, evidence = args["payload"], args["evidence"]
    vt = payload["valid_time"]
    if "t_end" in vt and vt["t_end"] < vt["t"]:
        raise _fail("valid_time.t_end before t")
    citation_ids = [c["citation_id"] for c in payload["citations"]]
    if len(set(citation_ids)) != len(citation_ids):
        raise _fail("duplicate citation_id")
    known = set(citation_ids)
    component_ids = [c["component_id"] for c in payload["components"]]
    if len(set(component_ids)) != len(component_ids):
        raise _fail("duplicate component_id")
    for comp in payload["components"]:
        if not set(comp["citation_ids"]) <= known:
            raise _fail("component citation does not resolve")
    primary = next((c for c in payload["components"] if c["component_id"] == payload["primary_component_id"]), None)
    if primary is None:
        raise _fail("primary_component_id does not resolve")
    event_cid = payload["primary_event"]["citation_id"]
    if event_cid not in known or event_cid not in primary["citation_ids"]:
        raise _fail("primary_event.citation_id does not resolve")
    if not set(evidence["citation_ids"]) <= known:
        raise _fail("evidence citation does not resolve")
    for citation in payload["citations"]:
        if "observed_at" in citation:
            parse_instant(citation["observed_at"])
    retention = payload.get("retention", {})
    if "expires_at" in retention:
        parse_instant(retention["expires_at"])
    families = payload.get("reconciliation", {}).get("family_refs", [])
    if families != sorted(families):
        raise _fail("family_refs not sorted")


@traced("engram.validate")
def validate_arguments(tool: str, args: Any) -> dict[str, Any]:
    """Validate one tool's arguments; returns them unchanged (never normalized)."""
    validator = _VALIDATORS.get(tool)
    if validator is None:
        raise _fail("unknown tool")
    if not isinstance(args, dict):
        raise _fail("arguments must be an object")
    try:
        size = len(json.dumps(args, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except (UnicodeEncodeError, ValueError, TypeError, RecursionError):
        raise _fail("arguments are not valid JSON text") from None
    if size > MAX_ARGUMENT_BYTES:
        raise _fail("arguments too large")
    _check_strings(args, None, 0)
    try:
        validator(args)
    except fastjsonschema.JsonSchemaValueException as exc:
        name = exc.name or ""
        if exc.rule == "pattern" and name.endswith("_digest"):
            raise _fail(f"{name}: digest format", Code.INVALID_DIGEST) from None
        raise _fail(f"{name}: {exc.rule}") from None
    if tool == "engram_memory_capture":
        _check_capture(args)
    return args
