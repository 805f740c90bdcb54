"""The agents' four mutations (SPEC §5–8) over the core's ports (search and get: ``reading``).

Each operation: prepare (validated and canonicalized once, its digests computed once:
``pipeline.prepare``) → bind purpose → authorize (policy) → idempotency guard → lifecycle
check → policy decisions → one write transaction holding the effect, journal event,
idempotency outcome and audit row → post-commit key-slot zeroing. Errors are EngramError only.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cryptography.exceptions import InvalidTag

from engram_core.contract.canonical import (
    Canonical,
    canonical,
    canonical_json,
    canonical_object,
    digest,
    with_receipt_digest,
)
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, FORGET_TOOL, GATED_TOOLS, WITHDRAW_TOOL
from engram_core.contract.validation import parse_instant
from engram_core.crypto.sealing import seal, unseal
from engram_core.policy.port import ADMISSION, CAPTURE
from engram_core.secret_scan.scan import scan
from engram_core.services import lifecycle
from engram_core.services.content_signals import ContentSignals, capture_facts, future_vector
from engram_core.services.core import (
    CallRecord,
    Core,
    context_facts,
    denied,
    new_id,
    record_id_of,
    require_current_epoch,
)
from engram_core.services.derivatives import apply_derivative_rule
from engram_core.services.embedding import EmbeddingBatcher
from engram_core.services.lexical import record_fields
from engram_core.services.pipeline import (
    Guard,
    PreparedCall,
    gated_precondition,
    guarded_outcome,
    prepare,
    require_grant,
    transaction_receipt_digest,
)
from engram_core.services.reading import ReadService
from engram_core.services.reconciliation import Reconciler, payload_links, write_links
from engram_core.store.port import CandidateRow, IdempotencyRow, RecordRow, Tx
from engram_core.trust.hostctx import BoundContext, verify_grant


def _string_fields(value: Any, skip: frozenset[str] = frozenset()) -> list[str]:
    """Every string in a payload/evidence tree except digests (scanned for secrets)."""
    out: list[str] = []
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k not in skip:
                out.extend(_string_fields(v, skip))
    elif isinstance(value, list):
        for v in value:
            out.extend(_string_fields(v, skip))
    return out


_DIGEST_KEYS = frozenset({"content_digest", "evidence_digest"})


def stored_strings(args: dict[str, Any]) -> list[str]:
    """A mutation's top-level free strings (idempotency key, reason ref, target): each may be
    stored (idempotency ledger, journal), so each goes through the secret scanner before the
    authorization decision (SPEC §13). Memory content (payload, evidence) is the capture
    policy's."""
    return [v for v in args.values() if isinstance(v, str)]


def _shape_facts(payload: dict[str, Any], evidence: dict[str, Any], *, payload_bytes: int) -> dict[str, Any]:
    kinds = {"context": 0, "decision": 0, "evidence": 0}
    for comp in payload["components"]:
        kinds[comp["kind"]] += 1
    return {
        "components": {
            "count": len(payload["components"]),
            "kinds": kinds,
            "text_bytes": sum(len(c["text"].encode()) for c in payload["components"]),
        },
        "citations": {"count": len(payload["citations"])},
        "evidence": {"citation_count": len(evidence["citation_ids"]), "has_attestation": "attestation" in evidence},
        "payload_bytes": payload_bytes,  # the canonical size, from the call's one canonicalization
    }


def candidate_facts(cand: CandidateRow, envelope: dict[str, Any] | None) -> dict[str, Any]:
    """A candidate's facts: sealed in its opened envelope, or (captured before they were sealed)
    the row's plain column; empty once the content is gone."""
    if envelope is not None and "facts" in envelope:
        return envelope["facts"]
    return cand.facts


EARLY_VECTORS = 256  # just-captured candidates whose vector is kept for their admission


def record_text(effective: dict[str, Any]) -> str:
    """What the semantic channel embeds of a record: its components' texts."""
    return "\n".join(c["text"] for c in effective["components"])


class MemoryService(ReadService):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self.reconciler = Reconciler(core)
        self.content_signals = ContentSignals(core, self.profiles["lexical"])  # issue 59
        # Admissions' record texts: concurrent admissions share a model run.
        self._record_embeddings = EmbeddingBatcher(lambda: getattr(self.core, "embedder", None))
        # Vectors of just-captured candidates, computed while the agent turns round to request
        # admission (which then does not wait for the model). Memory only, bounded, dropped when
        # the candidate is decided or withdrawn.
        self._early_vectors: OrderedDict[str, Future[list[float]]] = OrderedDict()
        self._early_lock = threading.Lock()

    # -- shared steps ------------------------------------------------------------------
    def _replay(self, tx: Tx, ctx: BoundContext, guard: Guard) -> dict[str, Any] | None:
        return guarded_outcome(tx, ctx, guard)

    def _remember(self, tx: Tx, ctx: BoundContext, guard: Guard, outcome: dict[str, Any]) -> None:
        tx.idempotency_put(ctx.tenant, ctx.workspace, ctx.principal, guard.key,
                           IdempotencyRow(guard.tool, guard.target, guard.request_digest, outcome), self.core.now_ms())

    def _verify_grant(self, ctx: BoundContext, prepared: PreparedCall, grant: bytes):
        """The grant signs this operation (tool, target, operation digest), in time, unused, and
        under the scope's current authorization epoch (SPEC §8, §12)."""
        try:
            parsed = verify_grant(
                grant, self.core.trusted, ctx=ctx, tool=prepared.tool, target=prepared.target,
                operation_digest=prepared.operation_digest, now_ms=self.core.now_ms(),
            )
        except EngramError as exc:
            raise EngramError(exc.code, exc.detail, reason_class="confirmation_invalid",
                              reasons=("GRANT_INVALID",)) from None
        require_current_epoch(parsed.authorization_epoch, self.core.store.latest_scope(ctx.tenant, ctx.workspace),
                              "grant issued before revocation")
        return parsed

    def check_gated(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        """What a host asks before a human confirms a withdraw or forget (HostService.CheckGated):
        the tool call's own schema, authorization and ``gated_precondition`` without the grant,
        so a target that does not exist in the scope is NOT_FOUND without anyone being asked.
        ``args``: {tool, target, idempotency_key, reason_ref}. Changes nothing."""
        tool = args.get("tool")
        if tool not in GATED_TOOLS:
            raise EngramError(Code.INVALID_SCHEMA, "not a gated tool", reason_class="value_not_allowed")
        field = "candidate_id" if tool == WITHDRAW_TOOL else "record_id"
        tool_args = {field: args.get("target", ""), "idempotency_key": args.get("idempotency_key", ""),
                     "reason_ref": args.get("reason_ref", "")}
        prepared = prepare(ctx, tool, tool_args)
        self.core.authorize(ctx, tool, CallRecord(), stored_strings=stored_strings(tool_args))
        # Only the replay matters here: the standing's target is a candidate or a record.
        if tool == WITHDRAW_TOOL:
            replay = gated_precondition(
                self.core, ctx, prepared.guard, what="candidate",
                lookup=lambda tx: tx.candidate(ctx.tenant, ctx.workspace, tool_args[field]),
                check_state=lambda state: lifecycle.check_candidate("withdraw", state)).replay
        else:
            replay = gated_precondition(
                self.core, ctx, prepared.guard, what="record",
                lookup=lambda tx: tx.record(ctx.tenant, ctx.workspace, tool_args[field]),
                check_state=lambda state: lifecycle.check_record("tombstone", state)).replay
        return {"status": "replay" if replay is not None else "ready"}

    def _recheck(self, tx: Tx, ctx: BoundContext, guard: Guard | None, call: CallRecord, grant_id: str | None,
                 target: Any, check_state: Any) -> Any:
        """Inside the serialized write transaction, everything checked before may have moved:
        a concurrent identical request may have won (replay), the bundle may have been reloaded
        (POLICY_STALE), the target may have changed state (lifecycle). The grant is consumed
        here, in the same transaction as the effect (SPEC §7, §8)."""
        if guard is not None:
            prior = self._replay(tx, ctx, guard)
            if prior is not None:
                raise _Replayed(prior)
        self.core.check_revision(call)
        if target is None:
            raise EngramError(Code.NOT_FOUND, "target")
        check_state(target.state)
        if grant_id is not None:
            self._consume_grant(tx, ctx, grant_id)
        return target

    def _read_ahead(self, tx: Tx, ctx: BoundContext, guard: Guard | None, *reads: Callable[[], object]) -> None:
        """A write transaction's reads before its first write, and the replay check of
        ``_recheck``, in one round trip with the scope lock where the store is remote
        (``Tx.read_ahead``): each mutation then holds its scope for at most three."""
        tx.read_ahead(*reads, *([lambda: self._replay(tx, ctx, guard)] if guard is not None else []))

    def _consume_grant(self, tx: Tx, ctx: BoundContext, grant_id: str) -> None:
        if not tx.use_confirmation(grant_id, ctx.tenant, ctx.workspace, self.core.now_ms()):
            raise EngramError(Code.GATE_FAILED, "confirmation already used", reason_class="confirmation_invalid",
                              reasons=("GRANT_USED",))

    @staticmethod
    def _finish_destruction(tx: Tx) -> str:
        """The keys the transaction destroyed (the store zeroes them after COMMIT): 'complete' once
        gone from the live vault and from every KEK generation that wrapped them; 'pending' until
        those generations retire (or a zeroing left to the next start's reconciliation)."""
        return tx.key_destruction_outcome

    # -- capture ---------------------------------------------------------------------------
    def capture(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        call = CallRecord()
        prepared = prepare(ctx, CAPTURE_TOOL, args)
        payload, evidence = args["payload"], args["evidence"]
        payload_c = prepared.member("payload")
        self.bind_purpose(ctx, payload["purpose_ref"])
        now = self.core.now_ms()
        retention = payload.get("retention", {})
        expires_at_ms = parse_instant(retention["expires_at"]) if "expires_at" in retention else None  # validated
        findings = scan(_string_fields(payload, _DIGEST_KEYS) + _string_fields(evidence, _DIGEST_KEYS))
        facts = _shape_facts(payload, evidence, payload_bytes=len(payload_c.data))
        requested: dict[str, Any] = {}
        if "derivative_rule" in retention:
            requested["derivative_rule"] = retention["derivative_rule"]
        if expires_at_ms is not None:
            requested["expires_at_ms"] = expires_at_ms
        family_refs = payload.get("reconciliation", {}).get("family_refs", [])
        # The capture decision is asked with the authorization (one engine call) and counts only
        # once the authorization allowed the call and it is not a replay.
        authz, decision = self.core.authorize_with(
            ctx, CAPTURE_TOOL, call, self.core.store.latest_scope(ctx.tenant, ctx.workspace), CAPTURE,
            {"context": context_facts(ctx), "now_ms": now, "retention": requested, "family_refs": family_refs,
             "findings": findings, **facts, **capture_facts(payload),
             # Payload times (epoch ms), which the policy bounds to the host's window (issue 26.5).
             "valid_time": payload["valid_time"], "primary_event_at": payload["primary_event"]["at"]},
            stored_strings=stored_strings(args))
        with self.core.store.read(snapshot=False) as tx:  # checked again in the write transaction
            prior = self._replay(tx, ctx, prepared.guard)
        if prior is not None:
            return {**prior, "status": "duplicate_exact"}
        if expires_at_ms is not None and expires_at_ms <= now:
            raise EngramError(Code.INVALID_SCHEMA, "expires_at not after capture time")
        call.add(decision)
        if not decision.result["allow"]:
            raise denied(Code.UNAUTHORIZED, "capture policy denied", call.decisions)
        if decision.result.get("confirmation_required") or authz.result.get("obligations", {}).get("confirmation_required"):
            grant_obj = self._verify_grant(ctx, prepared, require_grant(grant))
        else:
            grant_obj = None
        resolved = decision.result["retention"]
        effective_retention: dict[str, Any] = {"derivative_rule": resolved["derivative_rule"]}
        if "expires_at_ms" in resolved:
            effective_retention["expires_at"] = self.core.instant(resolved["expires_at_ms"])
        # The payload as it was canonicalized once, with its retention resolved and its scope
        # bound: composed from the payload's members, whose texts are spliced, not rewritten.
        effective_c = canonical_object({**(payload_c.members or {}), "retention": canonical(effective_retention),
                                        "scope_ref": canonical({"tenant": ctx.tenant, "workspace": ctx.workspace})})
        effective = effective_c.value
        payload_digest = digest("payload", effective_c)
        candidate_id = new_id("cand_")
        trust_class = "asserted"  # SPEC §5: earned/signed only from a host verifier
        record_digest = digest("record", self._record_core(candidate_id, effective_c, payload_digest, trust_class, ctx))
        # Synced by the store before the COMMIT that names the slot (one sync per group commit).
        # The record's vector, started now so that the model runs while this capture writes and
        # its agent turns round to request admission (which then does not wait for it). Dropped
        # unless the capture commits; kept in memory only.
        early = self._start_embedding(effective)
        slot, key = self.core.vault.new_data_key(f"candidate:{candidate_id}", durable=False)
        # The candidate's facts (sizes, findings, retention, family refs) are derived from its
        # content, so they are sealed with it: destroying its key shreds them too (issue 26.7).
        sealed_facts = {**facts, "findings": findings, "retention": resolved, "family_refs": family_refs,
                        "all_components_cited": True}
        envelope = seal(key, canonical_json({"payload": effective_c, "evidence": prepared.member("evidence"),
                                             "facts": sealed_facts}),
                        kind="candidate", owner=candidate_id)
        try:
            with self.core.store.write(batched=True, scope=(ctx.tenant, ctx.workspace)) as tx:
                prior = self._replay(tx, ctx, prepared.guard)
                if prior is not None:
                    raise _Replayed(prior)
                self.core.check_revision(call)
                if grant_obj is not None:
                    self._consume_grant(tx, ctx, grant_obj.grant_id)
                event = tx.append_event(
                    ctx.tenant, ctx.workspace, event_id=new_id("evt_"), operation="capture", target=candidate_id,
                    from_state="", to_state="pending", at_ms=now,
                    body={"payload_digest": payload_digest, "record_digest": record_digest,
                          "decisions": call.summaries(), "audit_id": ctx.audit_id},
                )
                tx.insert_candidate(CandidateRow(
                    candidate_id=candidate_id, tenant=ctx.tenant, workspace=ctx.workspace, principal=ctx.principal,
                    agent_id=ctx.agent_id, session=ctx.session, state="pending", payload_digest=payload_digest,
                    record_digest=record_digest, trust_class=trust_class, facts={},  # sealed in the envelope
                    sealed_envelope=envelope, captured_at_ms=now, cursor=event.cursor, key_slot=slot,
                ))
                tx.put_data_key(f"candidate:{candidate_id}", slot, now)
                outcome = {
                    "status": "committed_pending", "candidate_id": candidate_id, "record_digest": record_digest,
                    "cursor": str(event.cursor),
                    "transaction_receipt_digest": transaction_receipt_digest(self.core, "capture", event.event_digest, event.cursor, call, ctx.audit_id),
                }
                self._remember(tx, ctx, prepared.guard, outcome)
                tx.append_audit(self.core.audit_row(ctx, CAPTURE_TOOL, "committed_pending", candidate_id, call))
        except _Replayed as r:
            self.core.vault.destroy(slot)
            return {**r.outcome, "status": "duplicate_exact"}
        except BaseException:
            self.core.vault.destroy(slot)
            raise
        self.core.quotas.add(ctx.tenant, ctx.workspace, ctx.principal, "bytes_stored", facts["payload_bytes"])
        self._keep_early(candidate_id, early)
        return outcome

    @staticmethod
    def _record_core(candidate_id: str, effective: dict[str, Any] | Canonical, payload_digest: str, trust_class: str,
                     ctx: BoundContext) -> dict[str, Any]:
        """What record_digest covers: the record's immutable content (docs/digests.md)."""
        return {
            "candidate_id": candidate_id, "payload": effective, "payload_digest": payload_digest,
            "trust_class": trust_class, "principal": ctx.principal, "agent_id": ctx.agent_id,
        }

    # -- request_admission ------------------------------------------------------------------
    def request_admission(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        call = CallRecord()
        prepared = prepare(ctx, ADMISSION_TOOL, args)
        authz = self.core.authorize(ctx, ADMISSION_TOOL, call, stored_strings=stored_strings(args))
        with self.core.store.read(snapshot=False) as tx:  # both checked again in the write transaction
            cand = tx.candidate(ctx.tenant, ctx.workspace, args["candidate_id"])  # first: see gated_precondition
            prior = self._replay(tx, ctx, prepared.guard)
        if prior is not None:
            return {**prior, "replayed": True}
        if cand is None:
            raise EngramError(Code.NOT_FOUND, "candidate")
        grant_obj = None
        if authz.result.get("obligations", {}).get("confirmation_required"):
            grant_obj = self._verify_grant(ctx, prepared, require_grant(grant))
        return self.admit(ctx, cand, call, guard=prepared.guard, grant_id=grant_obj.grant_id if grant_obj else None)

    def admit(
        self, ctx: BoundContext, cand: CandidateRow, call: CallRecord, *, guard: Guard | None,
        grant_id: str | None = None, forced: str | None = None, reason_ref: str = "",
        event_id: str | None = None, audit_operation: str | None = None,
    ) -> dict[str, Any]:
        """Decide and apply admission. ``guard``: the mutation guard of the request (None: no
        idempotency row); ``forced`` is a host adjudication (accept/reject); host calls name
        their own journal ``event_id`` and audit operation."""
        now = self.core.now_ms()
        if cand.state == "accepted":
            # Admission of an already-admitted candidate: report it, change nothing.
            return self._already_admitted(ctx, cand, call, guard)
        if cand.state == "rejected" and (cand.decision or {}).get("status") == "duplicate_exact":
            # Decided a duplicate of a current record before: the same answer again.
            return self._outcome_only(ctx, cand, "duplicate_exact", call, guard)
        lifecycle.check_candidate("accept", cand.state)
        if forced is None and cand.state == "pending_adjudication":
            return self._outcome_only(ctx, cand, "pending_adjudication", call, guard)
        try:
            envelope, envelope_slot = self._open_envelope(cand)
            effective = envelope["payload"]
        except (EngramError, InvalidTag):
            replay = self._after_lost_key(ctx, cand, guard)
            if replay is not None:
                return replay
            raise
        # The record's vector is computed on the model's thread while this one decides (the model
        # releases the GIL): wasted only when the admission does not accept.
        embedding = self._take_early(cand.candidate_id) or self._start_embedding(effective)
        with self.core.store.read(snapshot=False) as tx:
            duplicate_of, tombstoned = tx.payload_standing(ctx.tenant, ctx.workspace, cand.payload_digest)
            content = (self.content_signals.admission_facts(tx, ctx.tenant, ctx.workspace, effective, now=now,
                                                            vector=future_vector(embedding))
                       if forced is None else {})
        if forced is None:
            decision = self.core.decide(
                ADMISSION,
                {"context": context_facts(ctx), "now_ms": now,
                 "candidate": {**candidate_facts(cand, envelope), **content, "trust_class": cand.trust_class,
                               "principal": cand.principal, "agent_id": cand.agent_id,
                               "record_digest": cand.record_digest, "payload_digest": cand.payload_digest,
                               "duplicate_of_current": duplicate_of is not None}},
                call,
            )
            verdict = decision.result["decision"]
            receipt_src = decision
        else:
            verdict = forced
            receipt_src = None
        # SPEC §5 forgotten-content protection: a core invariant, not a policy choice.
        if verdict == "accept" and tombstoned and forced is None:
            verdict = "adjudication_required"
        record_id = record_id_of(cand.record_digest)
        plan = None
        if verdict == "accept":
            # Reconciliation families (SPEC §9): the policy answers for each current member.
            plan = self.reconciler.decide(
                ctx, record_id=record_id, record_digest=cand.record_digest, payload_digest=cand.payload_digest,
                trust_class=cand.trust_class, principal=cand.principal, agent_id=cand.agent_id, effective=effective,
                call=call, now=now, adjudicated=forced is not None)
            if plan is not None and plan.admission == "adjudication_required":
                if forced is None:
                    verdict, receipt_src = "adjudication_required", plan.decision
                plan = None  # a host's accept stands; the members stay as they are
        if verdict == "duplicate" and duplicate_of is None:
            # The policy called it a duplicate of nothing: not an answer the core can apply.
            raise EngramError(Code.POLICY_UNAVAILABLE, "duplicate without a current record")
        status = {"accept": "accepted", "reject": "rejected", "adjudication_required": "pending_adjudication",
                  "duplicate": "duplicate_exact"}[verdict]
        decision_receipt = (self.core.decision_receipt(receipt_src)["receipt_digest"] if receipt_src is not None
                            else with_receipt_digest({"kind": "adjudication", "decision": verdict,
                                                      "reason_ref": reason_ref, "principal": ctx.principal,
                                                      "at": self.core.instant(now)})["receipt_digest"])
        record_slot: int | None = None
        vector: tuple[str, list[float]] | None = None
        reconciled: list[dict[str, Any]] = []
        if status == "accepted":
            record_slot, record_key = self.core.vault.new_data_key(f"record:{record_id}", durable=False)
            body = seal(record_key, canonical_json(effective), kind="record", owner=record_id)
            fields = record_fields(effective, self.core.hasher)
            # Before taking the write lock: the local model takes milliseconds per record, and
            # inside the transaction it would serialize every other write behind it. (An
            # embedding was started only with an embedder.)
            embedder = self.core.embedder
            vector = (embedder.model_id, embedding.result()) if embedding is not None and embedder is not None else None
        try:
            with self.core.store.write(batched=True, scope=(ctx.tenant, ctx.workspace)) as tx:
                standing_read = ([lambda: tx.payload_standing(ctx.tenant, ctx.workspace, cand.payload_digest)]
                                 if forced is None and status in ("accepted", "duplicate_exact") else [])  # _recheck_duplicate's
                self._read_ahead(tx, ctx, guard, lambda: tx.candidate(ctx.tenant, ctx.workspace, cand.candidate_id),
                                 *standing_read)
                current = self._recheck(tx, ctx, guard, call, grant_id,
                                        tx.candidate(ctx.tenant, ctx.workspace, cand.candidate_id),
                                        lambda state: lifecycle.check_candidate("accept", state))
                self._recheck_duplicate(tx, ctx, cand, status, duplicate_of, forced)
                # Every check before the first write: a batched transaction that fails after it
                # has written takes the rest of its group commit down with it.
                links = payload_links(effective)
                members = (self.reconciler.members_as_decided(tx, ctx, plan, record_id=record_id,
                                                              family_refs=links.family_refs)
                           if plan is not None else {})
                # A duplicate of a current record ends as a rejected candidate whose decision names
                # that record: no second record, the same answer to any later request (SPEC §5).
                to_state = {"accepted": "accepted", "rejected": "rejected", "pending_adjudication": "pending_adjudication",
                            "duplicate_exact": "rejected"}[status]
                event = tx.append_event(
                    ctx.tenant, ctx.workspace, event_id=event_id or new_id("evt_"),
                    operation={"accepted": "accept", "rejected": "reject", "pending_adjudication": "adjudication_required",
                               "duplicate_exact": "reject"}[status],
                    target=cand.candidate_id, from_state=current.state,
                    to_state="accepted_current" if status == "accepted" else to_state, at_ms=now,
                    body={"decision_receipt_digest": decision_receipt, "record_id": record_id if status == "accepted" else "",
                          "decisions": call.summaries(), "audit_id": ctx.audit_id, "reason_ref": reason_ref,
                          **({"duplicate_of": duplicate_of} if status == "duplicate_exact" else {})},
                )
                outcome: dict[str, Any] = {"status": status, "candidate_id": cand.candidate_id}
                if status == "duplicate_exact":
                    outcome["record_id"] = duplicate_of
                if status == "accepted":
                    vt = effective["valid_time"]
                    retention = effective.get("retention", {})
                    expires = retention.get("expires_at")
                    tx.insert_record(RecordRow(
                        record_id=record_id, tenant=ctx.tenant, workspace=ctx.workspace, candidate_id=cand.candidate_id,
                        record_digest=cand.record_digest, payload_digest=cand.payload_digest, state="accepted_current",
                        trust_class=cand.trust_class, principal=cand.principal, agent_id=cand.agent_id,
                        valid_t=vt["t"], valid_t_end=vt.get("t_end"),
                        expires_at_ms=parse_instant(expires) if expires else None,
                        derivative_rule=retention.get("derivative_rule", "make-ineligible"),
                        accepted_at_ms=now, accepted_cursor=event.cursor, state_cursor=event.cursor,
                        successor_id=None, sealed_body=body, key_slot=record_slot,
                        session=cand.session, captured_at_ms=cand.captured_at_ms,
                    ))
                    tx.put_data_key(f"record:{record_id}", record_slot, now)  # type: ignore[arg-type]
                    tx.index_record(ctx.tenant, ctx.workspace, record_id, fields, vector)
                    write_links(tx, ctx.tenant, ctx.workspace, record_id, links)
                    if plan is not None:
                        reconciled = self.reconciler.apply(tx, ctx, plan, members, record_id=record_id,
                                                           event_id=event.event_id, now=now, call=call)
                    outcome["record_id"] = record_id
                terminal = status in ("accepted", "rejected", "duplicate_exact")
                standing: dict[str, Any] = {"status": status, "receipt": decision_receipt}
                if status == "duplicate_exact":
                    standing["record_id"] = duplicate_of
                tx.set_candidate_state(cand.candidate_id, to_state, decision=standing, drop_envelope=terminal)
                if terminal:  # its slot as read for the envelope: _recheck saw the key still live
                    tx.drop_data_key(f"candidate:{cand.candidate_id}", now, status, slot=envelope_slot)
                if terminal and status != "accepted":  # nothing of rejected content outlives it (issue 26.7)
                    tx.scrub_candidate_facts(cand.candidate_id)
                outcome.update({
                    "cursor": str(event.cursor), "decision_receipt_digest": decision_receipt,
                    "transaction_receipt_digest": transaction_receipt_digest(self.core,
                        event.operation, event.event_digest, event.cursor, call, ctx.audit_id,
                        {"reconciled": reconciled} if reconciled else None),
                })
                result = {"outcome": outcome, "replayed": False}
                if guard is not None:
                    self._remember(tx, ctx, guard, {"outcome": outcome})
                tx.append_audit(self.core.audit_row(ctx, audit_operation or ADMISSION_TOOL, status, cand.candidate_id, call))
        except _Replayed as r:
            if record_slot is not None:
                self.core.vault.destroy(record_slot)
            return {**r.outcome, "replayed": True}
        except BaseException:
            if record_slot is not None:
                self.core.vault.destroy(record_slot)
            raise
        self._finish_destruction(tx)
        return result

    @staticmethod
    def _recheck_duplicate(tx: Tx, ctx: BoundContext, cand: CandidateRow, status: str,
                           duplicate_of: str | None, forced: str | None) -> None:
        """Inside the write transaction: the duplicate fact the decision rested on still holds. A
        record with this content admitted meanwhile (a concurrent admission of equal content), or
        the duplicated record gone from current, is POLICY_STALE: the retry decides again."""
        if forced is not None or status not in ("accepted", "duplicate_exact"):
            return
        now_of, _ = tx.payload_standing(ctx.tenant, ctx.workspace, cand.payload_digest)
        if status == "accepted" and now_of is not None:
            raise EngramError(Code.POLICY_STALE, "equal content admitted meanwhile")
        if status == "duplicate_exact" and now_of is None:
            raise EngramError(Code.POLICY_STALE, "duplicated record no longer current")

    def _already_admitted(self, ctx: BoundContext, cand: CandidateRow, call: CallRecord,
                          guard: Guard | None) -> dict[str, Any]:
        return self._outcome_only(ctx, cand, "duplicate_exact", call, guard)

    def _outcome_only(self, ctx: BoundContext, cand: CandidateRow, status: str, call: CallRecord,
                      guard: Guard | None) -> dict[str, Any]:
        """Report a candidate's standing admission outcome without a new effect."""
        decision = cand.decision or {}
        outcome: dict[str, Any] = {"status": status, "candidate_id": cand.candidate_id}
        if cand.state == "accepted":
            outcome["record_id"] = record_id_of(cand.record_digest)
        elif isinstance(decision.get("record_id"), str):
            outcome["record_id"] = decision["record_id"]  # the current record it duplicated
        with self.core.store.write(batched=True, scope=(ctx.tenant, ctx.workspace)) as tx:
            if guard is not None:
                prior = self._replay(tx, ctx, guard)
                if prior is not None:
                    return {**prior, "replayed": True}
            scope = tx.scope(ctx.tenant, ctx.workspace)
            outcome.update({
                "cursor": str(scope.last_cursor if scope else 0),
                "decision_receipt_digest": decision.get("receipt", digest("receipt", {"candidate_id": cand.candidate_id})),
                "transaction_receipt_digest": with_receipt_digest({"kind": "no-op", "status": status,
                                                                   "candidate_id": cand.candidate_id})["receipt_digest"],
            })
            if guard is not None:
                self._remember(tx, ctx, guard, {"outcome": outcome})
            tx.append_audit(self.core.audit_row(ctx, ADMISSION_TOOL, status, cand.candidate_id, call))
        return {"outcome": outcome, "replayed": False}

    def _keep_early(self, candidate_id: str, future: Future[list[float]] | None) -> None:
        if future is None:
            return
        with self._early_lock:
            self._early_vectors[candidate_id] = future
            while len(self._early_vectors) > EARLY_VECTORS:
                self._early_vectors.popitem(last=False)

    def _take_early(self, candidate_id: str) -> Future[list[float]] | None:
        with self._early_lock:
            return self._early_vectors.pop(candidate_id, None)

    def _start_embedding(self, effective: dict[str, Any]) -> Future[list[float]] | None:
        if getattr(self.core, "embedder", None) is None:
            return None
        return self._record_embeddings.submit(record_text(effective))

    def embed_record(self, effective: dict[str, Any]) -> tuple[str, list[float]] | None:
        """The record's vector for the semantic channel (model id, values), or None when it is off."""
        embedder = getattr(self.core, "embedder", None)
        if embedder is None:
            return None
        return embedder.model_id, self._record_embeddings.embed(record_text(effective))

    def _open_envelope(self, cand: CandidateRow) -> tuple[dict[str, Any], int]:
        """The candidate's opened envelope, and its data key's slot."""
        found = self.core.data_key(None, f"candidate:{cand.candidate_id}", cand.key_slot)
        if found is None:
            raise EngramError(Code.BLOB_MISSING, "data key missing")
        slot, key = found
        return json.loads(unseal(key, cand.sealed_envelope or b"", kind="candidate", owner=cand.candidate_id)), slot

    def _after_lost_key(self, ctx: BoundContext, cand: CandidateRow, guard: Guard | None) -> dict[str, Any] | None:
        """A pending candidate's key went after it was read: a concurrent request decided it. If
        that request had this idempotency key, its outcome is this request's answer (SPEC §7);
        otherwise the lifecycle's refusal (ALREADY_TERMINAL, ...), not BLOB_MISSING. None: neither
        applies (the caller re-raises). The candidate is read first: see ``gated_precondition``."""
        with self.core.store.read(snapshot=False) as tx:
            fresh = tx.candidate(ctx.tenant, ctx.workspace, cand.candidate_id)
            prior = self._replay(tx, ctx, guard) if guard is not None else None
        if prior is not None:
            return {**prior, "replayed": True}
        if fresh is None:
            raise EngramError(Code.NOT_FOUND, "candidate")
        lifecycle.check_candidate("accept", fresh.state)
        if fresh.state == "accepted":
            raise EngramError(Code.ILLEGAL_TRANSITION, "candidate admitted concurrently")
        return None

    # -- withdraw ------------------------------------------------------------------------------
    def withdraw(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        call = CallRecord()
        started = self._start_gated(
            ctx, WITHDRAW_TOOL, args, grant, call, what="candidate",
            lookup=lambda tx: tx.candidate(ctx.tenant, ctx.workspace, args["candidate_id"]),
            check_state=lambda state: lifecycle.check_candidate("withdraw", state))
        if isinstance(started, dict):
            return started
        cand, guard, grant_id = started
        return self.withdraw_candidate(ctx, cand, call, guard=guard, grant_id=grant_id, reason_ref=args["reason_ref"])

    def _start_gated(self, ctx: BoundContext, tool: str, args: dict[str, Any], grant: bytes | None,
                     call: CallRecord, *, what: str, lookup: Any, check_state: Any) -> Any:
        """What withdraw and forget share before their write: the call prepared once, authorized,
        then the one gated precondition (a replay answers its stored outcome, no grant needed),
        then the grant verified. Returns the replayed answer, or (target, guard, grant id)."""
        prepared = prepare(ctx, tool, args)
        self.core.authorize(ctx, tool, call, stored_strings=stored_strings(args))
        standing = gated_precondition(self.core, ctx, prepared.guard, grant=grant, grant_required=True, what=what,
                                      lookup=lookup, check_state=check_state)
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        assert standing.target is not None and grant is not None
        return standing.target, prepared.guard, self._verify_grant(ctx, prepared, grant).grant_id

    def withdraw_candidate(self, ctx: BoundContext, cand: CandidateRow, call: CallRecord, *, guard: Guard | None,
                           grant_id: str | None, reason_ref: str,
                           operation: str = "withdraw", to_state: str = "withdrawn", event_id: str | None = None,
                           audit_operation: str | None = None) -> dict[str, Any]:
        now = self.core.now_ms()
        authz_digest = self.core.decision_receipt(call.decisions[0])["receipt_digest"]
        self._take_early(cand.candidate_id)  # its content goes: so does a vector computed early
        try:
            with self.core.store.write(batched=True, scope=(ctx.tenant, ctx.workspace)) as tx:
                self._read_ahead(tx, ctx, guard, lambda: tx.candidate(ctx.tenant, ctx.workspace, cand.candidate_id))
                current = self._recheck(tx, ctx, guard, call, grant_id,
                                        tx.candidate(ctx.tenant, ctx.workspace, cand.candidate_id),
                                        lambda state: lifecycle.check_candidate(operation, state))
                event = tx.append_event(
                    ctx.tenant, ctx.workspace, event_id=event_id or new_id("evt_"), operation=operation,
                    target=cand.candidate_id,
                    from_state=current.state, to_state=to_state, at_ms=now,
                    body={"reason_ref": reason_ref, "decisions": call.summaries(), "audit_id": ctx.audit_id},
                )
                tx.set_candidate_state(cand.candidate_id, to_state, drop_envelope=True)
                tx.scrub_candidate_facts(cand.candidate_id)  # its sizes and family refs go with its content
                tx.drop_data_key(f"candidate:{cand.candidate_id}", now, operation, slot=current.key_slot)
                receipt = {
                    "event_id": event.event_id, "operation": operation, "from_state": "pending", "to_state": to_state,
                    "cursor": str(event.cursor), "event_digest": event.event_digest,
                    "authorization_receipt_digest": authz_digest,
                    "transaction_receipt_digest": transaction_receipt_digest(self.core, operation, event.event_digest, event.cursor, call, ctx.audit_id),
                }
                # Pending when it commits: the KEK generation wrapping the key is the active one,
                # which retires only after a rotation (docs/admin.md, "Keys").
                stored = {"receipt": receipt, "key_destruction": "pending"}
                if guard is not None:
                    self._remember(tx, ctx, guard, stored)
                tx.append_audit(self.core.audit_row(ctx, audit_operation or WITHDRAW_TOOL, to_state, cand.candidate_id, call))
        except _Replayed as r:
            return {**r.outcome, "replayed": True}
        state = self._finish_destruction(tx)
        return {"receipt": receipt, "replayed": False, "key_destruction": state}

    # -- forget ----------------------------------------------------------------------------------
    def forget(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        call = CallRecord()
        started = self._start_gated(
            ctx, FORGET_TOOL, args, grant, call, what="record",
            lookup=lambda tx: tx.record(ctx.tenant, ctx.workspace, args["record_id"]),
            check_state=lambda state: lifecycle.check_record("tombstone", state))
        if isinstance(started, dict):
            return started
        rec, guard, grant_id = started
        return self.tombstone(ctx, rec.record_id, call, guard=guard, grant_id=grant_id, reason_ref=args["reason_ref"])

    def tombstone(self, ctx: BoundContext, record_id: str, call: CallRecord, *, guard: Guard | None,
                  grant_id: str | None, reason_ref: str, event_id: str | None = None,
                  audit_operation: str | None = None) -> dict[str, Any]:
        """SPEC §5 forget: shred the body key, drop every projection, ledger the payload digest — one transaction."""
        now = self.core.now_ms()
        authz_digest = self.core.decision_receipt(call.decisions[0])["receipt_digest"]
        try:
            with self.core.store.write(batched=True, scope=(ctx.tenant, ctx.workspace)) as tx:
                # The derivatives too: what the forget writes before it reads them (its own event,
                # record, key and tombstone rows) does not change the derivatives' rows. And the
                # projection, which a core whose index does not hold the record counts postings in.
                self._read_ahead(tx, ctx, guard, lambda: tx.record(ctx.tenant, ctx.workspace, record_id),
                                 lambda: tx.derivatives(ctx.tenant, ctx.workspace, record_id),
                                 lambda: tx.projection(record_id))
                rec = self._recheck(tx, ctx, guard, call, grant_id,
                                    tx.record(ctx.tenant, ctx.workspace, record_id),
                                    lambda state: lifecycle.check_record("tombstone", state))
                event = tx.append_event(
                    ctx.tenant, ctx.workspace, event_id=event_id or new_id("evt_"), operation="tombstone",
                    target=record_id,
                    from_state=rec.state, to_state="tombstoned", at_ms=now,
                    body={"reason_ref": reason_ref, "decisions": call.summaries(), "audit_id": ctx.audit_id},
                )
                tx.set_record_state(record_id, "tombstoned", state_cursor=event.cursor, drop_body=True)
                removed = tx.unindex_record(ctx.tenant, ctx.workspace, record_id)
                tx.add_tombstone(ctx.tenant, ctx.workspace, rec.payload_digest, record_id, event.cursor, now)
                tx.drop_data_key(f"record:{record_id}", now, "tombstone", slot=rec.key_slot)
                derivatives = apply_derivative_rule(tx, ctx, rec, cause="tombstone", cause_event_id=event.event_id,
                                                    now=now, call=call)
                tx.drop_record_links(record_id)
                tx.scrub_candidate_facts(rec.candidate_id)  # the admitted candidate's sizes and family refs
                receipt = {
                    "event_id": event.event_id, "operation": "tombstone", "from_state": rec.state,
                    "to_state": "tombstoned", "cursor": str(event.cursor), "event_digest": event.event_digest,
                    "authorization_receipt_digest": authz_digest,
                    "transaction_receipt_digest": transaction_receipt_digest(self.core, "tombstone", event.event_digest, event.cursor, call, ctx.audit_id),
                }
                coverage = with_receipt_digest({
                    "kind": "coverage", "record_id": record_id, "postings_removed": removed, "vectors_removed": True,
                    "body_dropped": True, "key_destroyed": True, "tombstone_ledgered": True, "cursor": str(event.cursor),
                    "derivative_rule": rec.derivative_rule, "derivatives": derivatives,
                })["receipt_digest"]
                stored = {"receipt": receipt, "projection_invalidation": "complete", "coverage_receipt_digest": coverage}
                if guard is not None:
                    self._remember(tx, ctx, guard, stored)
                tx.append_audit(self.core.audit_row(ctx, audit_operation or FORGET_TOOL, "tombstoned", record_id, call))
        except _Replayed as r:
            return {**r.outcome, "replayed": True}
        # Complete once the key is gone from the live vault: the body and the search projection were
        # sealed under it, so whatever the database leaves in freed pages is ciphertext this store
        # cannot open (SPEC §10); copies of older key material are what key-status reports on. No
        # CHECKPOINT is needed for that (it was half of a forget's time).
        return {**stored, "replayed": False, "projection_invalidation": "complete" if tx.keys_zeroed else "pending"}


class _Replayed(Exception):
    """Raised inside a write transaction when a concurrent identical request won the race."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__("replayed")
        self.outcome = outcome
