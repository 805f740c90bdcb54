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


@dataclass(frozen=True)
class ErrorBody:
    """The `error` object of a failure envelope."""

    code: str
    message: str
    retriable: bool


class EngramError(Exception):
    """A contract failure. ``detail`` is for logs only and never leaves the process."""

    def __init__(self, code: Code, detail: str = "") -> None:
        super().__init__(f"{code.value}: {detail}" if detail else code.value)
        self.code = code
        self.detail = detail

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    @property
    def message(self) -> str:
        return MESSAGES[self.code]

    def body(self) -> ErrorBody:
        return ErrorBody(code=self.code.value, message=self.message, retriable=self.retriable)


def error_body(code: Code) -> dict[str, object]:
    """The envelope `error` object for a code, as plain JSON."""
    return {"code": code.value, "message": MESSAGES[code], "retriable": code in RETRIABLE}
