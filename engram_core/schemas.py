"""The one source of the six tools' closed JSON Schemas (SPEC §4–5).

The core validates every request against these (``engram_core.validation``)
and the MCP adapter publishes them as ``inputSchema``/``outputSchema``.

JSON Schema counts code points, the contract counts UTF-8 bytes: the published
``maxLength`` equals the byte bound (a necessary condition) and the published
``minLength`` of byte-bounded strings is the smallest code-point count that can
reach the byte minimum; ``validation`` then checks exact byte sizes and NFC.
"""

from __future__ import annotations

from typing import Any

SAFE_INT = 2**53 - 1
MAX_ARGUMENT_BYTES = 1_048_576

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
RECORD_ID_PATTERN = r"^mem_[a-z2-7]{52}$"
INSTANT_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$"
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,19})$"

TOOL_NAMES: tuple[str, ...] = (
    "engram_memory_search",
    "engram_memory_get",
    "engram_memory_capture",
    "engram_memory_request_admission",
    "engram_memory_withdraw",
    "engram_memory_forget",
)


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _ref() -> dict[str, Any]:
    """Opaque ref: 1–512 UTF-8 bytes (byte bound checked in validation)."""
    return {"type": "string", "minLength": 1, "maxLength": 512}


def _text(max_bytes: int, min_bytes: int = 1) -> dict[str, Any]:
    return {"type": "string", "minLength": max(1, -(-min_bytes // 4)) if min_bytes else 0, "maxLength": max_bytes}


def _int(minimum: int = -SAFE_INT, maximum: int = SAFE_INT) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum}


DIGEST = {"type": "string", "pattern": DIGEST_PATTERN}
INSTANT = {"type": "string", "pattern": INSTANT_PATTERN}
CURSOR = {"type": "string", "pattern": CURSOR_PATTERN}
RECORD_ID = {"type": "string", "pattern": RECORD_ID_PATTERN, "maxLength": 56}
CANDIDATE_ID = {"type": "string", "pattern": r"^cand_[a-z2-7]+$", "maxLength": 64}
IDEMPOTENCY_KEY = _text(256, 16)
CITATION_IDS = {"type": "array", "items": _ref(), "minItems": 1, "maxItems": 256, "uniqueItems": True}

PAYLOAD = _obj(
    {
        "schema_version": {"type": "integer", "const": 2},
        "purpose_ref": _ref(),
        "valid_time": _obj({"t": _int(), "t_end": _int()}, ["t"]),
        "components": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "items": _obj(
                {
                    "component_id": _ref(),
                    "kind": {"type": "string", "enum": ["context", "decision", "evidence"]},
                    "text": _text(65_536),
                    "citation_ids": CITATION_IDS,
                },
                ["component_id", "kind", "text", "citation_ids"],
            ),
        },
        "primary_component_id": _ref(),
        "primary_event": _obj(
            {"at": _int(), "type_ref": _ref(), "citation_id": _ref()}, ["at", "type_ref", "citation_id"]
        ),
        "citations": {
            "type": "array",
            "minItems": 1,
            "maxItems": 256,
            "items": _obj(
                {
                    "citation_id": _ref(),
                    "source_ref": _ref(),
                    "locator": _obj({"scheme": _ref(), "value": _ref()}, ["scheme", "value"]),
                    "content_digest": DIGEST,
                    "observed_at": INSTANT,
                },
                ["citation_id", "source_ref", "locator", "content_digest"],
            ),
        },
        "retention": _obj(
            {
                "derivative_rule": {"type": "string", "enum": ["retain", "make-ineligible"]},
                "expires_at": INSTANT,
            },
            [],
        ),
        "reconciliation": _obj(
            {"family_refs": {"type": "array", "items": _ref(), "maxItems": 64, "uniqueItems": True}},
            ["family_refs"],
        ),
    },
    [
        "schema_version",
        "purpose_ref",
        "valid_time",
        "components",
        "primary_component_id",
        "primary_event",
        "citations",
    ],
)

EVIDENCE = _obj(
    {
        "evidence_ref": _ref(),
        "evidence_digest": DIGEST,
        "citation_ids": CITATION_IDS,
        "attestation": _text(4_096),
    },
    ["evidence_ref", "evidence_digest", "citation_ids"],
)

INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    "engram_memory_search": _obj(
        {
            "query": _text(8_192),
            "purpose_ref": _ref(),
            "limit": _int(1, 50),
            "max_packet_bytes": _int(4_096, 1_048_576),
            "capability_policy": _obj(
                {
                    "minimum_channels": {"type": "string", "enum": ["lexical", "lexical_and_semantic"]},
                    "network": {"type": "string", "enum": ["forbid", "allow"]},
                },
                [],
            ),
            "page_cursor": {"type": "string", "minLength": 1, "maxLength": 4_096},
        },
        ["query", "purpose_ref"],
    ),
    "engram_memory_get": _obj(
        {"record_id": RECORD_ID, "purpose_ref": _ref(), "max_packet_bytes": _int(4_096, 1_048_576)},
        ["record_id", "purpose_ref"],
    ),
    "engram_memory_capture": _obj(
        {"idempotency_key": IDEMPOTENCY_KEY, "payload": PAYLOAD, "evidence": EVIDENCE},
        ["idempotency_key", "payload", "evidence"],
    ),
    "engram_memory_request_admission": _obj(
        {"candidate_id": CANDIDATE_ID, "idempotency_key": IDEMPOTENCY_KEY},
        ["candidate_id", "idempotency_key"],
    ),
    "engram_memory_withdraw": _obj(
        {"candidate_id": CANDIDATE_ID, "idempotency_key": IDEMPOTENCY_KEY, "reason_ref": _ref()},
        ["candidate_id", "idempotency_key", "reason_ref"],
    ),
    "engram_memory_forget": _obj(
        {"record_id": RECORD_ID, "idempotency_key": IDEMPOTENCY_KEY, "reason_ref": _ref()},
        ["record_id", "idempotency_key", "reason_ref"],
    ),
}

# ---- output schemas (the whole success envelope, SPEC §3) -------------------

_STR = {"type": "string"}
_RECEIPT_DIGEST = {"type": "string"}

RECORD_OUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "record_id": RECORD_ID,
        "record_digest": _STR,
        "candidate_id": _STR,
        "state": _STR,
        "trust_class": _STR,
        "payload_digest": _STR,
        "accepted_at": _STR,
        "cursor": _STR,
        "payload": {"type": "object"},
        "principal": _STR,
        "agent_id": _STR,
    },
    "required": ["record_id"],
    "additionalProperties": False,
}

TRANSITION_RECEIPT = _obj(
    {
        "event_id": _STR,
        "operation": _STR,
        "from_state": _STR,
        "to_state": _STR,
        "cursor": CURSOR,
        "event_digest": _STR,
        "authorization_receipt_digest": _STR,
        "transaction_receipt_digest": _STR,
    },
    [
        "event_id",
        "operation",
        "from_state",
        "to_state",
        "cursor",
        "event_digest",
        "authorization_receipt_digest",
        "transaction_receipt_digest",
    ],
)

OUTPUT_VALUES: dict[str, dict[str, Any]] = {
    "engram_memory_search": _obj(
        {
            "records": {
                "type": "array",
                "items": _obj(
                    {
                        "record": RECORD_OUT,
                        "redacted_fields": {"type": "array", "items": _STR},
                        "redaction_receipt_digest": _STR,
                        "score": {"type": "number"},
                        "rank": {"type": "integer"},
                    },
                    ["record", "redacted_fields", "redaction_receipt_digest", "score", "rank"],
                ),
            },
            "rank_receipt": {"type": "object"},
            "next_page_cursor": _STR,
            "response_digest": _STR,
        },
        ["records", "rank_receipt", "response_digest"],
    ),
    "engram_memory_get": _obj(
        {
            "record": RECORD_OUT,
            "redacted_fields": {"type": "array", "items": _STR},
            "redaction_receipt_digest": _STR,
            "read_receipt": {"type": "object"},
            "packet_digest": _STR,
        },
        ["record", "redacted_fields", "redaction_receipt_digest", "read_receipt", "packet_digest"],
    ),
    "engram_memory_capture": _obj(
        {
            "status": {"type": "string", "enum": ["committed_pending", "duplicate_exact"]},
            "candidate_id": _STR,
            "record_digest": _STR,
            "cursor": CURSOR,
            "transaction_receipt_digest": _STR,
        },
        ["status", "candidate_id", "cursor", "transaction_receipt_digest"],
    ),
    "engram_memory_request_admission": _obj(
        {
            "outcome": _obj(
                {
                    "status": {
                        "type": "string",
                        "enum": ["accepted", "rejected", "pending_adjudication", "duplicate_exact"],
                    },
                    "candidate_id": _STR,
                    "record_id": RECORD_ID,
                    "cursor": CURSOR,
                    "decision_receipt_digest": _STR,
                    "transaction_receipt_digest": _STR,
                },
                ["status", "candidate_id", "cursor", "decision_receipt_digest", "transaction_receipt_digest"],
            ),
            "replayed": {"type": "boolean"},
        },
        ["outcome", "replayed"],
    ),
    "engram_memory_withdraw": _obj(
        {
            "receipt": TRANSITION_RECEIPT,
            "replayed": {"type": "boolean"},
            "key_destruction": {"type": "string", "enum": ["pending", "complete"]},
        },
        ["receipt", "replayed", "key_destruction"],
    ),
    "engram_memory_forget": _obj(
        {
            "receipt": TRANSITION_RECEIPT,
            "replayed": {"type": "boolean"},
            "projection_invalidation": {"type": "string", "enum": ["pending", "complete"]},
            "coverage_receipt_digest": _STR,
        },
        ["receipt", "replayed", "projection_invalidation"],
    ),
}


def output_schema(tool: str) -> dict[str, Any]:
    """The success envelope of a tool (the MCP client validates it, SPEC §3)."""
    return _obj(
        {
            "ok": {"type": "boolean", "const": True},
            "output": _obj(
                {"schema_version": {"type": "integer", "const": 1}, "value": OUTPUT_VALUES[tool]},
                ["schema_version", "value"],
            ),
            "auditId": _STR,
            "redactionClass": {"type": "string", "const": "high"},
        },
        ["ok", "output", "auditId", "redactionClass"],
    )
