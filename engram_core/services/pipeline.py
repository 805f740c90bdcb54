"""The request pipeline every mutation shares, agent tools and host maintenance alike.

The mutation guard's request digest and its stored outcome (SPEC §7), and the transaction
receipt a committed mutation answers with. Agent tools and host paths (which key their
idempotency rows by ``event_id``) go through the same functions, so a host forget and an
agent forget cannot disagree on what "the same request" means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engram_core.canonical import digest, with_receipt_digest
from engram_core.errors import Code, EngramError
from engram_core.hostctx import BoundContext
from engram_core.operation import target_of
from engram_core.services.core import CallRecord, Core
from engram_core.store.port import Tx


def request_digest_of(tool: str, arguments: Mapping[str, Any]) -> str:
    """SPEC §7: what "the same request" is: the tool, its target and its arguments except the
    idempotency key (docs/digests.md, kind ``request``)."""
    return digest("request", {"tool": tool, "target": target_of(tool, arguments),
                              "arguments": {k: v for k, v in arguments.items() if k != "idempotency_key"}})


def stored_outcome(tx: Tx, ctx: BoundContext, *, tool: str, target: str, key: str,
                   request_digest: str) -> dict[str, Any] | None:
    """The mutation guard (SPEC §7): the stored outcome for this key of this principal, None
    when the key is new, DIGEST_CONFLICT when it was used for another tool, target or content.
    Agent idempotency keys and host event ids share it."""
    row = tx.idempotency_get(ctx.tenant, ctx.workspace, ctx.principal, key)
    if row is None:
        return None
    if row.tool != tool or row.target != target or row.request_digest != request_digest:
        raise EngramError(Code.DIGEST_CONFLICT, "idempotency key reused")
    return row.outcome


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
