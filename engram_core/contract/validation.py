"""Closed-schema validation of tool arguments (SPEC §4–5), for core and adapter.

Order: size of the serialized arguments, JSON Schema (fastjsonschema, compiled
once), then what JSON Schema cannot say: exact UTF-8 byte bounds, NFC, real
instants, t_end ≥ t, sorted family refs, and the capture cross-references.
Failures raise ``EngramError(INVALID_SCHEMA)`` or ``INVALID_DIGEST`` (a digest
field with the wrong format) with a reason class (the constant message the caller
sees, ``engram_core.contract.errors.REFUSALS``) and a JSON pointer for logs and the audit
row. The pointer names only properties the schemas define and array indices, never
a name the caller made up: the parent object of an unknown field, not the field.
The first failure found is reported; the order above decides which.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
import unicodedata
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Any

import fastjsonschema
import jsonschema

from engram_core.contract.canonical import SAFE_INTEGER, Canonical, canonical_object
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.schemas import ENFORCED_SCHEMAS, MAX_ARGUMENT_BYTES
from engram_core.contract.tools import CAPTURE_TOOL
from engram_core.observability.tracing import traced

# The published input schemas with their shared definitions ($defs) inlined: the walkers below
# read properties and items directly, and the bounds are exactly the published ones.
INPUT_SCHEMAS = ENFORCED_SCHEMAS

_VALIDATORS = {name: fastjsonschema.compile(schema) for name, schema in INPUT_SCHEMAS.items()}
# Only on the failure path: every error with its path and keyword, to name the reason.
_EXPLAINERS = {name: jsonschema.Draft202012Validator(schema) for name, schema in INPUT_SCHEMAS.items()}


def _schema_names(schema: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                names.update(value)
            if key != "examples":
                names |= _schema_names(value)
    elif isinstance(schema, list):
        for item in schema:
            names |= _schema_names(item)
    return names


_KNOWN_NAMES = frozenset(set().union(*(_schema_names(s) for s in INPUT_SCHEMAS.values())))

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
# The refusal class of a length failure, per field, so the message names the bound broken
# (engram_core.contract.errors.REFUSALS). Ids have one exact shape: a wrong length is a wrong format.
_LENGTH_CLASSES: dict[str, str] = {
    "query": "query_length",
    "text": "text_length",
    "attestation": "attestation_length",
    "idempotency_key": "idempotency_key_length",
    "page_cursor": "page_cursor_length",
    "record_id": "record_id_format",
    "candidate_id": "candidate_id_format",
    **{name: "ref_length" for name in (*_REF_FIELDS, "citation_ids", "family_refs")},
}


# The refusal class of a range (minimum/maximum, minItems/maxItems) or pattern failure, per field,
# so the message names the field and its bound; others keep the generic class.
_RANGE_CLASSES: dict[str, str] = {
    "limit": "limit_out_of_range",
    "max_packet_bytes": "max_packet_bytes_out_of_range",
    "t": "time_out_of_range",
    "t_end": "time_out_of_range",
    "at": "time_out_of_range",
    "components": "components_count",
    "citations": "citations_count",
    "citation_ids": "citation_ids_count",
    "family_refs": "family_refs_count",
}
_FORMAT_CLASSES: dict[str, str] = {
    "record_id": "record_id_format",
    "candidate_id": "candidate_id_format",
    "expires_at": "instant_format",
    "observed_at": "instant_format",
}


def _named_class(path: Any, classes: dict[str, str], generic: str) -> str:
    """The class named by the failing field (the last property name on ``path``), else ``generic``."""
    field = next((part for part in reversed(list(path)) if isinstance(part, str)), "")
    return classes.get(field, generic)


def _length_class(path: Any) -> str:
    """The class of a length failure at ``path``: named by the nearest property (list items
    by their list's name); a field without a class of its own gets the generic one."""
    field = next((part for part in reversed(list(path)) if isinstance(part, str)), "")
    return _LENGTH_CLASSES.get(field, "length_out_of_range")


def pointer(path: Any) -> str:
    """A JSON pointer of ``path`` naming schema properties and indices only ('*' for anything else)."""
    parts = []
    for part in path:
        if isinstance(part, int):
            parts.append(str(part))
        elif isinstance(part, str) and part in _KNOWN_NAMES:
            parts.append(part.replace("~", "~0").replace("/", "~1"))
        else:
            parts.append("*")
    return "".join("/" + p for p in parts)


def rebuild_pointer(text: str) -> str:
    """A pointer received from elsewhere (a host), rebuilt with ``pointer``: unknown names become '*'."""
    if not text:
        return ""
    parts: list[Any] = []
    for raw in text.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        parts.append(int(part) if part.isdigit() and len(part) < 10 else part)
    return pointer(parts)


def _fail(detail: str, reason_class: str, path: Any = (), code: Code = Code.INVALID_SCHEMA) -> EngramError:
    return EngramError(code, detail, reason_class=reason_class, reasons=(reason_class,), pointer=pointer(path))


def _check_strings(value: Any, key: str | None, path: list[Any]) -> None:
    if len(path) > _MAX_DEPTH:
        raise _fail("nesting too deep", "too_deep", path[:_MAX_DEPTH])
    if isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("not valid UTF-8", "not_nfc", path) from None
        if not unicodedata.is_normalized("NFC", value):
            raise _fail("string is not NFC", "not_nfc", path)
        bounds = _BYTE_BOUNDS.get(key or "")
        if bounds and not (bounds[0] <= len(encoded) <= bounds[1]):
            raise _fail(f"{key} byte length out of bounds", _length_class(path), path)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise _fail("non-string key", "wrong_type", path)
            _check_strings(k, None, path)
            _check_strings(v, k, [*path, k])
    elif isinstance(value, list):
        for i, item in enumerate(value):
            # array items inherit the property name (citation_ids, family_refs)
            _check_strings(item, "citation_id" if key in ("citation_ids", "family_refs") else None, [*path, i])
    elif isinstance(value, float):
        raise _fail("numbers must be integers", "not_integer", path)
    elif value is None:
        raise _fail("null is never valid", "null_value", path)


def parse_instant(text: str) -> int:
    """Epoch milliseconds of a contract instant, or INVALID_SCHEMA if not a real date."""
    try:
        parsed = _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC)
    except ValueError:
        raise _fail("not a real instant", "instant_invalid") from None
    return int(parsed.timestamp() * 1000 + 0.5) if parsed.microsecond % 1000 == 0 else _reject_precision()


def _reject_precision() -> int:
    raise _fail("instant must have exactly milliseconds", "instant_invalid")


_LAST_INSTANT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last instant datetime can hold


def format_instant(ms: int) -> str:
    """The contract instant of epoch milliseconds ``ms``. A read formats one per record and
    receipt: for years 1970–9999, ``time.gmtime`` and integer arithmetic write the same text as
    the ``datetime`` path below (which raises outside what it can hold), a few times faster."""
    if 0 <= ms <= _LAST_INSTANT_MS:
        t = time.gmtime(ms // 1000)
        return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
                f"{ms % 1000:03d}Z")
    dt = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _check_capture(args: dict[str, Any]) -> None:
    payload, evidence = args["payload"], args["evidence"]
    vt = payload["valid_time"]
    if "t_end" in vt and vt["t_end"] < vt["t"]:
        raise _fail("valid_time.t_end before t", "time_order", ["payload", "valid_time", "t_end"])
    citation_ids = [c["citation_id"] for c in payload["citations"]]
    if len(set(citation_ids)) != len(citation_ids):
        raise _fail("duplicate citation_id", "duplicate_id", ["payload", "citations"])
    known = set(citation_ids)
    component_ids = [c["component_id"] for c in payload["components"]]
    if len(set(component_ids)) != len(component_ids):
        raise _fail("duplicate component_id", "duplicate_id", ["payload", "components"])
    for i, comp in enumerate(payload["components"]):
        if not set(comp["citation_ids"]) <= known:
            raise _fail("component citation does not resolve", "citation_unresolved",
                        ["payload", "components", i, "citation_ids"])
    primary = next((c for c in payload["components"] if c["component_id"] == payload["primary_component_id"]), None)
    if primary is None:
        raise _fail("primary_component_id does not resolve", "primary_unresolved", ["payload", "primary_component_id"])
    event_cid = payload["primary_event"]["citation_id"]
    if event_cid not in known or event_cid not in primary["citation_ids"]:
        raise _fail("primary_event.citation_id does not resolve", "primary_unresolved",
                    ["payload", "primary_event", "citation_id"])
    if not set(evidence["citation_ids"]) <= known:
        raise _fail("evidence citation does not resolve", "citation_unresolved", ["evidence", "citation_ids"])
    for i, citation in enumerate(payload["citations"]):
        if "observed_at" in citation:
            _instant_at(citation["observed_at"], ["payload", "citations", i, "observed_at"])
    retention = payload.get("retention", {})
    if "expires_at" in retention:
        _instant_at(retention["expires_at"], ["payload", "retention", "expires_at"])
    families = payload.get("reconciliation", {}).get("family_refs", [])
    if families != sorted(families):
        raise _fail("family_refs not sorted", "families_unsorted", ["payload", "reconciliation", "family_refs"])


def _instant_at(text: str, path: list[Any]) -> None:
    try:
        parse_instant(text)
    except EngramError as exc:
        exc.pointer = pointer(path)
        raise


# jsonschema keyword -> reason class of the failure
_KEYWORD_CLASS = {
    "additionalProperties": "unknown_field",
    "required": "missing_field",
    "type": "wrong_type",
    "enum": "value_not_allowed",
    "const": "value_not_allowed",
    "minimum": "out_of_range",
    "maximum": "out_of_range",
    "minItems": "out_of_range",
    "maxItems": "out_of_range",
    "minLength": "length_out_of_range",
    "maxLength": "length_out_of_range",
    "anyOf": "length_out_of_range",  # idempotency_key: at least 16 bytes (schemas._idempotency_key)
    "pattern": "format",
    "uniqueItems": "duplicate_items",
}
# Which error to report when several apply: a misspelt field is both unknown and missing;
# "check the spelling" helps more than "a field is missing".
_KEYWORD_RANK = {k: i for i, k in enumerate(_KEYWORD_CLASS)}


def _explain(tool: str, args: dict[str, Any]) -> EngramError:
    """The reason class and pointer of a schema failure (fastjsonschema only says it failed)."""
    schema = INPUT_SCHEMAS[tool]
    if not any(name in args for name in schema["required"]):
        return _fail("no required field present", "wrong_shape")
    errors = list(_EXPLAINERS[tool].iter_errors(_pruned(args, [schema])))
    if not errors:  # the two engines disagree: still a refusal, just without a class
        return EngramError(Code.INVALID_SCHEMA, "schema", pointer="")
    err = min(errors, key=lambda e: (_KEYWORD_RANK.get(str(e.validator), len(_KEYWORD_RANK)), -len(e.absolute_path)))
    keyword = str(err.validator)
    path = list(err.absolute_path)
    if keyword == "pattern" and path and isinstance(path[-1], str) and path[-1].endswith("_digest"):
        return _fail(f"{path[-1]}: digest format", "format", path, Code.INVALID_DIGEST)
    reason_class = _KEYWORD_CLASS.get(keyword, "")
    if reason_class == "length_out_of_range":
        reason_class = _length_class(path)
    elif reason_class == "out_of_range":
        reason_class = _named_class(path, _RANGE_CLASSES, reason_class)
    elif reason_class == "format":
        reason_class = _named_class(path, _FORMAT_CLASSES, reason_class)
    return _fail(f"schema keyword {keyword}", reason_class, path)


def _max_items(node: Any) -> int:
    if isinstance(node, dict):
        return max([int(node.get("maxItems", 0)), *map(_max_items, node.values())])
    if isinstance(node, list):
        return max(map(_max_items, node), default=0)
    return 0


# Lists are cut before an explanation is asked for: the pure-Python explainer walks every item of
# every list, nested lists included (an extra field beside a 5000-item list cost 0.7 s of CPU; 257
# components of 257 citation ids each, a 460 kB request, 0.46 s). A list where the schema has an
# array keeps one item more than that array's maxItems (so a list too long stays too long and
# every item the schema allows is still checked); a list where the schema has none (a wrong type,
# an unknown field) is never looked into by the explainer and keeps one item. Without a bound in
# the schema a list keeps ``_EXPLAIN_ITEMS``.
_EXPLAIN_ITEMS = _max_items(INPUT_SCHEMAS) + 1


def _alternatives(schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``schemas`` and, recursively, their ``anyOf`` alternatives: every schema an instance at
    that place is checked against."""
    out: list[dict[str, Any]] = []
    for schema in schemas:
        out.append(schema)
        out += _alternatives([s for s in schema.get("anyOf", ()) if isinstance(s, dict)])
    return out


def _member_schema(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    """What ``schema`` checks a member ``key`` of an object against, if anything."""
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _pruned(value: Any, schemas: list[dict[str, Any]]) -> Any:
    """``value`` with its lists cut as the explainer needs them (above), ``schemas`` being what
    the schema checks at its place."""
    here = _alternatives(schemas)
    if isinstance(value, dict):
        return {k: _pruned(v, [m for s in here if (m := _member_schema(s, k)) is not None]) for k, v in value.items()}
    if isinstance(value, list):
        arrays = [s for s in here if "items" in s or "maxItems" in s]
        if not arrays:
            return [_pruned(v, []) for v in value[:1]]
        bound = max(int(s["maxItems"]) + 1 if "maxItems" in s else _EXPLAIN_ITEMS for s in arrays)
        items = [s["items"] for s in arrays if isinstance(s.get("items"), dict)]
        return [_pruned(v, items) for v in value[:bound]]
    return value


class _Recheck(Exception):
    """The one-pass check found something wrong: ``validate_arguments`` says what, in its order."""


def _checked(value: Any, key: str | None, depth: int, keep: int, budget: list[int]) -> Canonical:
    """``value``'s canonical form, checked on the way as ``_check_strings`` checks it (NFC, byte
    bounds, depth, no floats, no nulls), in one walk. ``keep``: object levels whose members stay
    Canonicals of their own. Raises _Recheck on anything ``_check_strings`` would refuse, and as
    soon as the arguments are certainly over the size bound: ``budget`` counts down a lower bound
    of the bytes written (a string's characters, two per item or member), so a request too large
    costs at most the walk of one as large as allowed before ``validate_arguments`` refuses it."""
    if keep > 0 and type(value) is dict and depth <= _MAX_DEPTH:
        members: dict[str, Canonical] = {}
        for k, v in value.items():
            if type(k) is not str or not unicodedata.is_normalized("NFC", k):
                raise _Recheck
            members[k] = _checked(v, k, depth + 1, keep - 1, budget)
        return canonical_object(members)
    out: list[str] = []
    _checked_walk(value, key, depth, out, budget)
    return Canonical(value, "".join(out))


def _checked_walk(value: Any, key: str | None, depth: int, out: list[str], budget: list[int]) -> None:
    budget[0] -= 2
    if depth > _MAX_DEPTH or budget[0] < 0:
        raise _Recheck
    t = type(value)
    if t is str:
        if not unicodedata.is_normalized("NFC", value):
            raise _Recheck
        bounds = _BYTE_BOUNDS.get(key or "")
        if bounds and not (bounds[0] <= len(value.encode("utf-8")) <= bounds[1]):
            raise _Recheck
        budget[0] -= len(value)
        if budget[0] < 0:
            raise _Recheck
        out.append(encode_basestring(value))
    elif t is dict:
        if not value:
            out.append("{}")
            return
        if any(type(k) is not str or not unicodedata.is_normalized("NFC", k) for k in value):
            raise _Recheck
        keys = sorted(value) if "".join(value).isascii() else sorted(value, key=lambda k: k.encode("utf-16-be"))
        sep = "{"
        for k in keys:
            out.append(sep)
            out.append(encode_basestring(k))
            out.append(":")
            budget[0] -= len(k)
            _checked_walk(value[k], k, depth + 1, out, budget)
            sep = ","
        out.append("}")
    elif t is list:
        if not value:
            out.append("[]")
            return
        item_key = "citation_id" if key in ("citation_ids", "family_refs") else None
        sep = "["
        for item in value:
            out.append(sep)
            _checked_walk(item, item_key, depth + 1, out, budget)
            sep = ","
        out.append("]")
    elif t is int and -SAFE_INTEGER <= value <= SAFE_INTEGER:
        out.append(str(value))
    elif t is bool:
        out.append("true" if value else "false")
    else:  # floats, nulls, integers canonical JSON cannot hold exactly, other types
        raise _Recheck


@traced("engram.validate")
def canonical_arguments(tool: str, args: Any) -> Canonical:
    """``validate_arguments`` and the arguments' canonical form (RFC 8785) in one walk.

    The core's one validation of a tool call (docs/architecture.md, "One request pipeline"):
    the returned Canonical keeps the members of the arguments and of their objects (the capture
    payload's), so that every digest and seal of the call splices them instead of serializing
    the arguments again. The size bound is measured on the canonical bytes: once every string
    is valid, the arguments hold no float and no null, and then their canonical form and the
    compact JSON ``validate_arguments`` measures have the same length. Anything the walk refuses
    goes to ``validate_arguments``, which answers with the same refusal, in the same order, as
    always."""
    validator = _validator_of(tool, args)
    try:
        body = _checked(args, None, 0, 2, [MAX_ARGUMENT_BYTES])
        size = len(body.data)
    except (_Recheck, UnicodeEncodeError, RecursionError):
        validate_arguments(tool, args)  # raises: the refusal this input has always had
        raise _fail("arguments are not canonical JSON", "wrong_type") from None
    _check_size(size)
    _check_schema(tool, validator, args)
    return body


def _validator_of(tool: str, args: Any) -> Any:
    """The tool's schema validator; the first two refusals every surface gives, in this order."""
    validator = _VALIDATORS.get(tool)
    if validator is None:
        raise _fail("unknown tool", "wrong_shape")
    if not isinstance(args, dict):
        raise _fail("arguments must be an object", "wrong_type")
    return validator


@traced("engram.validate")
def validate_arguments(tool: str, args: Any) -> dict[str, Any]:
    """Validate one tool's arguments; returns them unchanged (never normalized)."""
    validator = _validator_of(tool, args)
    try:
        size = len(json.dumps(args, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except (UnicodeEncodeError, ValueError, TypeError, RecursionError):
        raise _fail("arguments are not valid JSON text", "wrong_type") from None
    _check_size(size)
    _check_strings(args, None, [])
    _check_schema(tool, validator, args)
    return args


def _check_size(size: int) -> None:
    if size > MAX_ARGUMENT_BYTES:
        raise _fail("arguments too large", "too_large")


def _check_schema(tool: str, validator: Any, args: dict[str, Any]) -> None:
    """The tool's JSON Schema, then what a schema cannot say of a capture."""
    try:
        validator(args)
    except fastjsonschema.JsonSchemaValueException:
        raise _explain(tool, args) from None
    if tool == CAPTURE_TOOL:
        _check_capture(args)
