"""Adjudication (SPEC §6): the candidates the policy held for a human, with the reasons it gave,
and a human's accept or reject through the same admission path as an agent's."""

from __future__ import annotations

from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import request_digest
from engram_core.contract.scope import Scope
from engram_core.contract.tools import ADMISSION_TOOL
from engram_core.services import lifecycle
from engram_core.services.maintenance.base import EVENT_ID, HostOps, checked_ref, facts_of, sizes_of
from engram_core.services.pipeline import Guard, gated_precondition
from engram_core.trust.hostctx import BoundContext


class AdjudicationOps(HostOps):
    # -- adjudication ------------------------------------------------------------------------
    def list_adjudication(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        call = self.authorize(ctx, "list_adjudication", target=scope)
        tctx = self.target_ctx(ctx, scope)
        with self.core.store.read() as tx:
            cands = tx.candidates_in_state(scope, "pending_adjudication")
            reasons: dict[str, set[str]] = {}
            # A candidate's admission events follow its capture: read the journal from the oldest
            # pending capture on, not from the scope's first event (the console's review queue at
            # 100k records in a scope, issue 61).
            first = min((c.cursor for c in cands), default=None)
            for e in tx.events(scope, first, None) if first is not None else ():
                if e.operation == "adjudication_required":
                    codes = reasons.setdefault(e.target, set())
                    for d in e.body.get("decisions", []):
                        codes.update(c for c in d.get("reason_codes", []) if c)
            items = []
            for c in cands:
                codes = reasons.get(c.candidate_id, set())
                if tx.tombstoned(scope, c.payload_digest):
                    codes = codes | {"FORGOTTEN_CONTENT"}  # SPEC §5 core invariant, not a policy reason
                items.append({"candidate_id": c.candidate_id, "payload_digest": c.payload_digest,
                              "record_digest": c.record_digest, "trust_class": c.trust_class,
                              "captured_at": self.core.instant(c.captured_at_ms), "cursor": str(c.cursor),
                              "sizes": sizes_of(facts_of(self.core, tx, c)), "reasons": sorted(codes)})
        self._audit(tctx, "list_adjudication", "ok", "", call)
        return {"tenant": scope.tenant, "workspace": scope.workspace, "candidates": items}

    def adjudicate(self, ctx: BoundContext, req: dict[str, Any]) -> dict[str, Any]:
        call = self.authorize(ctx, "adjudicate", [v for v in req.values() if isinstance(v, str)],
                              target=Scope(req.get("tenant", ""), req.get("workspace", "")))
        tctx = self.target_ctx(ctx, Scope(req.get("tenant", ""), req.get("workspace", "")))
        decision = req.get("decision", "")
        if decision not in ("accept", "reject"):
            raise EngramError(Code.INVALID_SCHEMA, "decision")
        candidate_id = checked_ref(req.get("candidate_id", ""), "candidate_id")
        reason = checked_ref(req.get("reason_ref", ""), "reason_ref")
        event_id = req.get("event_id", "")
        if not EVENT_ID.match(event_id):
            raise EngramError(Code.INVALID_SCHEMA, "event_id")
        args = {"candidate_id": candidate_id, "idempotency_key": event_id, "decision": decision, "reason_ref": reason}
        guard = Guard(ADMISSION_TOOL, candidate_id, event_id, request_digest(ADMISSION_TOOL, args))

        def adjudicable(state: str) -> None:
            lifecycle.check_candidate(decision, state)
            if state != "pending_adjudication":
                raise EngramError(Code.ILLEGAL_TRANSITION, "candidate is not pending adjudication")

        # The same precondition as a withdraw: stored outcome, target, lifecycle.
        standing = gated_precondition(self.core, tctx, guard, what="candidate", check_state=adjudicable,
                                      lookup=lambda tx: tx.candidate(tctx.scope, candidate_id))
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        assert standing.target is not None
        return self.mutations.admit(tctx, standing.target, call, guard=guard, forced=decision, reason_ref=reason,
                                    event_id=event_id, audit_operation="admin.adjudicate")
