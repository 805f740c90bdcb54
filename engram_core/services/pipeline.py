"""The one request pipeline every mutation goes through, agent tools and host maintenance alike.

A tool call is validated and canonicalized once (``prepare``): the result, a ``PreparedCall``,
carries the arguments' canonical form and every digest the call needs (target, request digest,
operation digest), and each later step reads them from it instead of serializing the arguments
again. Then the mutation guard (SPEC §7: ``stored_outcome`` under a ``Guard``), the one
precondition of every withdraw and tombstone (``gated_precondition``: HostService.CheckGated,
the agents' withdraw and forget, and the host's), and the transaction receipt a committed
mutation answers with. Host paths key their idempotency rows by ``event_id`` and go through the
same functions, so a host forget and an agent forget cannot disagree on what "the same request"
means (docs/architecture.md, "One request pipeline").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from engram_core.contract.canonical import Canonical, with_receipt_digest
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import operation_digest, request_digest, target_of
from engram_core.contract.validation import canonical_arguments
from engram_core.services.core import CallRecord, Core
from engram_core.store.port import Tx
from engram_core.trust.hostctx import BoundContext


class _Stateful(Protocol):
    """A lifecycle target: a candidate or a record row."""

    @property
    def state(self) -> str: ...


T = TypeVar("T", bound=_Stateful)


@dataclass(frozen=True)
class Guard:
    """What the mutation guard (SPEC §7) keys a mutation by, and compares on a reused key."""

    tool: str
    target: str
    key: str  # the idempotency key (agents) or the event id (hosts)
    request_digest: str


@dataclass(frozen=True)
class PreparedCall:
    """One tool call, validated and canonicalized once, with what every later step needs of it.

    ``body`` is the arguments' RFC 8785 form with its members (and theirs) kept, so a step that
    digests or seals a part of the arguments splices that part's text (``Canonical``)."""

    tool: str
    arguments: Mapping[str, Any]  # as received: validated, never normalized
    body: Canonical
    target: str
    request_digest: str  # SPEC §7: tool, target, arguments except the idempotency key
    operation_digest: str  # SPEC §8: what a confirmation is bound to (the caller's scope and principal too)

    def member(self, name: str) -> Canonical:
        """The canonical form of one argument (``payload``, ``evidence``, ...)."""
        assert self.body.members is not None
        return self.body.members[name]

    @property
    def guard(self) -> Guard:
        return Guard(self.tool, self.target, str(self.arguments["idempotency_key"]), self.request_digest)


def prepare(ctx: BoundContext, tool: str, arguments: Any) -> PreparedCall:
    """Validate ``arguments`` against ``tool``'s closed schema (INVALID_SCHEMA, INVALID_DIGEST)
    and compute, from one canonical walk, everything the call's steps use."""
    body = canonical_arguments(tool, arguments)
    # The digests splice the members' canonical texts: the same digests as of the raw arguments
    # (the adapter's), without serializing them again.
    return PreparedCall(
        tool=tool, arguments=arguments, body=body, target=target_of(tool, arguments),
        request_digest=request_digest(tool, body),
        operation_digest=operation_digest(tool=tool, tenant=ctx.tenant, workspace=ctx.workspace,
                                          principal=ctx.principal, arguments=body),
    )


def stored_outcome(tx: Tx, ctx: BoundContext, *, tool: str, target: str, key: str,
                   request_digest: str) -> dict[str, Any] | None:
    """The mutation guard (SPEC §7): the stored outcome for this key of this principal, None
    when the key is new, DIGEST_CONFLICT when it was used for another tool, target or content.
    Agent idempotency keys and host event ids share it."""
    row = tx.idempotency_get(ctx.scope, ctx.principal, key)
    if row is None:
        return None
    if row.tool != tool or row.target != target or row.request_digest != request_digest:
        raise EngramError(Code.DIGEST_CONFLICT, "idempotency key reused")
    return row.outcome


def guarded_outcome(tx: Tx, ctx: BoundContext, guard: Guard) -> dict[str, Any] | None:
    """``stored_outcome`` of ``guard``."""
    return stored_outcome(tx, ctx, tool=guard.tool, target=guard.target, key=guard.key,
                          request_digest=guard.request_digest)


def require_grant(grant: bytes | None) -> bytes:
    """SPEC §8: a gated call that reaches the core with no confirmation at all is a protocol
    refusal (-32603 on MCP), not gate_failed."""
    if not grant:
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "confirmation missing", confirmation_required=True)
    return grant


@dataclass(frozen=True)
class Standing(Generic[T]):
    """What a withdraw or tombstone found before it changes anything: the stored outcome of
    its key (``replay``), or else its target, present and able to make the transition."""

    replay: dict[str, Any] | None
    target: T | None


def gated_precondition(core: Core, ctx: BoundContext, guard: Guard, *, lookup: Callable[[Tx], T | None],
                       check_state: Callable[[str], object], grant: bytes | None = None,
                       grant_required: bool = False, what: str = "target") -> Standing[T]:
    """The one precondition of every withdraw and tombstone: HostService.CheckGated (before a
    human is asked), the agents' withdraw and forget, and the host's transitions. In order:

    1. the stored outcome of the key: a request made before (same key, same arguments) answers
       with what it answered, grant or no grant (SPEC §7); another tool, target or content
       under the key is DIGEST_CONFLICT;
    2. a grant present, when ``grant_required`` (the agents' calls): else -32603 (SPEC §8);
    3. the target, in the caller's scope: else NOT_FOUND;
    4. the lifecycle (``check_state`` on the target's state): ILLEGAL_TRANSITION, ALREADY_TERMINAL.

    ``what`` names the target in the refusal's detail (logs only; the message is the code's).

    Validation and authorization come before (each caller's own operation); verifying the grant
    and the write transaction, which checks 1, 3 and 4 again under the writer lock, come after.
    No snapshot: the target is read first, then the key, each at the latest commit, so a winner
    with the same key committing between the two reads is seen as a replay, never as a target
    already terminal."""
    with core.store.read(snapshot=False) as tx:
        target = lookup(tx)
        prior = guarded_outcome(tx, ctx, guard)
    if prior is not None:
        return Standing(replay=prior, target=None)
    if grant_required:
        require_grant(grant)
    if target is None:
        raise EngramError(Code.NOT_FOUND, what)
    check_state(target.state)
    return Standing(replay=None, target=target)


def transaction_receipt_digest(core: Core, operation: str, event_digest: str, cursor: int, call: CallRecord,
                               audit_id: str, extra: dict[str, Any] | None = None) -> str:
    """The ``transaction_receipt_digest`` of a committed mutation: its journal event, the
    decisions it was made under, the bundle revision and the commit time."""
    return with_receipt_digest(
        {
            **(extra or {}),
            "kind": "transaction",
            "operation": operation,
            "cursor": str(cursor),
            "event_digest": event_digest,
            "audit_id": audit_id,
            "decisions": [d.decision_id for d in call.decisions],
            "policy_revision": core.policy.revision(),
            "committed_at": core.instant(),
        }
    )["receipt_digest"]
