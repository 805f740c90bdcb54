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

from engram_core.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    FORGET_TOOL,
    GET_TOOL,
    SEARCH_TOOL,
    TOOL_NAMES,
    WITHDRAW_TOOL,
)

SAFE_INT = 2**53 - 1
MAX_ARGUMENT_BYTES = 1_048_576
IDEMPOTENCY_KEY_MIN_BYTES = 16
IDEMPOTENCY_KEY_MAX_BYTES = 256

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
RECORD_ID_PATTERN = r"^mem_[a-z2-7]{52}$"
CANDIDATE_ID_PATTERN = r"^cand_[a-z2-7]+$"
INSTANT_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$"
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,19})$"
# Matches a string holding at least one non-ASCII character (unanchored search, linear).
_NON_ASCII = "[^\\x00-\\x7f]"

__all__ = ["TOOL_NAMES"]  # the tool list, with the schemas it names (engram_core.tools)

# Said once, appended to the description of every string with a byte bound.
_BYTES_NOTE = "Sizes are UTF-8 bytes (the schema's length counts characters); NFC only."


def _d(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """A copy of ``schema`` with its description (every published property has one)."""
    return {**schema, "description": description}


def _obj(properties: dict[str, Any], required: list[str], description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required,
                              "additionalProperties": False}
    return _d(schema, description) if description else schema


def _ref(description: str) -> dict[str, Any]:
    """Opaque ref: 1–512 UTF-8 bytes (byte bound checked in validation)."""
    return {"type": "string", "minLength": 1, "maxLength": 512,
            "description": f"{description} Opaque reference, 1-512 UTF-8 bytes, NFC."}


def _text(max_bytes: int, description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_bytes,
            "description": f"{description} 1-{max_bytes:,} UTF-8 bytes. {_BYTES_NOTE}"}


def _int(description: str, minimum: int = -SAFE_INT, maximum: int = SAFE_INT) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum,
            "description": f"{description} An integer written without fraction or exponent."}


def _epoch_ms(description: str) -> dict[str, Any]:
    return _int(f"{description} Epoch milliseconds (UTC), a safe integer (|n| <= 2^53-1), "
                "e.g. 1764547200000 is 2025-12-01T00:00:00.000Z. Not epoch seconds: 1764547200 would mean "
                "1970-01-21. Times outside the host's window (too early, or too far ahead) are refused "
                "with UNAUTHORIZED.")


def _digest(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": DIGEST_PATTERN,
            "description": f"{description} Format: sha256: + 64 lowercase hex digits (INVALID_DIGEST otherwise)."}


def _instant(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": INSTANT_PATTERN,
            "description": f"{description} Instant YYYY-MM-DDTHH:mm:ss.sssZ: UTC, exactly milliseconds, "
                           "a real calendar date."}


def _cursor(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": CURSOR_PATTERN,
            "description": f"{description} Decimal string, per scope, dense and monotonic."}


def record_id_schema(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": RECORD_ID_PATTERN, "maxLength": 56,
            "description": f"{description} mem_ + 52 lowercase base32 characters; copy it exactly as returned."}


def candidate_id_schema(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": CANDIDATE_ID_PATTERN, "maxLength": 64,
            "description": f"{description} cand_ + lowercase base32; copy it exactly as capture returned it. "
                           "Never a record_id."}


def _idempotency_key(description: str) -> dict[str, Any]:
    # SPEC §4: 16-256 UTF-8 bytes. JSON Schema counts characters, so the bound is exact for
    # ASCII keys (minLength 16) and, for keys holding any non-ASCII character, the weakest
    # character bound that can reach 16 bytes (4); validation checks the bytes.
    min_chars = -(-IDEMPOTENCY_KEY_MIN_BYTES // 4)
    return {
        "type": "string",
        "minLength": min_chars,
        "maxLength": IDEMPOTENCY_KEY_MAX_BYTES,
        "anyOf": [{"minLength": IDEMPOTENCY_KEY_MIN_BYTES}, {"pattern": _NON_ASCII}],
        "description": f"{description} 16-256 UTF-8 bytes, NFC: use 16 or more ASCII characters, e.g. "
                       "a UUID or a name of the operation. One key per logical operation, scoped to "
                       "your principal; record it before the call and retry with the same key and "
                       "identical arguments. The same key with other content, target or tool is "
                       "DIGEST_CONFLICT.",
    }


def _unique_refs(description: str, item: str, *, min_items: int = 1, max_items: int = 256) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array", "items": _ref(item), "maxItems": max_items, "uniqueItems": True,
                              "description": description}
    if min_items:
        schema["minItems"] = min_items
    return schema


def _citation_ids(description: str) -> dict[str, Any]:
    return _unique_refs(f"{description} 1-256 unique ids; each must equal a citation_id in payload.citations.",
                        "A citation_id of payload.citations.")


PURPOSE_REF = _ref("The purpose your host bound to this session; pass exactly that value (a different "
                   "one is refused as a protocol error).")
MAX_PACKET_BYTES = _int("Upper bound on the answer's size in bytes (4,096-1,048,576, default 65,536); the "
                        "host's redaction policy may lower it. RESULT_TOO_LARGE / PROJECTION_OVERSIZED when "
                        "the answer does not fit.", 4_096, 1_048_576)

PAYLOAD = _obj(
    {
        "schema_version": {"type": "integer", "const": 2, "description": "Payload format version: always 2."},
        "purpose_ref": PURPOSE_REF,
        "valid_time": _obj(
            {"t": _epoch_ms("When the knowledge became true (the decision was made, the fact observed). "
                            "A record is returned only once t is in the past."),
             "t_end": _epoch_ms("Optional: when it stopped being true; >= t. Omit for knowledge that "
                                "still holds.")},
            ["t"],
            "The time the knowledge is valid for (valid time, not capture time).",
        ),
        "components": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "description": "The knowledge itself, 1-64 parts. Map what you keep onto kinds: a decision with "
                           "its reason = decision + context; a verified fact = evidence; a known problem "
                           "and its fix = context (problem) + decision (fix) + evidence (verification); a "
                           "convention = decision (rule) + context (where it applies); a hand-off = "
                           "context (state) + decision (next step). component_id values are unique.",
            "items": _obj(
                {
                    "component_id": _ref("Your name for this part, unique within the payload, e.g. "
                                         "\"decision\" or \"reason\"."),
                    "kind": {"type": "string", "enum": ["context", "decision", "evidence"],
                             "description": "decision: what was decided, a fix, a rule, a next step. "
                                            "context: background, reasons, symptoms, scope, state. "
                                            "evidence: an observed, checkable fact or how something "
                                            "was verified."},
                    "text": _text(65_536, "The durable knowledge in plain words. Never secrets, credentials, "
                                          "tokens, drafts, chat logs or raw tool output (a credential is "
                                          "refused)."),
                    "citation_ids": _citation_ids("The citations this part rests on."),
                },
                ["component_id", "kind", "text", "citation_ids"],
                "One part of the knowledge.",
            ),
        },
        "primary_component_id": _ref("The component_id of the main part (the decision, the fact, the fix, "
                                     "the rule, the state); must name one of components."),
        "primary_event": _obj(
            {"at": _epoch_ms("When the event happened."),
             "type_ref": _ref("What kind of event made this knowledge, e.g. \"event:decision-made\", "
                              "\"event:fact-verified\"."),
             "citation_id": _ref("The citation recording the event; must be in payload.citations and in "
                                 "the primary component's citation_ids.")},
            ["at", "type_ref", "citation_id"],
            "The event that produced the primary component.",
        ),
        "citations": {
            "type": "array",
            "minItems": 1,
            "maxItems": 256,
            "description": "The sources, 1-256, with unique citation_id values; every id cited anywhere "
                           "must resolve here.",
            "items": _obj(
                {
                    "citation_id": _ref("Your name for this source, unique within the payload; components, "
                                        "primary_event and evidence cite it."),
                    "source_ref": _ref("Which source, e.g. \"repo:engram/docs/adr/0007.md\", "
                                       "\"tracker:engram/issues/15\"."),
                    "locator": _obj(
                        {"scheme": _ref("How value locates the content: e.g. \"path\", \"url\", \"issue\", "
                                        "\"line-range\"."),
                         "value": _ref("Where in the source, in that scheme, e.g. \"docs/adr/0007.md\".")},
                        ["scheme", "value"],
                        "Where in the source the cited content is.",
                    ),
                    "content_digest": _digest("Digest of the cited content as you read it."),
                    "observed_at": _instant("Optional: when you read the source."),
                },
                ["citation_id", "source_ref", "locator", "content_digest"],
                "One source.",
            ),
        },
        "retention": _obj(
            {
                "derivative_rule": {"type": "string", "enum": ["retain", "make-ineligible"],
                                    "description": "What happens to derivatives when this record is forgotten: "
                                                   "make-ineligible (default) or retain (needs host "
                                                   "permission, else UNAUTHORIZED)."},
                "expires_at": _instant("When the record stops being returned; must be after the capture time "
                                       "(INVALID_SCHEMA otherwise) and within the host's cap (UNAUTHORIZED "
                                       "beyond it)."),
            },
            [],
            "Optional; omit it unless your host told you otherwise.",
        ),
        "reconciliation": _obj(
            {"family_refs": _unique_refs("Families this record belongs to, sorted ascending, unique, at most "
                                         "64; each needs the host's consent (UNAUTHORIZED otherwise).",
                                         "A reconciliation family ref.", min_items=0, max_items=64)},
            ["family_refs"],
            "Optional; omit it unless your host told you otherwise.",
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
    "The knowledge to remember, with its sources.",
)

EVIDENCE = _obj(
    {
        "evidence_ref": _ref("What backs the capture as a whole, e.g. \"evidence:adr-0007-accepted\"."),
        "evidence_digest": _digest("Digest of that evidence."),
        "citation_ids": _citation_ids("The citations the evidence covers."),
        "attestation": _text(4_096, "Optional: a host or tool attestation of the evidence."),
    },
    ["evidence_ref", "evidence_digest", "citation_ids"],
    "What backs the capture; a claim until a host verifier checks it.",
)

_ARGS_NOTE = (" Every object is closed (an unknown field is INVALID_SCHEMA); omit optional fields, never "
              "send null; never pass tenant, workspace, principal or a confirmation. The serialized "
              "arguments are at most 1,048,576 bytes.")

INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    SEARCH_TOOL: _obj(
        {
            "query": _text(8_192, "What you are looking for, in words."),
            "purpose_ref": PURPOSE_REF,
            "limit": _int("How many records per page (1-50, default 10).", 1, 50),
            "max_packet_bytes": MAX_PACKET_BYTES,
            "capability_policy": _obj(
                {
                    "minimum_channels": {"type": "string", "enum": ["lexical", "lexical_and_semantic"],
                                         "description": "lexical (default) or lexical_and_semantic, which "
                                                        "needs the semantic channel (RANKING_UNAVAILABLE "
                                                        "when it is not available; never a silent fallback)."},
                    "network": {"type": "string", "enum": ["forbid", "allow"],
                                "description": "forbid (default) or allow a ranking channel that needs the "
                                               "network; allow grants nothing by itself."},
                },
                [],
                "Optional: which ranking channels the search must use.",
            ),
            "page_cursor": {"type": "string", "minLength": 1, "maxLength": 4_096,
                            "description": "Optional: next_page_cursor of the previous page, copied exactly, "
                                           "with the same query and parameters. STALE_PAGE: search again "
                                           "without it."},
        },
        ["query", "purpose_ref"],
        "Search current, accepted records." + _ARGS_NOTE,
    ),
    GET_TOOL: _obj(
        {"record_id": record_id_schema("The record to read, as search returned it."),
         "purpose_ref": PURPOSE_REF,
         "max_packet_bytes": MAX_PACKET_BYTES},
        ["record_id", "purpose_ref"],
        "Read one current record." + _ARGS_NOTE,
    ),
    CAPTURE_TOOL: _obj(
        {"idempotency_key": _idempotency_key("Names this capture."), "payload": PAYLOAD, "evidence": EVIDENCE},
        ["idempotency_key", "payload", "evidence"],
        "Submit cited knowledge as a pending candidate. Cross-references: citation_ids and component_ids "
        "unique; every cited id resolves into payload.citations; primary_component_id names a component; "
        "primary_event.citation_id is in citations and in the primary component." + _ARGS_NOTE,
    ),
    ADMISSION_TOOL: _obj(
        {"candidate_id": candidate_id_schema("The pending candidate to decide."),
         "idempotency_key": _idempotency_key("Names this admission request.")},
        ["candidate_id", "idempotency_key"],
        "Ask the admission policy to decide a candidate." + _ARGS_NOTE,
    ),
    WITHDRAW_TOOL: _obj(
        {"candidate_id": candidate_id_schema("Your pending candidate to withdraw."),
         "idempotency_key": _idempotency_key("Names this withdrawal."),
         "reason_ref": _ref("Why, e.g. \"reason:captured-by-mistake\"; shown to the human who confirms.")},
        ["candidate_id", "idempotency_key", "reason_ref"],
        "Withdraw a pending candidate; a human confirms through the host." + _ARGS_NOTE,
    ),
    FORGET_TOOL: _obj(
        {"record_id": record_id_schema("The record to forget."),
         "idempotency_key": _idempotency_key("Names this forget."),
         "reason_ref": _ref("Why, e.g. \"reason:superseded-by-adr-0012\"; shown to the human who confirms.")},
        ["record_id", "idempotency_key", "reason_ref"],
        "Forget a record for good; a human confirms through the host." + _ARGS_NOTE,
    ),
}


def _with_examples() -> None:
    """Attach each tool's complete examples (engram_core.schema_examples) to its input schema,
    and say in the description where an example's placeholder id really comes from."""
    from engram_core.schema_examples import EXAMPLE_ID_NOTES, TOOL_EXAMPLES

    for tool, schema in INPUT_SCHEMAS.items():
        schema["examples"] = TOOL_EXAMPLES[tool]
        if tool in EXAMPLE_ID_NOTES:
            schema["description"] = f"{schema['description']} {EXAMPLE_ID_NOTES[tool]}"


_with_examples()

# ---- output schemas (the whole success envelope, SPEC §3) -------------------


def _s(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _receipt_digest(what: str) -> dict[str, Any]:
    return _s(f"Digest (sha256: + 64 hex) of the {what}; keep it to show what the answer rested on.")


RECORD_OUT: dict[str, Any] = _obj(
    {
        "record_id": record_id_schema("The record's id: cite it, pass it to get or forget."),
        "record_digest": _s("Digest of the record's immutable content; record_id is derived from it."),
        "candidate_id": _s("The candidate this record was admitted from."),
        "state": _s("Lifecycle state; search and get only return accepted_current."),
        "trust_class": _s("asserted (default), earned or signed: set by the host, never by the agent."),
        "payload_digest": _s("Digest of the effective payload (as captured, with the resolved retention)."),
        "accepted_at": _s("When the record was admitted (instant YYYY-MM-DDTHH:mm:ss.sssZ)."),
        "cursor": _s("The scope cursor of its admission (decimal string)."),
        "payload": {"type": "object", "description": "The captured payload (same shape as capture's payload)."},
        "principal": _s("The principal that captured it."),
        "agent_id": _s("The agent that captured it."),
    },
    ["record_id"],
    "The record, with the fields the host's redaction policy lets you see (record_id always).",
)

TRANSITION_RECEIPT = _obj(
    {
        "event_id": _s("The journal event of this transition (evt_...)."),
        "operation": _s("withdraw or tombstone."),
        "from_state": _s("State before the transition."),
        "to_state": _s("State after it (withdrawn, tombstoned)."),
        "cursor": _cursor("The scope cursor of the event."),
        "event_digest": _s("Digest of the journal event (hash-chained per scope)."),
        "authorization_receipt_digest": _receipt_digest("authorization decision"),
        "transaction_receipt_digest": _receipt_digest("committed transaction"),
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
    "What the transition did, durably.",
)

_REDACTED_FIELDS = {"type": "array", "items": _s("A JSON pointer, e.g. /principal."),
                    "description": "JSON pointers of record fields the redaction policy withheld."}

RANK_RECEIPT: dict[str, Any] = {
    "type": "object",
    "description": "How the page was ranked and validated (profile, pins, digests).",
    "properties": {
        "request_digest": _s("Digest of the query and its paging parameters."),
        "authorization_receipt_digest": _receipt_digest("authorization decision"),
        "profile": _s("Ranking profile (offline_lexical_v1, semantic_v1)."),
        "profile_version": _s("Version of the profile."),
        "profile_config_digest": _s("Digest of the profile's pinned configuration (tokenizer, parameters, model)."),
        "valid_as_of": _s("Valid time the search was evaluated at (instant)."),
        "system_as_of": _s("Scope cursor the search was pinned to (decimal string)."),
        "candidate_count": {"type": "integer", "description": "How many records ranking considered."},
        "ordered_ids_digest": _s("Digest of the returned record ids in order."),
        "revalidation_receipt_digest": _receipt_digest("final eligibility check"),
        "issued_at": _s("When the receipt was made (instant)."),
        "receipt_digest": _s("Digest of this receipt without this field."),
    },
}

READ_RECEIPT: dict[str, Any] = {
    "type": "object",
    "description": "What the read rested on.",
    "properties": {
        "record_id": _s("The record read."),
        "record_digest": _s("Its record digest."),
        "valid_as_of": _s("Valid time of the read (instant)."),
        "system_as_of": _s("Scope cursor of the read (decimal string)."),
        "validated_through_cursor": _s("Cursor through which eligibility was checked."),
        "authorization_receipt_digest": _receipt_digest("authorization decision"),
        "revalidation_receipt_digest": _receipt_digest("eligibility check"),
        "checked_at": _s("When it was checked (instant)."),
        "receipt_digest": _s("Digest of this receipt without this field."),
    },
}

OUTPUT_VALUES: dict[str, dict[str, Any]] = {
    SEARCH_TOOL: _obj(
        {
            "records": {
                "type": "array",
                "description": "The page, best first; empty means nothing matched (failures are errors).",
                "items": _obj(
                    {
                        "record": RECORD_OUT,
                        "redacted_fields": _REDACTED_FIELDS,
                        "redaction_receipt_digest": _receipt_digest("redaction decision"),
                        "score": {"type": "number", "description": (
                            "Ranking score of this hit, 0 to 1, comparable across searches: the query's "
                            "relevance (how much of the query the best hit holds) times the hit's place "
                            "in this ranking. A top score below about 0.2 (lexical) or 0.4 (lexical_and_semantic) "
                            "usually means nothing in memory answers the query.")},
                        "rank": {"type": "integer", "description": "Position in the whole result, from 1."},
                    },
                    ["record", "redacted_fields", "redaction_receipt_digest", "score", "rank"],
                    "One hit.",
                ),
            },
            "rank_receipt": RANK_RECEIPT,
            "next_page_cursor": _s("Present when there are more hits: pass it as page_cursor with the same "
                                   "query and parameters."),
            "response_digest": _s("Digest of this response without this field."),
        },
        ["records", "rank_receipt", "response_digest"],
        "A page of current records.",
    ),
    GET_TOOL: _obj(
        {
            "record": RECORD_OUT,
            "redacted_fields": _REDACTED_FIELDS,
            "redaction_receipt_digest": _receipt_digest("redaction decision"),
            "read_receipt": READ_RECEIPT,
            "packet_digest": _s("Digest of this packet without this field."),
        },
        ["record", "redacted_fields", "redaction_receipt_digest", "read_receipt", "packet_digest"],
        "One current record.",
    ),
    CAPTURE_TOOL: _obj(
        {
            "status": {"type": "string", "enum": ["committed_pending", "duplicate_exact"],
                       "description": "committed_pending: a new sealed candidate; duplicate_exact: this key "
                                      "and content were captured before (a replay; same answer)."},
            "candidate_id": _s("The pending candidate: pass it to request_admission. Not a record_id."),
            "record_digest": _s("The digest the record will have if admitted."),
            "cursor": _cursor("The scope cursor of the capture."),
            "transaction_receipt_digest": _receipt_digest("committed transaction"),
        },
        ["status", "candidate_id", "cursor", "transaction_receipt_digest"],
        "The candidate made (or found again).",
    ),
    ADMISSION_TOOL: _obj(
        {
            "outcome": _obj(
                {
                    "status": {
                        "type": "string",
                        "enum": ["accepted", "rejected", "pending_adjudication", "duplicate_exact"],
                        "description": "accepted: now a record (record_id). rejected: the policy said no. "
                                       "pending_adjudication: a host decides later. duplicate_exact: a "
                                       "current record in this scope already holds identical content "
                                       "(record_id names it) or the candidate was already admitted; no "
                                       "second record was made. All are successes: report the status.",
                    },
                    "candidate_id": _s("The candidate decided."),
                    "record_id": record_id_schema("The record: the new one (accepted) or the existing one "
                                                  "holding this content (duplicate_exact)."),
                    "cursor": _cursor("The scope cursor of the decision."),
                    "decision_receipt_digest": _receipt_digest("admission decision"),
                    "transaction_receipt_digest": _receipt_digest("committed transaction"),
                },
                ["status", "candidate_id", "cursor", "decision_receipt_digest", "transaction_receipt_digest"],
                "The admission outcome.",
            ),
            "replayed": {"type": "boolean", "description": "true: this key was used before; this is the stored "
                                                           "answer."},
        },
        ["outcome", "replayed"],
        "The decision on the candidate.",
    ),
    WITHDRAW_TOOL: _obj(
        {
            "receipt": TRANSITION_RECEIPT,
            "replayed": {"type": "boolean", "description": "true: this key was used before; stored answer."},
            "key_destruction": {"type": "string", "enum": ["pending", "complete"],
                                "description": "complete once the candidate's key is destroyed durably."},
        },
        ["receipt", "replayed", "key_destruction"],
        "The withdrawal.",
    ),
    FORGET_TOOL: _obj(
        {
            "receipt": TRANSITION_RECEIPT,
            "replayed": {"type": "boolean", "description": "true: this key was used before; stored answer."},
            "projection_invalidation": {"type": "string", "enum": ["pending", "complete"],
                                        "description": "complete once the body key is destroyed and every "
                                                       "projection removed durably."},
            "coverage_receipt_digest": _receipt_digest("list of what was removed"),
        },
        ["receipt", "replayed", "projection_invalidation"],
        "The forget.",
    ),
}


def output_schema(tool: str) -> dict[str, Any]:
    """The success envelope of a tool (the MCP client validates it, SPEC §3)."""
    return _obj(
        {
            "ok": {"type": "boolean", "const": True, "description": "true on success (isError is false)."},
            "output": _obj(
                {"schema_version": {"type": "integer", "const": 1, "description": "Output format version: 1."},
                 "value": OUTPUT_VALUES[tool]},
                ["schema_version", "value"],
                "The tool's answer.",
            ),
            "auditId": _s("The audit id of this call, as recorded in the host's audit log."),
            "redactionClass": {"type": "string", "const": "high", "description": "Always high."},
        },
        ["ok", "output", "auditId", "redactionClass"],
        "The success envelope. A failure is {ok: false, auditId, redactionClass, error: {code, message, "
        "retriable}}: act on code and retriable.",
    )
