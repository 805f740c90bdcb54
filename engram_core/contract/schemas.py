"""The one source of the six tools' closed JSON Schemas (SPEC §4–5).

The core validates every request against these (``engram_core.contract.validation``)
and the MCP adapter publishes them as ``inputSchema``/``outputSchema``.

JSON Schema counts code points, the contract counts UTF-8 bytes: the published
``maxLength`` equals the byte bound (a necessary condition) and the published
``minLength`` of byte-bounded strings is the smallest code-point count that can
reach the byte minimum; ``validation`` then checks exact byte sizes and NFC.
"""

from __future__ import annotations

from typing import Any

from engram_core.contract.tools import (
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

__all__ = ["TOOL_NAMES"]  # the tool list, with the schemas it names (engram_core.contract.tools)


def _d(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """A copy of ``schema`` with its description (every published property has one)."""
    return {**schema, "description": description}


def _obj(properties: dict[str, Any], required: list[str], description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required,
                              "additionalProperties": False}
    return _d(schema, description) if description else schema


def _cursor(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": CURSOR_PATTERN,
            "description": f"{description} Decimal string, per scope, dense and monotonic."}


# ---- input schemas ------------------------------------------------------------
#
# What a model reads of tools/list is each tool's name, description and inputSchema, in every
# session of every agent that enables Engram (issue 60): the six together stay under 10 KB,
# capture's under 5 KB (tests/mcp/test_mcp_context_budget.py). So each property says what it
# is in one line, definitions used more than once are written once under ``$defs`` and named by
# ``$ref``, and the worked examples and long explanations live in the agent guide
# (``engram://guide``, adapters/mcp/guidance.py). Every bound, enum, pattern, required list and
# ``additionalProperties: false`` stays: ``enforced`` inlines the references, and that is the
# schema the core validates against (engram_core.contract.validation), the same as before they were shared.

# Shared definitions: name -> schema. A property that is one of them is {"$ref", "description"}.
DEFS: dict[str, dict[str, Any]] = {
    "ref": {"type": "string", "minLength": 1, "maxLength": 512, "description": "1-512 UTF-8 bytes, NFC."},
    "ms": {"type": "integer", "minimum": -SAFE_INT, "maximum": SAFE_INT,
           "description": "Epoch milliseconds, UTC. Not epoch seconds."},
    "instant": {"type": "string", "pattern": INSTANT_PATTERN, "description": "UTC YYYY-MM-DDTHH:mm:ss.sssZ."},
    "digest": {"type": "string", "pattern": DIGEST_PATTERN, "description": "sha256: + 64 lowercase hex."},
    "ids": {"type": "array", "items": {"$ref": "#/$defs/ref"}, "minItems": 1, "maxItems": 256, "uniqueItems": True,
            "description": "Unique ids of payload.citations."},
}
_REF_PREFIX = "#/$defs/"
_REF_ITEMS = {"$ref": _REF_PREFIX + "ref"}


def _use(name: str, description: str | None = None) -> dict[str, Any]:
    """A property that is the shared definition ``name``. Its own one-line description only where
    its name, its object's description and the definition's leave something unsaid: each costs
    every agent a few tokens in every session."""
    node: dict[str, Any] = {"$ref": _REF_PREFIX + name}
    return _d(node, description) if description else node


def _ref(description: str | None = None) -> dict[str, Any]:
    """Opaque ref: 1–512 UTF-8 bytes (byte bound checked in validation)."""
    return _use("ref", description)


def _text(max_bytes: int, description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": max_bytes,
            "description": f"{description}; 1-{max_bytes:,} UTF-8 bytes, NFC."}


def _int(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": description}


def record_id_schema(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": RECORD_ID_PATTERN, "maxLength": 56,
            "description": f"{description} mem_ + 52 lowercase base32 characters; copy it exactly as returned."}


def _record_id(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": RECORD_ID_PATTERN, "maxLength": 56, "description": description}


def _candidate_id(description: str) -> dict[str, Any]:
    return {"type": "string", "pattern": CANDIDATE_ID_PATTERN, "maxLength": 64, "description": description}


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
        "description": f"16-256 UTF-8 bytes, one per {description}; retries reuse it.",
    }


def _uses(node: Any) -> list[str]:
    """The definitions ``node`` names, once per ``$ref``."""
    if isinstance(node, dict):
        own = [node["$ref"][len(_REF_PREFIX):]] if isinstance(node.get("$ref"), str) else []
        return own + [name for k, v in node.items() if k != "$defs" for name in _uses(v)]
    if isinstance(node, list):
        return [name for v in node for name in _uses(v)]
    return []


def _inlined(node: Any, names: set[str]) -> Any:
    """``node`` with each ``$ref`` to one of ``names`` replaced by that definition; a
    description of the property's own goes before the definition's."""
    if isinstance(node, dict):
        name = node["$ref"][len(_REF_PREFIX):] if isinstance(node.get("$ref"), str) else None
        if name in names:
            own = node.get("description")
            merged = {**DEFS[name], **{k: v for k, v in node.items() if k not in ("$ref", "description")}}
            if own:
                merged["description"] = f"{own} {DEFS[name]['description']}"
            return _inlined(merged, names)
        return {k: _inlined(v, names) for k, v in node.items()}
    if isinstance(node, list):
        return [_inlined(v, names) for v in node]
    return node


_CLOSED = "Closed: no extra fields, no nulls."


def _tool(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    """A tool's input schema, closed as every tool's is, each property required unless
    ``required`` names fewer; with the shared definitions it names more than once (and theirs)
    under ``$defs``, one named once written in place, where it costs less."""
    schema = _obj(properties, list(properties) if required is None else required, _CLOSED)
    while True:
        uses = _uses(schema)
        kept = set(uses)
        while more := {n for d in kept for n in _uses(DEFS[d])} - kept:
            kept |= more
        counts = {name: uses.count(name) + sum(_uses(DEFS[d]).count(name) for d in kept) for name in kept}
        once = {name for name, count in counts.items() if count == 1}
        if not once:
            break
        schema = _inlined(schema, once)
    if kept:
        schema["$defs"] = {name: DEFS[name] for name in sorted(kept)}
    return schema


def enforced(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``$ref`` replaced by the definition it names (the property's own
    description kept) and no ``$defs``: what each published input schema says, in the shape the
    core's validators and walkers expect (engram_core.contract.validation)."""
    defs = schema.get("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                if not ref.startswith(_REF_PREFIX) or ref[len(_REF_PREFIX):] not in defs:
                    raise ValueError(f"unresolvable $ref {ref!r}")
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return inline({**defs[ref[len(_REF_PREFIX):]], **rest})
            return {k: inline(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(schema)


PURPOSE_REF = _ref("Your bound purpose_ref, exactly.")
MAX_PACKET_BYTES = _int("Answer size cap in bytes; default 65,536.", 4_096, 1_048_576)

PAYLOAD = _obj(
    {
        "schema_version": {"type": "integer", "const": 2, "description": "Always 2."},
        "purpose_ref": PURPOSE_REF,
        "valid_time": _obj({"t": _use("ms"), "t_end": _use("ms")}, ["t"],
                           "When it holds; t_end >= t."),
        "components": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "description": "1-64 parts; one is primary.",
            "items": _obj(
                {
                    "component_id": _ref(),
                    "kind": {"type": "string", "enum": ["context", "decision", "evidence"],
                             "description": "decision: a choice, fix, rule; context: reason, background; "
                                            "evidence: a checked fact."},
                    "text": _text(65_536, "No secrets"),
                    "citation_ids": _use("ids"),
                },
                ["component_id", "kind", "text", "citation_ids"],
            ),
        },
        "primary_component_id": _ref(),
        "primary_event": _obj(
            {"at": _use("ms"), "type_ref": _ref(), "citation_id": _ref()},
            ["at", "type_ref", "citation_id"],
            "The primary part cites its citation_id.",
        ),
        "citations": {
            "type": "array",
            "minItems": 1,
            "maxItems": 256,
            "description": "The sources.",
            "items": _obj(
                {
                    "citation_id": _ref(),
                    "source_ref": _ref(),
                    "locator": _obj({"scheme": _ref(), "value": _ref()}, ["scheme", "value"],
                                    "Where in the source."),
                    "content_digest": _use("digest"),
                    "observed_at": _use("instant"),
                },
                ["citation_id", "source_ref", "locator", "content_digest"],
            ),
        },
        "retention": _obj(
            {
                "derivative_rule": {"type": "string", "enum": ["retain", "make-ineligible"],
                                    "description": "Default make-ineligible."},
                "expires_at": _use("instant"),
            },
            [],
            "Omit unless told.",
        ),
        "reconciliation": _obj(
            {"family_refs": {"type": "array", "items": _REF_ITEMS, "maxItems": 64, "uniqueItems": True,
                             "description": "Sorted."}},
            ["family_refs"],
            "Omit unless told.",
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
    "What to remember.",
)

EVIDENCE = _obj(
    {
        "evidence_ref": _ref(),
        "evidence_digest": _use("digest"),
        "citation_ids": _use("ids"),
        "attestation": _text(4_096, "Optional"),
    },
    ["evidence_ref", "evidence_digest", "citation_ids"],
    "What backs it.",
)


def _reason(example: str) -> dict[str, Any]:
    """Why a withdrawal or forget is asked, in the words the human confirming it reads."""
    return _ref(f"Why, e.g. \"{example}\"; shown to the human.")


_RECORD_FROM = "From search (records[].record.record_id) or an accepted admission (outcome.record_id)."
_CANDIDATE_FROM = "The candidate_id capture returned."

INPUT_SCHEMAS: dict[str, dict[str, Any]] = {
    SEARCH_TOOL: _tool(
        {
            "query": _text(8_192, "What you look for"),
            "purpose_ref": PURPOSE_REF,
            "limit": _int("Per page; default 10.", 1, 50),
            "max_packet_bytes": MAX_PACKET_BYTES,
            "capability_policy": _obj(
                {
                    "minimum_channels": {"type": "string", "enum": ["lexical", "lexical_and_semantic"],
                                         "description": "Default lexical."},
                    "network": {"type": "string", "enum": ["forbid", "allow"],
                                "description": "Default forbid."},
                },
                [],
                "Ranking channels required.",
            ),
            "page_cursor": {"type": "string", "minLength": 1, "maxLength": 4_096,
                            "description": "The last page's next_page_cursor; same query."},
        },
        ["query", "purpose_ref"],
    ),
    GET_TOOL: _tool(
        {"record_id": _record_id(_RECORD_FROM),
         "purpose_ref": PURPOSE_REF,
         "max_packet_bytes": MAX_PACKET_BYTES},
        ["record_id", "purpose_ref"],
    ),
    CAPTURE_TOOL: _tool({"idempotency_key": _idempotency_key("capture"), "payload": PAYLOAD, "evidence": EVIDENCE}),
    ADMISSION_TOOL: _tool({"candidate_id": _candidate_id(_CANDIDATE_FROM),
                           "idempotency_key": _idempotency_key("request")}),
    WITHDRAW_TOOL: _tool({"candidate_id": _candidate_id(_CANDIDATE_FROM),
                          "idempotency_key": _idempotency_key("withdrawal"),
                          "reason_ref": _reason("reason:captured-by-mistake")}),
    FORGET_TOOL: _tool({"record_id": _record_id(_RECORD_FROM),
                        "idempotency_key": _idempotency_key("forget"),
                        "reason_ref": _reason("reason:superseded-by-adr-0012")}),
}


def _with_examples() -> None:
    """Publish the examples a first call copies (engram_core.contract.schema_examples.SCHEMA_EXAMPLES):
    capture's one complete, compact example and search's; the rest are in the guide."""
    from engram_core.contract.schema_examples import SCHEMA_EXAMPLES

    for tool, examples in SCHEMA_EXAMPLES.items():
        INPUT_SCHEMAS[tool]["examples"] = examples


_with_examples()

# What the core validates against: the published schemas with their references inlined.
ENFORCED_SCHEMAS: dict[str, dict[str, Any]] = {name: enforced(schema) for name, schema in INPUT_SCHEMAS.items()}

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
                            "Ranking score of this hit, 0 to 1: the query's relevance (how much of the "
                            "query the best hit holds) times the hit's place in this ranking. It orders "
                            "hits; no threshold tells an answer from a miss in every store: read the record.")},
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
