"""The one closed error type of Engram (SPEC §3).

Every failure raised anywhere in core is an :class:`EngramError` carrying one of
the contract's codes. Retriability is data on the code, never a guess at the
call site. Exactly one module maps these to gRPC (``engram_core.rpc.status``)
and exactly one maps them to MCP (``adapters.mcp.envelope``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Code(StrEnum):
    """Contract error codes. Values are the wire strings, exactly."""

    INVALID_SCHEMA = "INVALID_SCHEMA"
    INVALID_DIGEST = "INVALID_DIGEST"
    UNAUTHORIZED = "UNAUTHORIZED"
    AUTHORIZATION_EXPIRED = "AUTHORIZATION_EXPIRED"
    AUTHORIZATION_REVOKED = "AUTHORIZATION_REVOKED"
    NOT_FOUND = "NOT_FOUND"
    DIGEST_CONFLICT = "DIGEST_CONFLICT"
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    ALREADY_TERMINAL = "ALREADY_TERMINAL"
    GATE_FAILED = "gate_failed"
    STALE_PAGE = "STALE_PAGE"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    PROJECTION_OVERSIZED = "PROJECTION_OVERSIZED"
    MUTATION_OUTCOME_UNKNOWN = "MUTATION_OUTCOME_UNKNOWN"
    RATE_LIMITED = "RATE_LIMITED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    FENCE_LOST = "FENCE_LOST"
    CURSOR_GAP = "CURSOR_GAP"
    POLICY_UNAVAILABLE = "POLICY_UNAVAILABLE"
    POLICY_STALE = "POLICY_STALE"
    PROJECTION_STALE = "PROJECTION_STALE"
    RANKING_UNAVAILABLE = "RANKING_UNAVAILABLE"
    CAPABILITY_UNAVAILABLE = "CAPABILITY_UNAVAILABLE"
    JOURNAL_CORRUPT = "JOURNAL_CORRUPT"
    BLOB_MISSING = "BLOB_MISSING"
    REGISTRY_VERSION_UNAVAILABLE = "REGISTRY_VERSION_UNAVAILABLE"
    BACKUP_INVALID = "BACKUP_INVALID"
    RESTORE_REFUSED = "RESTORE_REFUSED"
    MIGRATION_LEDGER_INVALID = "MIGRATION_LEDGER_INVALID"
    # Not an envelope code: the protocol-level refusal of SPEC §2. It travels
    # as gRPC UNAUTHENTICATED and MCP JSON-RPC -32603, never as an envelope.
    TRUSTED_CONTEXT_UNAVAILABLE = "TRUSTED_CONTEXT_UNAVAILABLE"


RETRIABLE: frozenset[Code] = frozenset(
    {
        Code.MUTATION_OUTCOME_UNKNOWN,
        Code.RATE_LIMITED,
        Code.DEADLINE_EXCEEDED,
        Code.CANCELLED,
        Code.STORE_UNAVAILABLE,
        Code.FENCE_LOST,
        Code.CURSOR_GAP,
        Code.POLICY_UNAVAILABLE,
        Code.POLICY_STALE,
        Code.PROJECTION_STALE,
        Code.RANKING_UNAVAILABLE,
    }
)

# Constant, sanitized messages: no ids, paths, digests, policy text or content.
MESSAGES: dict[Code, str] = {
    Code.INVALID_SCHEMA: "Arguments do not match the tool's schema.",
    Code.INVALID_DIGEST: "A digest is not in the required format.",
    Code.UNAUTHORIZED: "The operation is not authorized.",
    Code.AUTHORIZATION_EXPIRED: "The authorization has expired.",
    Code.AUTHORIZATION_REVOKED: "The authorization has been revoked.",
    Code.NOT_FOUND: "Not found.",
    Code.DIGEST_CONFLICT: "The idempotency key was already used for a different operation.",
    Code.ILLEGAL_TRANSITION: "The lifecycle does not allow this transition.",
    Code.ALREADY_TERMINAL: "The target is already in a terminal state.",
    Code.GATE_FAILED: "The confirmation or policy gate was not satisfied.",
    Code.STALE_PAGE: "The page cursor is no longer valid; restart the search.",
    Code.RESULT_TOO_LARGE: "The result does not fit the packet limit.",
    Code.PROJECTION_OVERSIZED: "A single record does not fit the packet limit.",
    Code.MUTATION_OUTCOME_UNKNOWN: "The outcome is unknown; retry with the same idempotency key.",
    Code.RATE_LIMITED: "Rate limited; retry later.",
    Code.DEADLINE_EXCEEDED: "The deadline was exceeded.",
    Code.CANCELLED: "The call was cancelled.",
    Code.STORE_UNAVAILABLE: "The store is unavailable; retry later.",
    Code.FENCE_LOST: "The writer fence was lost; retry later.",
    Code.CURSOR_GAP: "A cursor gap was detected; retry later.",
    Code.POLICY_UNAVAILABLE: "The policy decision is unavailable; retry later.",
    Code.POLICY_STALE: "The policy changed during the operation; retry.",
    Code.PROJECTION_STALE: "The search projection is stale; retry later.",
    Code.RANKING_UNAVAILABLE: "The requested ranking channel is unavailable.",
    Code.CAPABILITY_UNAVAILABLE: "The capability is unavailable.",
    Code.JOURNAL_CORRUPT: "The journal failed verification.",
    Code.BLOB_MISSING: "Stored content is missing.",
    Code.REGISTRY_VERSION_UNAVAILABLE: "The registry version is unavailable.",
    Code.BACKUP_INVALID: "The backup failed verification.",
    Code.RESTORE_REFUSED: "The restore was refused.",
    Code.MIGRATION_LEDGER_INVALID: "The migration ledger does not match this version.",
    Code.TRUSTED_CONTEXT_UNAVAILABLE: "Trusted invocation context unavailable",
}


# Constant messages per (code, reason class): what the agent can act on, never echoing input
# (no ids, paths, digests, policy text, field values or names the caller made up). A class
# the catalogue does not hold for a code gives the code's message above. NOT_FOUND has one
# message only: unknown and out of scope must stay indistinguishable (SPEC §2).
REFUSALS: dict[Code, dict[str, str]] = {
    Code.INVALID_SCHEMA: {
        "unknown_field": "An object has a field its schema does not define: check the spelling against the "
                         "tool's inputSchema. Every object is closed; host-bound values (tenant, principal, "
                         "confirmation) are never arguments.",
        "missing_field": "A required field is missing; see the tool's inputSchema and its examples.",
        "wrong_shape": "The arguments do not have this tool's shape (none of its required fields is present); "
                       "see the tool's inputSchema and its examples.",
        "wrong_type": "A field has the wrong JSON type, e.g. a string where an integer is required (times are "
                      "epoch-millisecond integers).",
        "value_not_allowed": "A field has a value its schema does not allow; see the field's enum or const.",
        "out_of_range": "A number or the length of a list is outside the bounds its schema states.",
        # Ranges and formats named by their field (issue 60 item 3): the field and its bound are the
        # schema's, never the caller's input.
        "limit_out_of_range": "limit is outside its bounds: an integer from 1 to 50.",
        "max_packet_bytes_out_of_range": "max_packet_bytes is outside its bounds: an integer from 4,096 to "
                                         "1,048,576.",
        "time_out_of_range": "A time (valid_time.t, valid_time.t_end or primary_event.at) is outside its "
                             "bounds: epoch milliseconds within ±9,007,199,254,740,991.",
        "components_count": "payload.components must hold 1 to 64 components.",
        "citations_count": "payload.citations must hold 1 to 256 citations.",
        "citation_ids_count": "A citation_ids list must hold 1 to 256 ids.",
        "family_refs_count": "reconciliation.family_refs holds at most 64 refs.",
        "record_id_format": "record_id must be a record id: mem_ followed by 52 characters a-z and 2-7, "
                            "copied exactly as search, get or the admission returned it (a candidate id, "
                            "cand_..., is not a record id).",
        "candidate_id_format": "candidate_id must be a candidate id: cand_ followed by characters a-z and "
                               "2-7, copied exactly as the capture returned it (a record id, mem_..., is not "
                               "a candidate id).",
        "instant_format": "An instant (retention.expires_at, observed_at) must be written "
                          "YYYY-MM-DDTHH:mm:ss.sssZ, in UTC with exactly milliseconds.",
        # One class per byte-bounded field, so the message names the bound that was broken.
        "query_length": "query is outside its bounds: 1-8,192 UTF-8 bytes.",
        "text_length": "A component's text is outside its bounds: 1-65,536 UTF-8 bytes.",
        "attestation_length": "evidence.attestation is longer than its bound: at most 4,096 UTF-8 bytes.",
        "idempotency_key_length": "idempotency_key is outside its bounds: 16-256 UTF-8 bytes (16 or more "
                                  "ASCII characters).",
        "ref_length": "A reference (purpose_ref, an id you chose, a citation id, source_ref, evidence_ref, "
                      "reason_ref, type_ref, a locator field or a family ref) is outside its bounds: "
                      "1-512 UTF-8 bytes.",
        "page_cursor_length": "page_cursor is outside its bounds (1-4,096 bytes): copy next_page_cursor "
                              "exactly as the previous page returned it.",
        "length_out_of_range": "A string's length is outside its bounds; see the field's description "
                               "(sizes are UTF-8 bytes).",
        "format": "A string does not have its required format (an id, an instant or a cursor); see the "
                  "field's pattern and description.",
        "duplicate_items": "A list that must hold unique items holds one twice.",
        "null_value": "null is never valid: omit an optional field instead.",
        "not_integer": "Numbers must be integers, written without a fraction or exponent.",
        "not_nfc": "A string is not in Unicode NFC form; normalize it to NFC before sending.",
        "citation_unresolved": "A citation id does not resolve: every id in citation_ids must equal a "
                               "citation_id of payload.citations.",
        "duplicate_id": "Two citations or two components share an id; ids must be unique.",
        "primary_unresolved": "primary_component_id must name a component, and primary_event.citation_id must "
                              "be in payload.citations and in the primary component's citation_ids.",
        "time_order": "valid_time.t_end is before valid_time.t.",
        "instant_invalid": "An instant is not a real UTC date with exactly milliseconds "
                           "(YYYY-MM-DDTHH:mm:ss.sssZ).",
        "expiry_not_future": "retention.expires_at must be after the capture time.",
        "families_unsorted": "reconciliation.family_refs must be sorted ascending.",
        "too_large": "The serialized arguments exceed 1,048,576 bytes.",
        "too_deep": "The arguments are nested deeper than any tool's schema.",
    },
    Code.INVALID_DIGEST: {
        "format": "A digest is not in the required format: sha256: followed by 64 lowercase hex digits "
                  "(content_digest, evidence_digest).",
    },
    Code.UNAUTHORIZED: {
        "credential": "The content looks like a credential or secret (a key, token, password, connection "
                      "string or private key). Secrets are never stored: remove it and capture again.",
        "retain_not_allowed": "The host does not permit retention.derivative_rule retain; omit retention.",
        "expiry_beyond_cap": "retention.expires_at is beyond the host's retention cap.",
        "family_not_consented": "A reconciliation family is not consented to by the host; omit "
                                "reconciliation unless told otherwise.",
        "time_before_floor": "valid_time.t or primary_event.at is earlier than the host accepts. Times are "
                             "epoch milliseconds: 2026-01-01T00:00:00.000Z is 1767225600000, not 1767225600 "
                             "(epoch seconds).",
        "time_beyond_horizon": "valid_time.t or primary_event.at is further in the future than the host "
                               "accepts. Times are epoch milliseconds: 2026-01-01T00:00:00.000Z is "
                               "1767225600000 (not micro- or nanoseconds).",
        "scope_not_active": "Memory is not active for this scope: the host operator must activate it.",
        "memory_disabled": "Memory is not enabled for this host.",
        "tool_not_granted": "This tool is not granted to you in this scope.",
        "host_only": "This operation is for host principals only.",
    },
    Code.GATE_FAILED: {
        "declined": "The human declined or cancelled the confirmation; nothing was changed.",
        "cannot_elicit": "This client cannot ask a human (it does not support MCP form elicitation), so the "
                         "confirmation this tool needs cannot be obtained; nothing was changed.",
        "timed_out": "The human did not answer the confirmation in time; nothing was changed.",
        "confirmation_invalid": "The confirmation did not verify (expired, already used or for another "
                                "operation); call the tool again to be asked again.",
    },
}

# Reason codes a host may record for a refusal it decided itself (HostService.RecordRefusal; issue
# 26.7), by code: the validation reasons (engram_core.contract.validation names each by its INVALID_SCHEMA
# class) and the MCP adapter's own confirmation and purpose reasons. Anything else is refused, so
# the audit table holds catalogue values only, never a string the caller chose. A host refusal
# with new reasons adds them here.
_VALIDATION_REASONS = frozenset(REFUSALS[Code.INVALID_SCHEMA])
HOST_REFUSAL_REASONS: dict[Code, frozenset[str]] = {
    Code.INVALID_SCHEMA: _VALIDATION_REASONS,
    Code.INVALID_DIGEST: _VALIDATION_REASONS,
    Code.GATE_FAILED: frozenset({"CONFIRMATION_DECLINED", "CONFIRMATION_STATE_INVALID", "CONFIRMATION_TIMED_OUT",
                                 "ELICITATION_FAILED", "ELICITATION_UNSUPPORTED"}),
    Code.TRUSTED_CONTEXT_UNAVAILABLE: frozenset({"PURPOSE_MISMATCH"}),
}

# Policy reason codes (Rego ``reasons[].code``) -> the class the agent is told, first match
# wins. A reason code not listed (a new deny rule) gives the code's plain message; logs and
# the audit row always carry the reason codes themselves.
POLICY_REASON_CLASSES: tuple[tuple[str, str], ...] = (
    ("SECRET_FINDINGS", "credential"),
    ("RETAIN_NOT_ALLOWED", "retain_not_allowed"),
    ("EXPIRY_BEYOND_CAP", "expiry_beyond_cap"),
    ("FAMILY_NOT_CONSENTED", "family_not_consented"),
    ("TIME_BEFORE_FLOOR", "time_before_floor"),
    ("TIME_BEYOND_HORIZON", "time_beyond_horizon"),
    ("SCOPE_NOT_ACTIVATED", "scope_not_active"),
    ("MEMORY_DISABLED", "memory_disabled"),
    ("TOOL_NOT_GRANTED", "tool_not_granted"),
    ("HOST_PRINCIPAL_REQUIRED", "host_only"),
)


def class_of_reasons(reasons: tuple[str, ...] | list[str]) -> str | None:
    """The refusal class of a set of policy reason codes (None: the code's plain message)."""
    for code, cls in POLICY_REASON_CLASSES:
        if code in reasons:
            return cls
    return None


def refusal_message(code: Code, reason_class: str | None) -> str:
    """The constant message for a code and (optional) reason class."""
    return REFUSALS.get(code, {}).get(reason_class or "", MESSAGES[code])


def known_class(code: Code, reason_class: str | None) -> str | None:
    """``reason_class`` if the catalogue holds it for ``code``, else None (untrusted wire input)."""
    return reason_class if reason_class and reason_class in REFUSALS.get(code, {}) else None


@dataclass(frozen=True)
class ErrorBody:
    """The `error` object of a failure envelope."""

    code: str
    message: str
    retriable: bool


class EngramError(Exception):
    """A contract failure.

    ``detail`` is for logs only and never leaves the process. ``reason_class`` picks the
    constant message the caller sees (``REFUSALS``); ``reasons`` (policy or validation reason
    codes) and ``pointer`` (a JSON pointer into the arguments made of schema names and
    indices only) are for logs and the audit row. ``audited`` is set once a service wrote the
    call's audit row itself, so the refusal is not audited twice. ``confirmation_required``
    marks the refusal of a gated call that carried no confirmation at all (SPEC §8: the
    protocol refusal): it tells the host, not the agent, that a human must be asked, which
    the host cannot always know beforehand (the capture policy decides on the capture's facts).
    """

    def __init__(self, code: Code, detail: str = "", *, reason_class: str | None = None,
                 reasons: tuple[str, ...] = (), pointer: str = "", audited: bool = False,
                 confirmation_required: bool = False) -> None:
        super().__init__(f"{code.value}: {detail}" if detail else code.value)
        self.code = code
        self.detail = detail
        self.reason_class = known_class(code, reason_class)
        self.reasons = tuple(reasons)
        self.pointer = pointer
        self.audited = audited
        self.confirmation_required = confirmation_required
        self.decisions: list[dict[str, object]] = []  # summaries of the decisions taken before it

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    @property
    def message(self) -> str:
        return refusal_message(self.code, self.reason_class)

    def body(self) -> ErrorBody:
        return ErrorBody(code=self.code.value, message=self.message, retriable=self.retriable)

    def log_fields(self) -> dict[str, object]:
        """What logs and audit rows record about the refusal (never input values)."""
        fields: dict[str, object] = {"code": self.code.value}
        if self.reason_class:
            fields["reason_class"] = self.reason_class
        if self.reasons:
            fields["reason_codes"] = list(self.reasons)
        if self.pointer:
            fields["pointer"] = self.pointer
        if self.detail:
            fields["detail"] = self.detail
        return fields


def error_body(code: Code, reason_class: str | None = None) -> dict[str, object]:
    """The envelope `error` object for a code (and reason class), as plain JSON."""
    return {"code": code.value, "message": refusal_message(code, known_class(code, reason_class)),
            "retriable": code in RETRIABLE}
