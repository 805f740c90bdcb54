"""Host lifecycle transitions (SPEC §6): dispute, supersede, rewind, tombstone, candidate ends,
and the retention sweep that expires records the policy says are due."""

from __future__ import annotations

from typing import Any

from engram_core.contract.canonical import digest
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import request_digest
from engram_core.contract.scope import Scope
from engram_core.contract.tools import FORGET_TOOL, WITHDRAW_TOOL
from engram_core.policy.port import RETENTION
from engram_core.services import lifecycle
from engram_core.services.core import CallRecord, context_facts, new_id
from engram_core.services.derivatives import apply_derivative_rule
from engram_core.services.maintenance.base import EVENT_ID, HostOps, checked_ref
from engram_core.services.pipeline import (
    Guard,
    gated_precondition,
    stored_outcome,
    transaction_receipt_digest,
)
from engram_core.store.port import IdempotencyRow, RecordRow
from engram_core.trust.hostctx import BoundContext

TRANSITION_TOOL = "admin.transition"
RECORD_OPS = frozenset({"dispute", "resolve_dispute", "supersede", "mark_non_current", "rewind", "trust_invalidate"})
CANDIDATE_OPS = {"reject": "rejected", "withdraw": "withdrawn"}
TRANSITION_OPS = RECORD_OPS | {"tombstone"} | set(CANDIDATE_OPS)
EXPIRABLE = ("accepted_current", "accepted_disputed", "historical")


class TransitionOps(HostOps):
    # -- lifecycle (SPEC §6) ------------------------------------------------------------------
    def transition(self, ctx: BoundContext, req: dict[str, Any]) -> dict[str, Any]:
        call = self.authorize(ctx, "transition", [v for v in req.values() if isinstance(v, str)],
                              target=Scope(req.get("tenant", ""), req.get("workspace", "")))
        op = req.get("operation", "")
        if op not in TRANSITION_OPS:
            raise EngramError(Code.INVALID_SCHEMA, "unknown operation")
        tctx = self.target_ctx(ctx, Scope(req.get("tenant", ""), req.get("workspace", "")))
        target = checked_ref(req.get("target", ""), "target")
        event_id = req.get("event_id", "")
        if not EVENT_ID.match(event_id):
            raise EngramError(Code.INVALID_SCHEMA, "event_id")
        reason = checked_ref(req.get("reason_ref", ""), "reason_ref")
        successor, to_state = req.get("successor", ""), req.get("to_state", "")
        if (successor and op not in ("supersede", "rewind")) or (to_state and op != "resolve_dispute"):
            raise EngramError(Code.INVALID_SCHEMA, "argument not valid for this operation")
        if op == "tombstone":
            return self._tombstone(tctx, call, target, event_id, reason)
        if op in CANDIDATE_OPS:
            return self._candidate_end(tctx, call, op, target, event_id, reason)
        return self._record_transition(tctx, call, op, target, successor, to_state, reason, event_id)

    def _tombstone(self, tctx: BoundContext, call: CallRecord, record_id: str, event_id: str, reason: str) -> dict[str, Any]:
        args = {"record_id": record_id, "idempotency_key": event_id, "reason_ref": reason, "by": "host"}
        guard = Guard(FORGET_TOOL, record_id, event_id, request_digest(FORGET_TOOL, args))
        standing = gated_precondition(self.core, tctx, guard, what="record",
                                      lookup=lambda tx: tx.record(tctx.scope, record_id),
                                      check_state=lambda state: lifecycle.check_record("tombstone", state))
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        # Mutations.tombstone: body key shredded, projections dropped, ledger, journal, audit — one transaction.
        return self.mutations.tombstone(tctx, record_id, call, guard=guard, grant_id=None, reason_ref=reason,
                                        event_id=event_id, audit_operation="admin.tombstone")

    def _candidate_end(self, tctx: BoundContext, call: CallRecord, op: str, candidate_id: str, event_id: str,
                       reason: str) -> dict[str, Any]:
        args = {"candidate_id": candidate_id, "idempotency_key": event_id, "reason_ref": reason, "operation": op}
        guard = Guard(WITHDRAW_TOOL, candidate_id, event_id, request_digest(WITHDRAW_TOOL, args))
        standing = gated_precondition(self.core, tctx, guard, what="candidate",
                                      lookup=lambda tx: tx.candidate(tctx.scope, candidate_id),
                                      check_state=lambda state: lifecycle.check_candidate(op, state))
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        assert standing.target is not None
        return self.mutations.withdraw_candidate(tctx, standing.target, call, guard=guard, grant_id=None,
                                                 reason_ref=reason, operation=op, to_state=CANDIDATE_OPS[op],
                                                 event_id=event_id, audit_operation=f"admin.{op}")

    def _record_transition(self, tctx: BoundContext, call: CallRecord, op: str, target: str, successor: str,
                           to_state: str, reason: str, event_id: str) -> dict[str, Any]:
        rd = digest("request", {"tool": TRANSITION_TOOL, "target": target,
                                "arguments": {"operation": op, "successor": successor, "to_state": to_state,
                                              "reason_ref": reason}})
        now = self.core.now_ms()
        authz_digest = self.core.decision_receipt(call.decisions[0])["receipt_digest"]
        t, w = tctx.tenant, tctx.workspace
        with self.core.store.write() as tx:
            prior = stored_outcome(tx, tctx, tool=TRANSITION_TOOL, target=target, key=event_id, request_digest=rd)
            if prior is not None:
                return {**prior, "replayed": True}
            self.core.check_revision(call)
            rec = tx.record(Scope(t, w), target)
            if rec is None:
                raise EngramError(Code.NOT_FOUND, "record")
            # Every check happens before the first cursor is allocated (SPEC §6).
            new_state = lifecycle.check_record(op, rec.state, to_state or None)
            succ = None
            if op in ("supersede", "rewind"):
                if not successor or successor == target:
                    raise EngramError(Code.INVALID_SCHEMA, f"{op} names a successor other than the target")
                succ = tx.record(Scope(t, w), successor)
                if succ is None:
                    raise EngramError(Code.NOT_FOUND, "successor")
                if succ.state != "accepted_current":
                    raise EngramError(Code.ILLEGAL_TRANSITION, "successor is not accepted_current")
            body = {"reason_ref": reason, "decisions": call.summaries(), "audit_id": tctx.audit_id}
            if successor:
                body["successor"] = successor
            revoked = op == "trust_invalidate" and rec.trust_class != "asserted"
            if revoked:
                body["trust_class_revoked"] = rec.trust_class  # a host attestation is taken back
            event = tx.append_event(Scope(t, w), event_id=event_id, operation=op, target=target, from_state=rec.state,
                                    to_state=new_state, at_ms=now, body=body)
            tx.set_record_state(target, new_state, state_cursor=event.cursor,
                                successor_id=successor if op == "supersede" else ("" if op == "rewind" else None))
            receipt: dict[str, Any] = {
                "event_id": event.event_id, "operation": op, "target": target, "from_state": rec.state,
                "to_state": new_state, "cursor": str(event.cursor), "event_digest": event.event_digest,
                "authorization_receipt_digest": authz_digest,
                "transaction_receipt_digest": transaction_receipt_digest(self.core, op, event.event_digest, event.cursor, call,
                                                                         tctx.audit_id),
            }
            if successor:
                receipt["successor"] = successor
            if revoked:
                tx.set_record_trust_class(target, "asserted")
                receipt["trust_class_revoked"] = rec.trust_class
            if op == "trust_invalidate":
                # SPEC §5 derivative_rule: the source's rule decides what happens to its derivatives.
                receipt["derivatives"] = apply_derivative_rule(tx, tctx, rec, cause="trust_invalidate",
                                                               cause_event_id=event_id, now=now, call=call)
            if op == "rewind" and succ is not None:
                # The successor steps back in the same transaction: never two current versions.
                demoted = tx.append_event(
                    Scope(t, w), event_id=f"{event_id}/successor", operation="mark_non_current", target=successor,
                    from_state=succ.state, to_state="historical", at_ms=now,
                    body={**body, "rewound": target},
                )
                tx.set_record_state(successor, "historical", state_cursor=demoted.cursor, successor_id=target)
                receipt["successor_event"] = {"cursor": str(demoted.cursor), "event_digest": demoted.event_digest,
                                              "from_state": succ.state, "to_state": "historical"}
            outcome = {"receipt": receipt}
            tx.idempotency_put(Scope(t, w), tctx.principal, event_id, IdempotencyRow(TRANSITION_TOOL, target, rd, outcome), now)
            tx.append_audit(self.core.audit_row(tctx, f"admin.{op}", new_state, target, call))
        return {**outcome, "replayed": False}

    def expire_sweep(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        """Expire records whose ``expires_at`` passed, as the retention policy decides (SPEC §6)."""
        authz = self.authorize(ctx, "expire_sweep", target=scope)
        now = self.core.now_ms()
        with self.core.store.read() as tx:
            scopes = [scope] if scope.tenant else [Scope(s.tenant, s.workspace) for s in tx.scopes()]
        report = []
        for each in scopes:
            tctx = self.target_ctx(ctx, each)
            with self.core.store.read() as tx:
                recs = [r for r in tx.scope_records(each, EXPIRABLE) if r.expires_at_ms is not None]
            due: list[tuple[RecordRow, CallRecord]] = []
            for rec in recs:
                call = CallRecord([*authz.decisions])
                d = self.core.decide(RETENTION, {
                    "context": context_facts(tctx), "now_ms": now,
                    "record": {"state": rec.state, "expires_at_ms": rec.expires_at_ms,
                               "derivative_rule": rec.derivative_rule, "trust_class": rec.trust_class}}, call)
                if d.result.get("allow") and d.result.get("action") == "expire":
                    due.append((rec, call))
            expired = []
            for rec, call in due:
                with self.core.store.write() as tx:
                    self.core.check_revision(call)
                    current = tx.record(each, rec.record_id)
                    if current is None or current.state not in EXPIRABLE:
                        continue  # moved on since the decision; nothing to do
                    event = tx.append_event(each, event_id=new_id("evt_"), operation="expire", target=rec.record_id,
                                            from_state=current.state, to_state="expired", at_ms=now,
                                            body={"reason_ref": "retention:expires_at", "decisions": call.summaries(),
                                                  "audit_id": tctx.audit_id})
                    tx.set_record_state(rec.record_id, "expired", state_cursor=event.cursor)
                    derivatives = apply_derivative_rule(tx, tctx, current, cause="expire",
                                                        cause_event_id=event.event_id, now=now, call=call)
                    tx.append_audit(self.core.audit_row(tctx, "admin.expire", "expired", rec.record_id, call))
                expired.append({"record_id": rec.record_id, "from_state": current.state, "cursor": str(event.cursor),
                                "event_digest": event.event_digest, "derivatives": derivatives})
            report.append({"tenant": each.tenant, "workspace": each.workspace, "examined": len(recs), "expired": expired})
        self._audit(ctx, "expire_sweep", "ok", scope.tenant and str(scope), authz)
        return {"now": self.core.instant(now), "scopes": report}
