"""Host maintenance (SPEC §12): lifecycle transitions, adjudication, reads, keys, projections.

Every operation authorizes the *host* context for ``admin.<op>`` (policy asks
for a host principal holding the ``read`` or ``maintain`` scope), then acts on
the target scope named in the request through a derived context, so journal
events, idempotency rows and audit rows land in the scope they concern while
keeping the host's principal and audit id.

Host mutations are idempotent by the request's ``event_id``: it is the key of
an idempotency row in the target scope under the host principal, written in
the same transaction as the effect (SPEC §7). Backup and restore live in
``engram_core.services.backup``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from engram_core.canonical import digest, with_receipt_digest
from engram_core.crypto.sealing import unseal
from engram_core.errors import Code, EngramError
from engram_core.hostctx import BoundContext
from engram_core.hostkeys import key_id, load_public_pem, public_pem
from engram_core.policy.port import RETENTION, BundleRefused
from engram_core.services import keyring, lifecycle
from engram_core.services.admin import target_facts
from engram_core.services.core import CallRecord, Core, context_facts, new_id
from engram_core.services.derivatives import apply_derivative_rule
from engram_core.services.host import LAST_ANCHOR_META
from engram_core.services.lexical import ANALYZER_ID, record_fields
from engram_core.services.memory import MemoryService, candidate_facts, record_text
from engram_core.services.pipeline import (
    Guard,
    gated_precondition,
    request_digest_of,
    stored_outcome,
    transaction_receipt_digest,
)
from engram_core.services.reconciliation import payload_links, write_links
from engram_core.signing import ANCHOR_DOMAIN, CoreSigners, public_keys_from_pems, verify_signature
from engram_core.store.chain import GENESIS, LEGACY_CHAIN, by_chain, check_audit, event_digest_of, scope_chain
from engram_core.store.fields import FIELD_CODE
from engram_core.store.port import CandidateRow, Event, HostKeyRow, IdempotencyRow, RecordRow, ScopeRow, Tx
from engram_core.store.projection import Projection
from engram_core.tools import ADMISSION_TOOL, FORGET_TOOL, WITHDRAW_TOOL

log = logging.getLogger("engram.maintenance")

TRANSITION_TOOL = "admin.transition"
RECORD_OPS = frozenset({"dispute", "resolve_dispute", "supersede", "mark_non_current", "rewind", "trust_invalidate"})
CANDIDATE_OPS = {"reject": "rejected", "withdraw": "withdrawn"}
TRANSITION_OPS = RECORD_OPS | {"tombstone"} | set(CANDIDATE_OPS)
EXPIRABLE = ("accepted_current", "accepted_disputed", "historical")
INDEXED_STATES = ("accepted_current", "accepted_disputed", "historical", "expired", "trust_invalid")
ANCHOR_FORMAT = "engram-anchor/v2"  # v2: a head per audit chain (v1, one audit head, still verifies)
ANCHOR_FORMATS = ("engram-anchor/v1", ANCHOR_FORMAT)
_CURSOR = re.compile(r"^(0|[1-9][0-9]{0,19})$")
_EVENT_ID = re.compile(r"^[A-Za-z0-9_.:/-]{16,256}$")
# The maintenance scopes of SPEC §12 a host key may be bound to (what each permits is the policy's).
MAINTENANCE_SCOPES = ("read", "maintain")


def _ref(value: str, what: str) -> str:
    if not value or len(value.encode()) > 512:
        raise EngramError(Code.INVALID_SCHEMA, f"{what} must be 1-512 bytes")
    return value


def parse_cursor(value: str, default: int | None) -> int | None:
    """SPEC §4 cursor: decimal, no leading zeros, ≤ 2^64−1; empty means ``default``."""
    if not value:
        return default
    if not _CURSOR.match(value) or int(value) > 2**64 - 1:
        raise EngramError(Code.INVALID_SCHEMA, "cursor")
    return int(value)


def event_doc(e: Event) -> dict[str, Any]:
    """A journal event as exported and as its digest covers it (plus the digest)."""
    return {"tenant": e.tenant, "workspace": e.workspace, "cursor": str(e.cursor), "event_id": e.event_id,
            "operation": e.operation, "target": e.target, "from_state": e.from_state, "to_state": e.to_state,
            "at_ms": e.at_ms, "body": e.body, "prev_digest": e.prev_digest, "event_digest": e.event_digest}


def check_journal(scope: ScopeRow, events: list[Event]) -> list[dict[str, Any]]:
    """Problems in one scope's hash chain: dense cursors, prev links, recomputed digests, head."""
    problems: list[dict[str, Any]] = []
    prev, expected = GENESIS, 1
    for e in events:
        if e.cursor != expected:
            problems.append({"cursor": str(e.cursor), "problem": "cursor_gap"})
        if e.prev_digest != prev:
            problems.append({"cursor": str(e.cursor), "problem": "prev_link"})
        if event_digest_of(event_doc(e)) != e.event_digest:
            problems.append({"cursor": str(e.cursor), "problem": "event_digest"})
        prev, expected = e.event_digest, e.cursor + 1
    if scope.last_cursor != expected - 1 or scope.last_event_digest != prev:
        problems.append({"cursor": str(scope.last_cursor), "problem": "head"})
    return problems


def check_anchor(anchor: dict[str, Any], journals: dict[tuple[str, str], dict[int, str]],
                 audit: dict[str, dict[int, str]], scope: tuple[str, str] | None) -> dict[str, Any]:
    """Whether the chains still reach the heads an anchor signed.

    ``journals`` maps each verified scope to its events' digests by cursor, ``audit`` each audit
    chain to its rows' digests by seq (all already checked as chains, so a matching digest at
    the anchored position vouches for everything before it). A head no longer there is
    ``anchor_truncated``, a different digest there ``anchor_rewritten``. With ``scope``, only
    that journal (and its audit chain) is compared.
    """
    problems: list[dict[str, Any]] = []
    if anchor.get("verified_by") is None:
        problems.append({"problem": "anchor_signature"})
    heads = _anchored_audit_heads(anchor)
    if scope is not None:
        heads = {c: h for c, h in heads.items() if c == scope_chain(*scope)}
    for chain, (seq, want) in sorted(heads.items()):
        rows = audit.get(chain, {})
        if seq > 0 and rows.get(seq) != want:
            where = {"chain": f"audit:{chain}" if chain else "audit", "seq": str(seq)}
            problems.append({**where, "problem": "anchor_truncated" if seq not in rows else "anchor_rewritten"})
    for j in anchor["journals"]:
        key, cursor = (j["tenant"], j["workspace"]), int(j["cursor"])
        if scope is not None and key != scope:
            continue
        events = journals.get(key, {})
        if cursor > 0 and events.get(cursor) != j["digest"]:
            problems.append({"chain": f"{key[0]}/{key[1]}", "cursor": str(cursor),
                             "problem": "anchor_truncated" if cursor not in events else "anchor_rewritten"})
    return {"ok": not problems, "created_at": anchor.get("created_at"), "key_id": anchor.get("verified_by"),
            "audit_chains": len(heads), "journals": len(anchor["journals"]), "problems": problems}


def _anchored_audit_heads(anchor: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """The audit chain heads an anchor signed (a v1 anchor: the one chain there was then)."""
    if "audit_chains" in anchor:
        return {a["chain"]: (int(a["seq"]), a["digest"]) for a in anchor["audit_chains"]}
    return {LEGACY_CHAIN: (int(anchor["audit"]["seq"]), anchor["audit"]["digest"])}


def record_meta(core: Core, rec: RecordRow) -> dict[str, Any]:
    """A record's control view for hosts: identifiers, states, times — never the body."""
    view: dict[str, Any] = {
        "record_id": rec.record_id, "record_digest": rec.record_digest, "payload_digest": rec.payload_digest,
        "candidate_id": rec.candidate_id, "state": rec.state, "trust_class": rec.trust_class,
        "principal": rec.principal, "agent_id": rec.agent_id, "valid_t": rec.valid_t,
        "derivative_rule": rec.derivative_rule, "accepted_at": core.instant(rec.accepted_at_ms),
        "accepted_cursor": str(rec.accepted_cursor), "state_cursor": str(rec.state_cursor),
        "body_present": rec.sealed_body is not None,
    }
    if rec.valid_t_end is not None:
        view["valid_t_end"] = rec.valid_t_end
    if rec.expires_at_ms is not None:
        view["expires_at"] = core.instant(rec.expires_at_ms)
    if rec.successor_id:
        view["successor_id"] = rec.successor_id
    return view


def _event_summary(e: Event) -> dict[str, Any]:
    out = {"cursor": str(e.cursor), "event_id": e.event_id, "operation": e.operation, "target": e.target,
           "from_state": e.from_state, "to_state": e.to_state, "at_ms": e.at_ms, "event_digest": e.event_digest}
    if e.body.get("reason_ref"):
        out["reason_ref"] = e.body["reason_ref"]
    for key in ("successor", "source", "disputed_by"):
        if e.body.get(key):
            out[key] = e.body[key]
    return out


class MaintenanceService:
    def __init__(self, core: Core, memory: MemoryService, signers: CoreSigners) -> None:
        self.core = core
        self.memory = memory
        self.signers = signers

    # -- shared steps ----------------------------------------------------------------------
    def authorize(self, ctx: BoundContext, op: str, stored: Iterable[str] = (), *,
                  target: tuple[str, str] = ("", "")) -> CallRecord:
        """``stored``: the request's free strings the operation may store (event ids, reason
        refs, scope names); the authz policy sees the secret scanner's findings over them.
        ``target``: the (tenant, workspace) the request acts on; ("", "") for the whole store
        (the policy then asks for a host key that serves every tenant)."""
        call = CallRecord()
        self.core.authorize(ctx, f"admin.{op}", call, stored_strings=stored, facts=target_facts(*target))
        return call

    @staticmethod
    def target_ctx(ctx: BoundContext, tenant: str, workspace: str) -> BoundContext:
        """The host context re-bound to the scope it acts on (identity and audit id unchanged)."""
        _ref(tenant, "tenant")
        _ref(workspace, "workspace")
        return dataclasses.replace(ctx, tenant=tenant, workspace=workspace)

    def _audit(self, ctx: BoundContext, op: str, outcome: str, target: str, call: CallRecord) -> None:
        self.core.audit_standalone(ctx, f"admin.{op}", outcome, target, call)

    # -- lifecycle (SPEC §6) ------------------------------------------------------------------
    def transition(self, ctx: BoundContext, req: dict[str, Any]) -> dict[str, Any]:
        call = self.authorize(ctx, "transition", [v for v in req.values() if isinstance(v, str)],
                              target=(req.get("tenant", ""), req.get("workspace", "")))
        op = req.get("operation", "")
        if op not in TRANSITION_OPS:
            raise EngramError(Code.INVALID_SCHEMA, "unknown operation")
        tctx = self.target_ctx(ctx, req.get("tenant", ""), req.get("workspace", ""))
        target = _ref(req.get("target", ""), "target")
        event_id = req.get("event_id", "")
        if not _EVENT_ID.match(event_id):
            raise EngramError(Code.INVALID_SCHEMA, "event_id")
        reason = _ref(req.get("reason_ref", ""), "reason_ref")
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
        guard = Guard(FORGET_TOOL, record_id, event_id, request_digest_of(FORGET_TOOL, args))
        standing = gated_precondition(self.core, tctx, guard, what="record",
                                      lookup=lambda tx: tx.record(tctx.tenant, tctx.workspace, record_id),
                                      check_state=lambda state: lifecycle.check_record("tombstone", state))
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        # MemoryService.tombstone: body key shredded, projections dropped, ledger, journal, audit — one transaction.
        return self.memory.tombstone(tctx, record_id, call, guard=guard, grant_id=None, reason_ref=reason,
                                     event_id=event_id, audit_operation="admin.tombstone")

    def _candidate_end(self, tctx: BoundContext, call: CallRecord, op: str, candidate_id: str, event_id: str,
                       reason: str) -> dict[str, Any]:
        args = {"candidate_id": candidate_id, "idempotency_key": event_id, "reason_ref": reason, "operation": op}
        guard = Guard(WITHDRAW_TOOL, candidate_id, event_id, request_digest_of(WITHDRAW_TOOL, args))
        standing = gated_precondition(self.core, tctx, guard, what="candidate",
                                      lookup=lambda tx: tx.candidate(tctx.tenant, tctx.workspace, candidate_id),
                                      check_state=lambda state: lifecycle.check_candidate(op, state))
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        assert standing.target is not None
        return self.memory.withdraw_candidate(tctx, standing.target, call, guard=guard, grant_id=None,
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
            rec = tx.record(t, w, target)
            if rec is None:
                raise EngramError(Code.NOT_FOUND, "record")
            # Every check happens before the first cursor is allocated (SPEC §6).
            new_state = lifecycle.check_record(op, rec.state, to_state or None)
            succ = None
            if op in ("supersede", "rewind"):
                if not successor or successor == target:
                    raise EngramError(Code.INVALID_SCHEMA, f"{op} names a successor other than the target")
                succ = tx.record(t, w, successor)
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
            event = tx.append_event(t, w, event_id=event_id, operation=op, target=target, from_state=rec.state,
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
                    t, w, event_id=f"{event_id}/successor", operation="mark_non_current", target=successor,
                    from_state=succ.state, to_state="historical", at_ms=now,
                    body={**body, "rewound": target},
                )
                tx.set_record_state(successor, "historical", state_cursor=demoted.cursor, successor_id=target)
                receipt["successor_event"] = {"cursor": str(demoted.cursor), "event_digest": demoted.event_digest,
                                              "from_state": succ.state, "to_state": "historical"}
            outcome = {"receipt": receipt}
            tx.idempotency_put(t, w, tctx.principal, event_id, IdempotencyRow(TRANSITION_TOOL, target, rd, outcome), now)
            tx.append_audit(self.core.audit_row(tctx, f"admin.{op}", new_state, target, call))
        return {**outcome, "replayed": False}

    def expire_sweep(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        """Expire records whose ``expires_at`` passed, as the retention policy decides (SPEC §6)."""
        authz = self.authorize(ctx, "expire_sweep", target=(tenant, workspace))
        now = self.core.now_ms()
        with self.core.store.read() as tx:
            scopes = [(tenant, workspace)] if tenant else [(s.tenant, s.workspace) for s in tx.scopes()]
        report = []
        for t, w in scopes:
            tctx = self.target_ctx(ctx, t, w)
            with self.core.store.read() as tx:
                recs = [r for r in tx.scope_records(t, w, EXPIRABLE) if r.expires_at_ms is not None]
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
                    current = tx.record(t, w, rec.record_id)
                    if current is None or current.state not in EXPIRABLE:
                        continue  # moved on since the decision; nothing to do
                    event = tx.append_event(t, w, event_id=new_id("evt_"), operation="expire", target=rec.record_id,
                                            from_state=current.state, to_state="expired", at_ms=now,
                                            body={"reason_ref": "retention:expires_at", "decisions": call.summaries(),
                                                  "audit_id": tctx.audit_id})
                    tx.set_record_state(rec.record_id, "expired", state_cursor=event.cursor)
                    derivatives = apply_derivative_rule(tx, tctx, current, cause="expire",
                                                        cause_event_id=event.event_id, now=now, call=call)
                    tx.append_audit(self.core.audit_row(tctx, "admin.expire", "expired", rec.record_id, call))
                expired.append({"record_id": rec.record_id, "from_state": current.state, "cursor": str(event.cursor),
                                "event_digest": event.event_digest, "derivatives": derivatives})
            report.append({"tenant": t, "workspace": w, "examined": len(recs), "expired": expired})
        self._audit(ctx, "expire_sweep", "ok", tenant and f"{tenant}/{workspace}", authz)
        return {"now": self.core.instant(now), "scopes": report}

    # -- adjudication ------------------------------------------------------------------------
    def list_adjudication(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        call = self.authorize(ctx, "list_adjudication", target=(tenant, workspace))
        tctx = self.target_ctx(ctx, tenant, workspace)
        with self.core.store.read() as tx:
            cands = tx.candidates_in_state(tenant, workspace, "pending_adjudication")
            reasons: dict[str, set[str]] = {}
            # A candidate's admission events follow its capture: read the journal from the oldest
            # pending capture on, not from the scope's first event (the console's review queue at
            # 100k records in a scope, issue 61).
            first = min((c.cursor for c in cands), default=None)
            for e in tx.events(tenant, workspace, first, None) if first is not None else ():
                if e.operation == "adjudication_required":
                    codes = reasons.setdefault(e.target, set())
                    for d in e.body.get("decisions", []):
                        codes.update(c for c in d.get("reason_codes", []) if c)
            items = []
            for c in cands:
                codes = reasons.get(c.candidate_id, set())
                if tx.tombstoned(tenant, workspace, c.payload_digest):
                    codes = codes | {"FORGOTTEN_CONTENT"}  # SPEC §5 core invariant, not a policy reason
                items.append({"candidate_id": c.candidate_id, "payload_digest": c.payload_digest,
                              "record_digest": c.record_digest, "trust_class": c.trust_class,
                              "captured_at": self.core.instant(c.captured_at_ms), "cursor": str(c.cursor),
                              "sizes": _sizes(_facts_of(self.core, tx, c)), "reasons": sorted(codes)})
        self._audit(tctx, "list_adjudication", "ok", "", call)
        return {"tenant": tenant, "workspace": workspace, "candidates": items}

    def adjudicate(self, ctx: BoundContext, req: dict[str, Any]) -> dict[str, Any]:
        call = self.authorize(ctx, "adjudicate", [v for v in req.values() if isinstance(v, str)],
                              target=(req.get("tenant", ""), req.get("workspace", "")))
        tctx = self.target_ctx(ctx, req.get("tenant", ""), req.get("workspace", ""))
        decision = req.get("decision", "")
        if decision not in ("accept", "reject"):
            raise EngramError(Code.INVALID_SCHEMA, "decision")
        candidate_id = _ref(req.get("candidate_id", ""), "candidate_id")
        reason = _ref(req.get("reason_ref", ""), "reason_ref")
        event_id = req.get("event_id", "")
        if not _EVENT_ID.match(event_id):
            raise EngramError(Code.INVALID_SCHEMA, "event_id")
        args = {"candidate_id": candidate_id, "idempotency_key": event_id, "decision": decision, "reason_ref": reason}
        guard = Guard(ADMISSION_TOOL, candidate_id, event_id, request_digest_of(ADMISSION_TOOL, args))

        def adjudicable(state: str) -> None:
            lifecycle.check_candidate(decision, state)
            if state != "pending_adjudication":
                raise EngramError(Code.ILLEGAL_TRANSITION, "candidate is not pending adjudication")

        # The same precondition as a withdraw: stored outcome, target, lifecycle.
        standing = gated_precondition(self.core, tctx, guard, what="candidate", check_state=adjudicable,
                                      lookup=lambda tx: tx.candidate(tctx.tenant, tctx.workspace, candidate_id))
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        assert standing.target is not None
        return self.memory.admit(tctx, standing.target, call, guard=guard, forced=decision, reason_ref=reason,
                                 event_id=event_id, audit_operation="admin.adjudicate")

    # -- reads -----------------------------------------------------------------------------------
    def history(self, ctx: BoundContext, tenant: str, workspace: str, record_id: str, disputed_only: bool) -> dict[str, Any]:
        call = self.authorize(ctx, "history", target=(tenant, workspace))
        tctx = self.target_ctx(ctx, tenant, workspace)
        with self.core.store.read() as tx:
            if record_id:
                rec = tx.record(tenant, workspace, record_id)
                if rec is None:
                    raise EngramError(Code.NOT_FOUND, "record")
                recs = [rec]
                targets = {rec.record_id, rec.candidate_id}
                # A record's history includes what it caused elsewhere (derivative rule, reconciliation).
                events = [_event_summary(e) for e in tx.events(tenant, workspace, 0, None)
                          if e.target in targets or rec.record_id in (e.body.get("source"), e.body.get("successor"),
                                                                      e.body.get("disputed_by"))]
            else:
                recs = tx.scope_records(tenant, workspace, ("accepted_disputed",) if disputed_only else None)
                events = None
        out: dict[str, Any] = {"tenant": tenant, "workspace": workspace,
                               "records": [record_meta(self.core, r) for r in recs]}
        if events is not None:
            out["events"] = events
        self._audit(tctx, "history", "ok", record_id, call)
        return out

    def inspect_candidate(self, ctx: BoundContext, tenant: str, workspace: str, candidate_id: str) -> dict[str, Any]:
        """A candidate's structure for hosts: control fields, sizes, findings — structurally no body."""
        call = self.authorize(ctx, "inspect_candidate", target=(tenant, workspace))
        tctx = self.target_ctx(ctx, tenant, workspace)
        with self.core.store.read() as tx:
            c = tx.candidate(tenant, workspace, _ref(candidate_id, "candidate_id"))
            events = [_event_summary(e) for e in tx.events(tenant, workspace, 0, None) if e.target == candidate_id] if c else []
            facts = _facts_of(self.core, tx, c) if c is not None else {}
        if c is None:
            raise EngramError(Code.NOT_FOUND, "candidate")
        view = {
            "candidate_id": c.candidate_id, "state": c.state, "payload_digest": c.payload_digest,
            "record_digest": c.record_digest, "trust_class": c.trust_class, "principal": c.principal,
            "agent_id": c.agent_id, "session": c.session, "captured_at": self.core.instant(c.captured_at_ms),
            "cursor": str(c.cursor), "sizes": _sizes(facts), "findings": facts.get("findings", {}),
            "retention": facts.get("retention", {}), "family_refs": facts.get("family_refs", []),
            "sealed_envelope_present": c.sealed_envelope is not None, "events": events,
        }
        if c.decision:
            view["decision"] = c.decision
        self._audit(tctx, "inspect_candidate", "ok", candidate_id, call)
        return view

    def export(self, ctx: BoundContext, tenant: str, workspace: str, what: str, from_cursor: str,
               to_cursor: str) -> dict[str, Any]:
        call = self.authorize(ctx, "export", target=(tenant, workspace))
        lo, hi = parse_cursor(from_cursor, 0), parse_cursor(to_cursor, None)
        if what == "journal":
            tctx = self.target_ctx(ctx, tenant, workspace)
            with self.core.store.read() as tx:
                items: list[dict[str, Any]] = [event_doc(e) for e in tx.events(tenant, workspace, lo or 0, hi)]
        elif what == "audit":
            tctx = self.target_ctx(ctx, tenant, workspace) if tenant else ctx
            with self.core.store.read() as tx:
                items = tx.audit_rows(tenant or None, workspace or None, lo or 0, hi)
            for row in items:
                row["seq"] = str(row["seq"])
        else:
            raise EngramError(Code.INVALID_SCHEMA, "what must be journal or audit")
        self._audit(tctx, "export", "ok", what, call)
        return {"what": what, "tenant": tenant, "workspace": workspace, "count": len(items), "items": items}

    def verify(self, ctx: BoundContext, tenant: str, workspace: str, *, report_only: bool, anchor_json: str = "",
               anchor_key_pems: tuple[str, ...] = ()) -> dict[str, Any]:
        """Recompute every journal and audit digest and link (SPEC §6, §10); JOURNAL_CORRUPT if any differ.

        With an anchor (``anchor``), the chains must also still reach the heads it signed: a chain
        shorter than an anchored head was truncated, a different digest there was rewritten. The
        anchor's signature must verify under ``anchor_key_pems`` (the operator's copy of the anchor
        public key) or, when none is named, the core's own anchor key."""
        # The whole store even for one scope: every audit chain is checked, the writer chains of
        # calls that changed nothing included, and they are no one scope's.
        call = self.authorize(ctx, "verify")
        anchor = self._parse_anchor(anchor_json, anchor_key_pems) if anchor_json else None
        with self.core.store.read() as tx:
            scopes = [tx.scope(tenant, workspace)] if tenant else tx.scopes()
            if tenant and scopes[0] is None:
                raise EngramError(Code.NOT_FOUND, "scope")
            scope_reports = []
            heads: dict[tuple[str, str], dict[int, str]] = {}
            for s in scopes:
                events = tx.events(s.tenant, s.workspace, 0, None)  # type: ignore[union-attr]
                problems = check_journal(s, events)  # type: ignore[arg-type]
                heads[(s.tenant, s.workspace)] = {e.cursor: e.event_digest for e in events}  # type: ignore[union-attr]
                scope_reports.append({"tenant": s.tenant, "workspace": s.workspace,  # type: ignore[union-attr]
                                      "head_cursor": str(s.last_cursor), "ok": not problems,  # type: ignore[union-attr]
                                      "problems": problems})
            rows = tx.audit_rows(None, None, 0, None)
            stored_heads = tx.audit_heads()
        audit_problems = check_audit(rows, stored_heads)
        chains = by_chain(rows)
        ok = not audit_problems and all(r["ok"] for r in scope_reports)
        report: dict[str, Any] = {"ok": ok, "scopes": scope_reports,
                                  "audit": {"rows": len(rows), "chains": len(chains), "ok": not audit_problems,
                                            "problems": audit_problems}}
        if anchor is not None:
            scope = (tenant, workspace) if tenant else None
            digests = {c: {int(r["seq"]): r["row_digest"] for r in rs} for c, rs in chains.items()}
            report["anchor"] = check_anchor(anchor, heads, digests, scope)
            report["ok"] = ok = ok and report["anchor"]["ok"]
        outcome = "ok" if ok else Code.JOURNAL_CORRUPT.value
        self._audit(ctx, "verify", outcome, tenant and f"{tenant}/{workspace}", call)
        if not ok:
            log.warning("verification failed: %s", json.dumps(report, sort_keys=True))
            if not report_only:
                raise EngramError(Code.JOURNAL_CORRUPT, "hash chain does not verify")
        return report

    def _parse_anchor(self, anchor_json: str, key_pems: tuple[str, ...]) -> dict[str, Any]:
        """The anchor document with ``key_id`` set to the key that verified it (None: no key did)."""
        try:
            keys = public_keys_from_pems(list(key_pems)) or [self.signers.anchor.public_key]
        except ValueError:
            raise EngramError(Code.INVALID_SCHEMA, "anchor key is not an Ed25519 public key PEM") from None
        try:
            doc = json.loads(anchor_json)
            body = {k: v for k, v in doc.items() if k not in ("anchor_digest", "signature")}
            if doc["format"] not in ANCHOR_FORMATS or not isinstance(doc["journals"], list):
                raise ValueError("format")
            for chain, (seq, head) in _anchored_audit_heads(doc).items():
                str(chain), int(seq), str(head)
            for j in doc["journals"]:
                int(j["cursor"]), str(j["tenant"]), str(j["workspace"]), str(j["digest"])
        except (ValueError, TypeError, KeyError, AttributeError):
            raise EngramError(Code.INVALID_SCHEMA, "not an anchor document") from None
        claimed = doc.get("anchor_digest")
        verified = claimed == digest("anchor", body) and verify_signature(
            ANCHOR_DOMAIN, claimed, doc.get("signature"), keys)
        return {**doc, "verified_by": verified or None}

    def anchor(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        """The current journal heads (all scopes, or the named one) and audit head, signed."""
        # A scope's anchor signs that scope's journal and audit chain only: a key serving its tenant
        # may ask for it; the whole store's (every chain) needs a key serving every tenant.
        call = self.authorize(ctx, "anchor", target=(tenant, workspace))
        if bool(tenant) != bool(workspace):
            raise EngramError(Code.INVALID_SCHEMA, "a scope anchor names both tenant and workspace")
        with self.core.store.read() as tx:
            scopes = [tx.scope(tenant, workspace)] if tenant else tx.scopes()
            if tenant and scopes[0] is None:
                raise EngramError(Code.NOT_FOUND, "scope")
            audit_heads = tx.audit_heads()
        if tenant:
            audit_heads = {c: h for c, h in audit_heads.items() if c == scope_chain(tenant, workspace)}
        body: dict[str, Any] = {
            "format": ANCHOR_FORMAT, "created_at": self.core.instant(),
            "audit_chains": [{"chain": c, "seq": str(seq), "digest": d} for c, (seq, d) in sorted(audit_heads.items())],
            "journals": [{"tenant": s.tenant, "workspace": s.workspace, "cursor": str(s.last_cursor),  # type: ignore[union-attr]
                          "digest": s.last_event_digest} for s in scopes],  # type: ignore[union-attr]
        }
        if tenant:
            body["scope"] = {"tenant": tenant, "workspace": workspace}
        anchor_digest = digest("anchor", body)
        doc = {**body, "anchor_digest": anchor_digest, "signature": self.signers.anchor.sign(anchor_digest)}
        with self.core.store.write() as tx:  # what `engram doctor` reads (HostService.Health)
            tx.set_meta(LAST_ANCHOR_META, json.dumps({"at_ms": self.core.now_ms(), "audit_chains": len(audit_heads)}))
        self._audit(ctx, "anchor", "ok", anchor_digest, call)
        return doc

    def signing_keys(self, ctx: BoundContext) -> dict[str, Any]:
        call = self.authorize(ctx, "signing_keys")
        out = {"backup": self.signers.backup.public(), "anchor": self.signers.anchor.public()}
        self._audit(ctx, "signing_keys", "ok", "", call)
        return out

    # -- keys and authorization ------------------------------------------------------------------
    def rotate_keys(self, ctx: BoundContext) -> dict[str, Any]:
        """SPEC §10: a new KEK generation re-wraps every live data key (no sealed body is touched);
        generations whose retention has passed and that no key needs any more retire."""
        call = self.authorize(ctx, "rotate_keys")
        rotated = keyring.rotate(self.core)
        retired = keyring.retire(self.core, self.core.key_schedule)
        self._audit(ctx, "rotate_keys", "ok", "", call)
        return {"active_kek": rotated["active_generation"], "live_data_keys": rotated["live_data_keys"],
                "rewrapped": rotated["rewrapped"], "retired_keks": retired, "bodies_rewritten": 0,
                "vault": self.core.vault.status()}

    def retire_keys(self, ctx: BoundContext, *, now: bool) -> dict[str, Any]:
        """Retire the generations due (``now``: every retained one no key is wrapped by, whatever its
        retention: what an operator runs to complete destructions at once, giving up restores of
        older backups)."""
        call = self.authorize(ctx, "retire_keys")
        retired = keyring.retire(self.core, self.core.key_schedule, now=now)
        self._audit(ctx, "retire_keys", "ok", "", call)
        return {"retired_keks": retired, "generations": self._generations()}

    def _generations(self) -> list[dict[str, Any]]:
        out = []
        for g in self.core.vault.generations():
            entry: dict[str, Any] = {"generation": g.generation, "state": g.state}
            if g.created_at_ms:
                entry["created_at"] = self.core.instant(g.created_at_ms)
            if g.deactivated_at_ms:
                entry["deactivated_at"] = self.core.instant(g.deactivated_at_ms)
                if g.state == "retained":
                    entry["retires_after"] = self.core.instant(g.deactivated_at_ms + self.core.key_schedule.retention_ms)
            if g.retired_at_ms:
                entry["retired_at"] = self.core.instant(g.retired_at_ms)
            out.append(entry)
        return out

    def key_status(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        """The vault's generations, and per record of a scope: its key live, or destroyed and
        whether that destruction is complete (every generation that wrapped it retired) or pending."""
        call = self.authorize(ctx, "key_status", target=(tenant, workspace))
        vault = self.core.vault
        schedule = self.core.key_schedule
        out: dict[str, Any] = {"vault": vault.status(), "generations": self._generations(),
                               "schedule": {"rotation_interval_s": schedule.rotation_interval_ms // 1000,
                                            "retention_s": schedule.retention_ms // 1000}}
        with self.core.store.read() as tx:
            destructions = tx.key_destructions()
            out["live_data_keys"] = len(tx.live_key_slots())
            out["destroyed_data_keys"] = len(destructions)
            out["destructions_pending"] = sum(1 for d in destructions if not vault.destruction_complete(d.generation))
            if tenant:
                self.target_ctx(ctx, tenant, workspace)
                records = []
                for rec in tx.scope_records(tenant, workspace):
                    owner = f"record:{rec.record_id}"
                    slot = tx.data_key_slot(owner)
                    destroyed = tx.key_destruction(owner)
                    if slot is not None:
                        status = "live" if vault.data_key(slot, owner) is not None else "unreadable"
                    else:
                        status = "destroyed" if destroyed is not None else "missing"
                    entry: dict[str, Any] = {"record_id": rec.record_id, "state": rec.state, "key": status}
                    if destroyed is not None:
                        entry["destroyed_at"] = self.core.instant(destroyed.at_ms)
                        entry["destruction"] = "complete" if vault.destruction_complete(destroyed.generation) else "pending"
                    records.append(entry)
                out["scope"] = {"tenant": tenant, "workspace": workspace, "records": records}
        self._audit(ctx, "key_status", "ok", tenant and f"{tenant}/{workspace}", call)
        return out

    def revoke(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        """Bump the scope's authorization epoch: older contexts and grants are refused from now on."""
        call = self.authorize(ctx, "revoke", [tenant, workspace], target=(tenant, workspace))
        tctx = self.target_ctx(ctx, tenant, workspace)
        with self.core.store.write() as tx:
            epoch = tx.bump_epoch(tenant, workspace)
            tx.append_audit(self.core.audit_row(tctx, "admin.revoke", "ok", f"{tenant}/{workspace}", call))
        return {"tenant": tenant, "workspace": workspace, "authorization_epoch": epoch}

    def trust_host_key(self, ctx: BoundContext, pem: str, kid: str, *, tenants: Sequence[str] = (),
                       all_tenants: bool = False, maintenance_scopes: Sequence[str] = ()) -> dict[str, Any]:
        """Trust a host key bound to the tenants (or all of them) and maintenance scopes it serves,
        or re-bind one already trusted (issue 26.3). The policy decides on the binding; here it is
        only checked for shape: at least one tenant or all of them, known scope names."""
        call = self.authorize(ctx, "trust_host_key", list(tenants))  # tenant names are stored
        try:
            pub = load_public_pem(pem)
        except Exception:
            raise EngramError(Code.INVALID_SCHEMA, "public key") from None
        found = key_id(pub)
        if kid and kid != found:
            raise EngramError(Code.INVALID_SCHEMA, "key id does not match key")
        if self.core.trusted.is_grant_signer(found):
            # Key separation (SPEC §2): the core's confirmation key signs grants only.
            raise EngramError(Code.INVALID_SCHEMA, "the confirmation key cannot be a host key")
        if self.core.trusted.binding(found).local:
            raise EngramError(Code.INVALID_SCHEMA, "the operator's own key (host.key, --trust-host-key) is not bound")
        for tenant in tenants:
            _ref(tenant, "tenant")
        if all_tenants == bool(tenants):
            raise EngramError(Code.INVALID_SCHEMA, "name the tenants the key serves, or all tenants (not both)")
        if any(scope not in MAINTENANCE_SCOPES for scope in maintenance_scopes):
            raise EngramError(Code.INVALID_SCHEMA, "unknown maintenance scope")
        row = HostKeyRow(key_id=found, public_key_pem=public_pem(pub), added_at_ms=self.core.now_ms(),
                         tenants=tuple(sorted(set(tenants))), all_tenants=all_tenants,
                         maintenance_scopes=tuple(sorted(set(maintenance_scopes))))
        with self.core.store.write() as tx:
            tx.bind_trusted_host_key(row)
            tx.append_audit(self.core.audit_row(ctx, "admin.trust_host_key", "ok", found, call))
        self.core.trusted.add(pub, tenants=row.tenants, all_tenants=all_tenants,
                              maintenance_scopes=row.maintenance_scopes)
        return {"key_id": found, "trusted": True, "binding": self.core.trusted.binding(found).facts()}

    def list_host_keys(self, ctx: BoundContext) -> dict[str, Any]:
        """The keys the core trusts now, each with the binding the policy sees (issue 26.3)."""
        call = self.authorize(ctx, "list_host_keys")
        with self.core.store.read() as tx:
            stored = {row.key_id: row for row in tx.host_key_rows()}
        keys = []
        for binding in self.core.trusted.bindings():
            entry = {**binding.facts(), "stored": binding.key_id in stored}
            row = stored.get(binding.key_id)
            if row is not None and row.added_at_ms:
                entry["added_at"] = self.core.instant(row.added_at_ms)
            keys.append(entry)
        self._audit(ctx, "list_host_keys", "ok", "", call)
        return {"host_keys": keys}

    def untrust_host_key(self, ctx: BoundContext, pem: str, kid: str) -> dict[str, Any]:
        call = self.authorize(ctx, "untrust_host_key")
        if not kid:
            try:
                kid = key_id(load_public_pem(pem))
            except Exception:
                raise EngramError(Code.INVALID_SCHEMA, "public key") from None
        if kid == ctx.host_key_id:
            # Removing the key that signs this very call would lock the operator out mid-flight.
            raise EngramError(Code.INVALID_SCHEMA, "cannot untrust the calling host key")
        with self.core.store.write() as tx:
            removed = tx.remove_trusted_host_key(kid)
            tx.append_audit(self.core.audit_row(ctx, "admin.untrust_host_key", "ok" if removed else "absent", kid, call))
        live = self.core.trusted.remove(kid)
        return {"key_id": kid, "trusted": False, "removed": removed or live}

    # -- schema, projections, policies ------------------------------------------------------------
    def migrate(self, ctx: BoundContext) -> dict[str, Any]:
        call = self.authorize(ctx, "migrate")
        applied = self.core.store.migrate()  # MIGRATION_LEDGER_INVALID if the ledger disagrees
        self._audit(ctx, "migrate", "ok", "", call)
        return {"applied": applied, "ledger": self.core.store.migration_ledger(),
                "code": self.core.store.migration_code()}

    def invalidate_projections(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        call = self.authorize(ctx, "invalidate_projections", target=(tenant, workspace))
        tctx = self.target_ctx(ctx, tenant, workspace)
        with self.core.store.write() as tx:
            removed = tx.drop_projections(tenant, workspace)
            self.core.projections.mark(tx, tenant, workspace, stale=True)  # searches: PROJECTION_STALE
            # Journaled: the other cores of a shared store reload the scope's index when they see it.
            tx.append_event(tenant, workspace, event_id=new_id("evt_"), operation="invalidate_projections",
                            target=f"projections:{tenant}/{workspace}", from_state="projections_current",
                            to_state="projections_stale", at_ms=self.core.now_ms(),
                            body={"removed": removed, "decisions": call.summaries(), "audit_id": ctx.audit_id})
            scope = tx.scope(tenant, workspace)
            tx.append_audit(self.core.audit_row(tctx, "admin.invalidate_projections", "ok", f"{tenant}/{workspace}", call))
        self.core.projections.published(tenant, workspace, stale=True)
        return with_receipt_digest({"kind": "projection-invalidation", "tenant": tenant, "workspace": workspace,
                                    "removed": removed, "cursor": str(scope.last_cursor if scope else 0),
                                    "at": self.core.instant()})

    def rebuild_projections(self, ctx: BoundContext, tenant: str, workspace: str) -> dict[str, Any]:
        """Re-derive postings (and vectors) from the sealed bodies of every non-tombstoned record."""
        call = self.authorize(ctx, "rebuild_projections", target=(tenant, workspace))
        tctx = self.target_ctx(ctx, tenant, workspace)
        indexed, unreadable = [], []
        with self.core.store.write() as tx:  # writer lock: no admission slips between drop and re-index
            removed = tx.drop_projections(tenant, workspace)
            for rec in tx.scope_records(tenant, workspace, INDEXED_STATES):
                payload = _open_body(self.core, tx, rec)
                if payload is None:
                    unreadable.append(rec.record_id)
                    continue
                tx.index_record(tenant, workspace, rec.record_id, record_fields(payload, self.core.hasher),
                                self.memory.embed_record(payload))
                write_links(tx, tenant, workspace, rec.record_id, payload_links(payload))  # records admitted before links
                indexed.append(rec.record_id)
            counts = tx.projection_counts(tenant, workspace)
            self.core.projections.mark(tx, tenant, workspace, stale=False)
            tx.append_event(tenant, workspace, event_id=new_id("evt_"), operation="rebuild_projections",
                            target=f"projections:{tenant}/{workspace}", from_state="projections_stale",
                            to_state="projections_current", at_ms=self.core.now_ms(),
                            body={"records_indexed": len(indexed), "decisions": call.summaries(),
                                  "audit_id": ctx.audit_id})
            scope = tx.scope(tenant, workspace)
            tx.append_audit(self.core.audit_row(tctx, "admin.rebuild_projections", "ok", f"{tenant}/{workspace}", call))
        self.core.projections.published(tenant, workspace, stale=False)
        return with_receipt_digest({
            "kind": "projection-rebuild", "tenant": tenant, "workspace": workspace, "removed": removed,
            "records_indexed": len(indexed), "unreadable": unreadable, "counts": counts,
            "ordered_ids_digest": digest("ordered-ids", indexed), "cursor": str(scope.last_cursor if scope else 0),
            "at": self.core.instant(),
        })

    def reload_policies(self, ctx: BoundContext) -> dict[str, Any]:
        """Activate the bundle as it is now. A bundle that was read and refused is an answer,
        not an error: retrying cannot help, so the caller learns which file failed and that
        the previous revision stays active (``outcome: refused``). An unreachable backend is
        still POLICY_UNAVAILABLE (retriable)."""
        call = self.authorize(ctx, "reload_policies")
        previous = self.core.policy.revision()
        try:
            revision = self.core.policy.reload()
        except BundleRefused as exc:
            self._audit(ctx, "reload_policies", "refused", exc.active_revision, CallRecord([*call.decisions]))
            return {"outcome": "refused", "previous_revision": previous, "revision": exc.active_revision,
                    "problem": exc.problem}
        self._audit(ctx, "reload_policies", "ok", revision, CallRecord([*call.decisions]))
        return {"outcome": "activated", "previous_revision": previous, "revision": revision}


ANALYZER_META = "lexical_analyzer"
VECTOR_MODEL_META = "vector_model"

Rewrite = Callable[[RecordRow, Projection], Projection | None]


def _rederive_projections(core: Core, meta_key: str, current: str,
                          rewrite_of: Callable[[Tx], Rewrite]) -> tuple[int, str | None] | None:
    """At start-up, before the core serves: when ``store_meta[meta_key]`` is not ``current``,
    rewrite every scope's projections with ``rewrite_of(tx)`` and record ``current``, in one write
    transaction (all or nothing: a crash leaves the old projections and the old stamp, and the
    next start does it again). Returns (projections rewritten, the stamp found), or None when the
    store was current (one read). The in-memory index is rebuilt only if a projection changed."""
    with core.store.read() as tx:
        stamped = tx.meta(meta_key)
    if stamped == current:
        return None
    rewritten = 0
    with core.store.write() as tx:
        rewrite = rewrite_of(tx)
        for scope in tx.scopes():
            rewritten += tx.reseal_projections(scope.tenant, scope.workspace, rewrite)
        tx.set_meta(meta_key, current)
    if rewritten:
        core.store.reload_indexes()  # a copy built before held the old projections
    return rewritten, stamped


def reanalyze_lexical(core: Core) -> int | None:
    """Re-derive every scope's postings when they were made by another analyzer than this code's
    (``lexical.ANALYZER_ID``, recorded in ``store_meta``): a query analyzed one way must never be
    matched against postings analyzed another way. Vectors are kept. Returns the records
    re-indexed, or None when the postings were already current. A store without the id and
    without postings is new: it is only stamped (0)."""

    def reanalyzed(tx: Tx) -> Rewrite:
        def rewrite(rec: RecordRow, old: Projection) -> Projection | None:
            payload = _open_body(core, tx, rec) if rec.state in INDEXED_STATES else None
            if payload is None:
                return None  # shredded: left
            fields = record_fields(payload, core.hasher)
            return Projection.of({FIELD_CODE[name]: counts for name, counts in fields.items()}, old.model,
                                 old.vector)  # type: ignore[arg-type]
        return rewrite

    done = _rederive_projections(core, ANALYZER_META, ANALYZER_ID, reanalyzed)
    if done is None:
        return None
    indexed, before = done
    if indexed:
        log.info("lexical postings re-analyzed: %d records (%s -> %s)", indexed, before or "v1", ANALYZER_ID)
    return indexed


def reembed_vectors(core: Core) -> int | None:
    """Re-derive the vectors made by another model than the embedder's (``model_id``), e.g. a
    store from before the model was derived for int8 arithmetic (engram_core/embedding/model.py): searches
    rank only vectors of their own model, so without this every older record would drop out of
    the semantic channel. ~5 ms per record re-embedded. The model whose vectors the store holds
    is recorded in ``store_meta``, so a store that is current costs one read (not a scan of its
    projections, nor the search index, which the server builds after it listens). Records
    without a vector are left as they are (``engram admin rebuild-projections`` gives them one).
    Returns the records re-embedded, or None when the store was already current."""
    embedder = core.embedder
    if embedder is None:
        return None  # nothing can be checked or stamped without the model
    older: set[str] = set()

    def reembedded(tx: Tx) -> Rewrite:
        def rewrite(rec: RecordRow, old: Projection) -> Projection | None:
            if old.vector is None or old.model == embedder.model_id or rec.state not in INDEXED_STATES:
                return None
            payload = _open_body(core, tx, rec)
            if payload is None:
                return None
            older.add(old.model)
            vector = embedder.embed(record_text(payload))
            return dataclasses.replace(old, model=embedder.model_id, vector=np.asarray(vector, dtype=np.float32))
        return rewrite

    done = _rederive_projections(core, VECTOR_MODEL_META, embedder.model_id, reembedded)
    if done is None:
        return None
    embedded, _ = done
    if embedded:
        log.info("vectors re-embedded: %d records (%s -> %s)", embedded, ", ".join(sorted(older)), embedder.model_id)
    return embedded


def _facts_of(core: Core, tx: Tx, cand: CandidateRow) -> dict[str, Any]:
    """A candidate's facts for hosts (sizes, findings, retention, families): opened from its sealed
    envelope while its key lives, never returned with the content; none once it was decided,
    withdrawn or its record forgotten (its key is destroyed then)."""
    if cand.facts or cand.sealed_envelope is None:
        return cand.facts
    found = core.data_key(tx, f"candidate:{cand.candidate_id}", cand.key_slot)
    if found is None:
        return {}
    opened = json.loads(unseal(found[1], cand.sealed_envelope, kind="candidate", owner=cand.candidate_id))
    return candidate_facts(cand, opened)


def _sizes(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: facts[k] for k in ("components", "citations", "evidence", "payload_bytes") if k in facts}


def _open_body(core: Core, tx: Tx, rec: RecordRow) -> dict[str, Any] | None:
    found = core.data_key(tx, f"record:{rec.record_id}", rec.key_slot)
    if found is None or rec.sealed_body is None:
        return None
    return json.loads(unseal(found[1], rec.sealed_body, kind="record", owner=rec.record_id))
