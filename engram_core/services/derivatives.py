"""Derivative rules (SPEC §5 ``retention.derivative_rule``).

A derivative is a record whose citation names another record of the same scope
as its source (``source_ref`` = that record's ``record_id``; linked at admission,
see ``services.reconciliation.write_links``). When a source leaves eligibility
(forget, expire, trust invalidation), the *source's* rule applies to its
derivatives, in the same transaction: ``make-ineligible`` moves each eligible
derivative to ``trust_invalid`` (its basis no longer holds; SPEC §6 allows
trust_invalidate from accepted_* and historical), one journal event each, and
that derivative's own rule then applies to its derivatives in turn;
``retain`` leaves them as they are.
"""

from __future__ import annotations

from typing import Any

from engram_core.services.core import CallRecord
from engram_core.store.port import RecordRow, Tx
from engram_core.trust.hostctx import BoundContext

MAKE_INELIGIBLE = "make-ineligible"
_ELIGIBLE_BEFORE = ("accepted_current", "accepted_disputed", "historical")


def apply_derivative_rule(tx: Tx, ctx: BoundContext, source: RecordRow, *, cause: str, cause_event_id: str,
                          now: int, call: CallRecord) -> list[dict[str, Any]]:
    """Make the derivatives of ``source`` ineligible when its rule says so; what changed, in order."""
    changed: list[dict[str, Any]] = []
    queue, seen = [source], {source.record_id}
    while queue:
        src = queue.pop(0)
        if src.derivative_rule != MAKE_INELIGIBLE:
            continue
        for d in tx.derivatives(ctx.scope, src.record_id):
            if d.record_id in seen or d.state not in _ELIGIBLE_BEFORE:
                continue
            seen.add(d.record_id)
            event = tx.append_event(
                ctx.scope, event_id=f"{cause_event_id}/derivative/{len(changed) + 1}",
                operation="trust_invalidate", target=d.record_id, from_state=d.state, to_state="trust_invalid",
                at_ms=now, body={"reason_ref": "derivative_rule:make-ineligible", "source": src.record_id,
                                 "cause": cause, "decisions": call.summaries(), "audit_id": ctx.audit_id,
                                 **({"trust_class_revoked": d.trust_class} if d.trust_class != "asserted" else {})},
            )
            tx.set_record_state(d.record_id, "trust_invalid", state_cursor=event.cursor)
            if d.trust_class != "asserted":
                tx.set_record_trust_class(d.record_id, "asserted")  # trust invalidation undoes attestations
            changed.append({"record_id": d.record_id, "source": src.record_id, "from_state": d.state,
                            "to_state": "trust_invalid", "cursor": str(event.cursor),
                            "event_digest": event.event_digest})
            queue.append(d)
    return changed
