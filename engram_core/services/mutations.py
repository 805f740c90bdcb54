"""The mutations agents and hosts both perform (SPEC §5–7): admission, a candidate's withdrawal,
a record's tombstone, with the steps every mutation shares inside its write transaction (the
replay check, the recheck of what was decided on, a grant consumed, the idempotency outcome
kept) and the record vectors an admission embeds.

The agents' tool calls (``memory.MemoryService``: capture, request_admission, withdraw, forget)
and the host's maintenance (``maintenance``: adjudication, transitions; ``backup``: a restore's
vectors) call these, each after its own preparation and authorization, so an agent's forget
and a host's tombstone are one code path (docs/architecture.md, "One request pipeline").
Errors are EngramError only.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cryptography.exceptions import InvalidTag

from engram_core.contract.canonical import canonical_json, digest, with_receipt_digest
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.tools import ADMISSION_TOOL, FORGET_TOOL, WITHDRAW_TOOL
from engram_core.contract.validation import parse_instant
from engram_core.crypto.sealing import seal, unseal
from engram_core.policy.port import ADMISSION
from engram_core.services import lifecycle
from engram_core.services.content_signals import ContentSignals, future_vector
from engram_core.services.core import CallRecord, Core, context_facts, new_id, record_id_of
from engram_core.services.derivatives import apply_derivative_rule
from engram_core.services.embedding import EmbeddingBatcher
from engram_core.services.lexical import record_fields
from engram_core.services.pipeline import Guard, guarded_outcome, transaction_receipt_digest
from engram_core.services.ranking import Profile
from engram_core.services.reconciliation import Reconciler, payload_links, write_links
from engram_core.store.port import CandidateRow, IdempotencyRow, RecordRow, Tx
from engram_core.trust.hostctx import BoundContext


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


class Mutations:
    """One core's mutations, shared by its agents' service and its host's maintenance."""

    def __init__(self, core: Core, lexical_profile: Profile) -> None:
        self.core = core
        self.reconciler = Reconciler(core)
        # Admission's content signals rank similar records with the reads' lexical profile (issue 59).
        self.content_signals = ContentSignals(core, lexical_profile)
        # Admissions' record texts: concurrent admissions share a model run.
        self._record_embeddings = EmbeddingBatcher(lambda: getattr(self.core, "embedder", None))
        # Vectors of just-captured candidates, computed while the agent turns round to request
        # admission (which then does not wait for the model). Memory only, bounded, dropped when
        # the candidate is decided or withdrawn.
        self._early_vectors: OrderedDict[str, Future[list[float]]] = OrderedDict()
        self._early_lock = threading.Lock()

    # -- the steps every mutation shares ----------------------------------------------------------
    def replay(self, tx: Tx, ctx: BoundContext, guard: Guard) -> dict[str, Any] | None:
        return guarded_outcome(tx, ctx, guard)

    def remember(self, tx: Tx, ctx: BoundContext, guard: Guard, outcome: dict[str, Any]) -> None:
        tx.idempotency_put(ctx.scope, ctx.principal, guard.key,
                           IdempotencyRow(guard.tool, guard.target, guard.request_digest, outcome), self.core.now_ms())

    def recheck(self, tx: Tx, ctx: BoundContext, guard: Guard | None, call: CallRecord, grant_id: str | None,
                target: Any, check_state: Any) -> Any:
        """Inside the serialized write transaction, everything checked before may have moved:
        a concurrent identical request may have won (replay), the bundle may have been reloaded
        (POLICY_STALE), the target may have changed state (lifecycle). The grant is consumed
        here, in the same transaction as the effect (SPEC §7, §8)."""
        if guard is not None:
            prior = self.replay(tx, ctx, guard)
            if prior is not None:
                raise Replayed(prior)
        self.core.check_revision(call)
        if target is None:
            raise EngramError(Code.NOT_FOUND, "target")
        check_state(target.state)
        if grant_id is not None:
            self.consume_grant(tx, ctx, grant_id)
        return target

    def read_ahead(self, tx: Tx, ctx: BoundContext, guard: Guard | None, *reads: Callable[[], object]) -> None:
        """A write transaction's reads before its first write, and the replay check of
        ``_recheck``, in one round trip with the scope lock where the store is remote
        (``Tx.read_ahead``): each mutation then holds its scope for at most three."""
        tx.read_ahead(*reads, *([lambda: self.replay(tx, ctx, guard)] if guard is not None else []))

    def consume_grant(self, tx: Tx, ctx: BoundContext, grant_id: str) -> None:
        if not tx.use_confirmation(grant_id, ctx.scope, self.core.now_ms()):
            raise EngramError(Code.GATE_FAILED, "confirmation already used", reason_class="confirmation_invalid",
                              reasons=("GRANT_USED",))

    @staticmethod
    def finish_destruction(tx: Tx) -> str:
        """The keys the transaction destroyed (the store zeroes them after COMMIT): 'complete' once
        gone from the live vault and from every KEK generation that wrapped them; 'pending' until
        those generations retire (or a zeroing left to the next start's reconciliation)."""
        return tx.key_destruction_outcome

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
        embedding = self.take_early(cand.candidate_id) or self.start_embedding(effective)
        # As the writer sees it: a record admitted a moment ago is one to compare with.
        with self.core.store.read(snapshot=False, as_writer=True) as tx:
            duplicate_of, tombstoned = tx.payload_standing(ctx.scope, cand.payload_digest)
            content = (self.content_signals.admission_facts(tx, ctx.scope, effective, now=now,
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
            with self.core.store.write(batched=True, scope=ctx.scope) as tx:
                standing_read = ([lambda: tx.payload_standing(ctx.scope, cand.payload_digest)]
                                 if forced is None and status in ("accepted", "duplicate_exact") else [])  # _recheck_duplicate's
                self.read_ahead(tx, ctx, guard, lambda: tx.candidate(ctx.scope, cand.candidate_id),
                                *standing_read)
                current = self.recheck(tx, ctx, guard, call, grant_id,
                                       tx.candidate(ctx.scope, cand.candidate_id),
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
                    ctx.scope, event_id=event_id or new_id("evt_"),
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
                    tx.index_record(ctx.scope, record_id, fields, vector)
                    write_links(tx, ctx.scope, record_id, links)
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
                    self.remember(tx, ctx, guard, {"outcome": outcome})
                tx.append_audit(self.core.audit_row(ctx, audit_operation or ADMISSION_TOOL, status, cand.candidate_id, call))
        except Replayed as r:
            if record_slot is not None:
                self.core.vault.destroy(record_slot)
            return {**r.outcome, "replayed": True}
        except BaseException:
            if record_slot is not None:
                self.core.vault.destroy(record_slot)
            raise
        self.finish_destruction(tx)
        return result

    @staticmethod
    def _recheck_duplicate(tx: Tx, ctx: BoundContext, cand: CandidateRow, status: str,
                           duplicate_of: str | None, forced: str | None) -> None:
        """Inside the write transaction: the duplicate fact the decision rested on still holds. A
        record with this content admitted meanwhile (a concurrent admission of equal content), or
        the duplicated record gone from current, is POLICY_STALE: the retry decides again."""
        if forced is not None or status not in ("accepted", "duplicate_exact"):
            return
        now_of, _ = tx.payload_standing(ctx.scope, cand.payload_digest)
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
        with self.core.store.write(batched=True, scope=ctx.scope) as tx:
            if guard is not None:
                prior = self.replay(tx, ctx, guard)
                if prior is not None:
                    return {**prior, "replayed": True}
            scope = tx.scope(ctx.scope)
            outcome.update({
                "cursor": str(scope.last_cursor if scope else 0),
                "decision_receipt_digest": decision.get("receipt", digest("receipt", {"candidate_id": cand.candidate_id})),
                "transaction_receipt_digest": with_receipt_digest({"kind": "no-op", "status": status,
                                                                   "candidate_id": cand.candidate_id})["receipt_digest"],
            })
            if guard is not None:
                self.remember(tx, ctx, guard, {"outcome": outcome})
            tx.append_audit(self.core.audit_row(ctx, ADMISSION_TOOL, status, cand.candidate_id, call))
        return {"outcome": outcome, "replayed": False}

    def keep_early(self, candidate_id: str, future: Future[list[float]] | None) -> None:
        if future is None:
            return
        with self._early_lock:
            self._early_vectors[candidate_id] = future
            while len(self._early_vectors) > EARLY_VECTORS:
                self._early_vectors.popitem(last=False)

    def take_early(self, candidate_id: str) -> Future[list[float]] | None:
        with self._early_lock:
            return self._early_vectors.pop(candidate_id, None)

    def start_embedding(self, effective: dict[str, Any]) -> Future[list[float]] | None:
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
            fresh = tx.candidate(ctx.scope, cand.candidate_id)
            prior = self.replay(tx, ctx, guard) if guard is not None else None
        if prior is not None:
            return {**prior, "replayed": True}
        if fresh is None:
            raise EngramError(Code.NOT_FOUND, "candidate")
        lifecycle.check_candidate("accept", fresh.state)
        if fresh.state == "accepted":
            raise EngramError(Code.ILLEGAL_TRANSITION, "candidate admitted concurrently")
        return None

    def withdraw_candidate(self, ctx: BoundContext, cand: CandidateRow, call: CallRecord, *, guard: Guard | None,
                           grant_id: str | None, reason_ref: str,
                           operation: str = "withdraw", to_state: str = "withdrawn", event_id: str | None = None,
                           audit_operation: str | None = None) -> dict[str, Any]:
        now = self.core.now_ms()
        authz_digest = self.core.decision_receipt(call.decisions[0])["receipt_digest"]
        self.take_early(cand.candidate_id)  # its content goes: so does a vector computed early
        try:
            with self.core.store.write(batched=True, scope=ctx.scope) as tx:
                self.read_ahead(tx, ctx, guard, lambda: tx.candidate(ctx.scope, cand.candidate_id))
                current = self.recheck(tx, ctx, guard, call, grant_id,
                                       tx.candidate(ctx.scope, cand.candidate_id),
                                       lambda state: lifecycle.check_candidate(operation, state))
                event = tx.append_event(
                    ctx.scope, event_id=event_id or new_id("evt_"), operation=operation,
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
                    self.remember(tx, ctx, guard, stored)
                tx.append_audit(self.core.audit_row(ctx, audit_operation or WITHDRAW_TOOL, to_state, cand.candidate_id, call))
        except Replayed as r:
            return {**r.outcome, "replayed": True}
        state = self.finish_destruction(tx)
        return {"receipt": receipt, "replayed": False, "key_destruction": state}

    def tombstone(self, ctx: BoundContext, record_id: str, call: CallRecord, *, guard: Guard | None,
                  grant_id: str | None, reason_ref: str, event_id: str | None = None,
                  audit_operation: str | None = None) -> dict[str, Any]:
        """SPEC §5 forget: shred the body key, drop every projection, ledger the payload digest — one transaction."""
        now = self.core.now_ms()
        authz_digest = self.core.decision_receipt(call.decisions[0])["receipt_digest"]
        try:
            with self.core.store.write(batched=True, scope=ctx.scope) as tx:
                # The derivatives too: what the forget writes before it reads them (its own event,
                # record, key and tombstone rows) does not change the derivatives' rows. And the
                # projection, which a core whose index does not hold the record counts postings in.
                self.read_ahead(tx, ctx, guard, lambda: tx.record(ctx.scope, record_id),
                                lambda: tx.derivatives(ctx.scope, record_id),
                                lambda: tx.projection(record_id))
                rec = self.recheck(tx, ctx, guard, call, grant_id,
                                   tx.record(ctx.scope, record_id),
                                   lambda state: lifecycle.check_record("tombstone", state))
                event = tx.append_event(
                    ctx.scope, event_id=event_id or new_id("evt_"), operation="tombstone",
                    target=record_id,
                    from_state=rec.state, to_state="tombstoned", at_ms=now,
                    body={"reason_ref": reason_ref, "decisions": call.summaries(), "audit_id": ctx.audit_id},
                )
                tx.set_record_state(record_id, "tombstoned", state_cursor=event.cursor, drop_body=True)
                removed = tx.unindex_record(ctx.scope, record_id)
                tx.add_tombstone(ctx.scope, rec.payload_digest, record_id, event.cursor, now)
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
                    self.remember(tx, ctx, guard, stored)
                tx.append_audit(self.core.audit_row(ctx, audit_operation or FORGET_TOOL, "tombstoned", record_id, call))
        except Replayed as r:
            return {**r.outcome, "replayed": True}
        # Complete once the key is gone from the live vault: the body and the search projection were
        # sealed under it, so whatever the database leaves in freed pages is ciphertext this store
        # cannot open (SPEC §10); copies of older key material are what key-status reports on. No
        # CHECKPOINT is needed for that (it was half of a forget's time).
        return {**stored, "replayed": False, "projection_invalidation": "complete" if tx.keys_zeroed else "pending"}


class Replayed(Exception):
    """Raised inside a write transaction when a concurrent identical request won the race."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__("replayed")
        self.outcome = outcome
