"""The lifecycle of SPEC §6 as data: which operation moves which state where."""

from __future__ import annotations

from engram_core.contract.errors import Code, EngramError

CANDIDATE_TERMINAL = frozenset({"rejected", "withdrawn", "accepted"})
RECORD_TERMINAL = frozenset({"tombstoned"})
ACCEPTED = ("accepted_current", "accepted_disputed")

# operation -> (allowed from-states, to-state or None when the caller names it)
RECORD_TRANSITIONS: dict[str, tuple[frozenset[str], str | None]] = {
    "dispute": (frozenset({"accepted_current"}), "accepted_disputed"),
    "resolve_dispute": (frozenset({"accepted_disputed"}), None),  # accepted_current | historical
    "supersede": (frozenset(ACCEPTED), "historical"),
    "mark_non_current": (frozenset(ACCEPTED), "historical"),
    "rewind": (frozenset({"historical"}), "accepted_current"),
    "expire": (frozenset({*ACCEPTED, "historical"}), "expired"),
    "trust_invalidate": (frozenset({*ACCEPTED, "historical"}), "trust_invalid"),
    "tombstone": (frozenset({*ACCEPTED, "historical", "expired", "trust_invalid"}), "tombstoned"),
}

CANDIDATE_TRANSITIONS: dict[str, tuple[frozenset[str], str]] = {
    "accept": (frozenset({"pending", "pending_adjudication"}), "accepted"),
    "reject": (frozenset({"pending", "pending_adjudication"}), "rejected"),
    "withdraw": (frozenset({"pending", "pending_adjudication"}), "withdrawn"),
    "adjudication_required": (frozenset({"pending"}), "pending_adjudication"),
}


def check_record(operation: str, state: str, to_state: str | None = None) -> str:
    """The target state, or ILLEGAL_TRANSITION / ALREADY_TERMINAL (before any cursor)."""
    allowed, fixed = RECORD_TRANSITIONS[operation]
    if state in RECORD_TERMINAL:
        raise EngramError(Code.ALREADY_TERMINAL, f"record is {state}")
    if state not in allowed:
        raise EngramError(Code.ILLEGAL_TRANSITION, f"{operation} from {state}")
    target = fixed or to_state
    if operation == "resolve_dispute" and target not in ("accepted_current", "historical"):
        raise EngramError(Code.INVALID_SCHEMA, "resolve_dispute needs accepted_current or historical")
    return target  # type: ignore[return-value]


def check_candidate(operation: str, state: str) -> str:
    allowed, target = CANDIDATE_TRANSITIONS[operation]
    if state in ("rejected", "withdrawn"):
        raise EngramError(Code.ALREADY_TERMINAL, f"candidate is {state}")
    if state not in allowed:
        raise EngramError(Code.ILLEGAL_TRANSITION, f"{operation} from {state}")
    return target
