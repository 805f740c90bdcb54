"""The agents' six tool calls (SPEC §5–8): capture, request_admission, withdraw, forget, and
search and get, which the reading service answers (``reading.ReadService``, held, not inherited).

Each mutation: prepare (validated and canonicalized once, its digests computed once:
``pipeline.prepare``) → bind purpose → authorize (policy) → idempotency guard → lifecycle
check → policy decisions → one write transaction holding the effect, journal event,
idempotency outcome and audit row → post-commit key-slot zeroing. Admission, withdrawal and
the tombstone are the mutations hosts perform too: they are ``mutations.Mutations``', which
this service and the host's maintenance both call. Errors are EngramError only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engram_core.contract.canonical import (
    Canonical,
    canonical,
    canonical_json,
    canonical_object,
    digest,
)
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, FORGET_TOOL, GATED_TOOLS, WITHDRAW_TOOL
from engram_core.contract.validation import parse_instant
from engram_core.crypto.sealing import seal
from engram_core.policy.port import CAPTURE
from engram_core.secret_scan.scan import scan
from engram_core.services import lifecycle
from engram_core.services.content_signals import capture_facts
from engram_core.services.core import (
    CallRecord,
    Core,
    context_facts,
    denied,
    new_id,
    require_current_epoch,
)
from engram_core.services.mutations import Mutations, Replayed
from engram_core.services.pipeline import (
    Guard,
    PreparedCall,
    Standing,
    gated_precondition,
    prepare,
    require_grant,
    transaction_receipt_digest,
)
from engram_core.services.reading import ReadService
from engram_core.store.port import CandidateRow, Tx
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


@dataclass(frozen=True)
class _GatedTarget:
    """What withdraw and forget act on: the argument naming it, how it is read in the caller's
    scope and which transitions its state allows (one description for the calls and CheckGated)."""

    field: str
    what: str  # names the target in a refusal's detail
    read: Callable[[Tx, str, str, str], Any]  # (tx, tenant, workspace, id)
    check_state: Callable[[str], object]
    # The write once the target stands: (mutations, ctx, target, call, guard, grant id, reason_ref).
    write: Callable[[Mutations, BoundContext, Any, CallRecord, Guard | None, str | None, str], dict[str, Any]]


_GATED_TARGETS = {
    WITHDRAW_TOOL: _GatedTarget(
        "candidate_id", "candidate", lambda tx, t, w, i: tx.candidate(Scope(t, w), i),
        lambda state: lifecycle.check_candidate("withdraw", state),
        lambda m, ctx, cand, call, guard, grant_id, reason: m.withdraw_candidate(
            ctx, cand, call, guard=guard, grant_id=grant_id, reason_ref=reason)),
    FORGET_TOOL: _GatedTarget(
        "record_id", "record", lambda tx, t, w, i: tx.record(Scope(t, w), i),
        lambda state: lifecycle.check_record("tombstone", state),
        lambda m, ctx, rec, call, guard, grant_id, reason: m.tombstone(
            ctx, rec.record_id, call, guard=guard, grant_id=grant_id, reason_ref=reason)),
}


class MemoryService:
    """The agents' tool calls on one core: reads through the reading service it holds, mutations
    through the ones it shares with the host's maintenance."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.reading = ReadService(core)
        self.mutations = Mutations(core, self.reading.profiles["lexical"])

    # -- reads ---------------------------------------------------------------------------------
    def search(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        return self.reading.search(ctx, args)

    def get(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        return self.reading.get(ctx, args)

    # -- what the gated calls share --------------------------------------------------------------
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
        require_current_epoch(parsed.authorization_epoch, self.core.store.latest_scope(ctx.scope),
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
        gated = _GATED_TARGETS[tool]
        tool_args = {gated.field: args.get("target", ""), "idempotency_key": args.get("idempotency_key", ""),
                     "reason_ref": args.get("reason_ref", "")}
        prepared = prepare(ctx, tool, tool_args)
        self.core.authorize(ctx, tool, CallRecord(), stored_strings=stored_strings(tool_args))
        replay = self._gated_standing(ctx, tool, tool_args, prepared, grant=None, grant_required=False).replay
        return {"status": "replay" if replay is not None else "ready"}

    # -- capture ---------------------------------------------------------------------------
    def capture(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        call = CallRecord()
        prepared = prepare(ctx, CAPTURE_TOOL, args)
        payload, evidence = args["payload"], args["evidence"]
        payload_c = prepared.member("payload")
        self.reading.bind_purpose(ctx, payload["purpose_ref"])
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
            ctx, CAPTURE_TOOL, call, self.core.store.latest_scope(ctx.scope), CAPTURE,
            {"context": context_facts(ctx), "now_ms": now, "retention": requested, "family_refs": family_refs,
             "findings": findings, **facts, **capture_facts(payload),
             # Payload times (epoch ms), which the policy bounds to the host's window (issue 26.5).
             "valid_time": payload["valid_time"], "primary_event_at": payload["primary_event"]["at"]},
            stored_strings=stored_strings(args))
        with self.core.store.read(snapshot=False, as_writer=True) as tx:  # checked again in the write transaction
            prior = self.mutations.replay(tx, ctx, prepared.guard)
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
        early = self.mutations.start_embedding(effective)
        slot, key = self.core.vault.new_data_key(f"candidate:{candidate_id}", durable=False)
        # The candidate's facts (sizes, findings, retention, family refs) are derived from its
        # content, so they are sealed with it: destroying its key shreds them too (issue 26.7).
        sealed_facts = {**facts, "findings": findings, "retention": resolved, "family_refs": family_refs,
                        "all_components_cited": True}
        envelope = seal(key, canonical_json({"payload": effective_c, "evidence": prepared.member("evidence"),
                                             "facts": sealed_facts}),
                        kind="candidate", owner=candidate_id)
        try:
            with self.core.store.write(batched=True, scope=ctx.scope) as tx:
                prior = self.mutations.replay(tx, ctx, prepared.guard)
                if prior is not None:
                    raise Replayed(prior)
                self.core.check_revision(call)
                if grant_obj is not None:
                    self.mutations.consume_grant(tx, ctx, grant_obj.grant_id)
                event = tx.append_event(
                    ctx.scope, event_id=new_id("evt_"), operation="capture", target=candidate_id,
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
                self.mutations.remember(tx, ctx, prepared.guard, outcome)
                tx.append_audit(self.core.audit_row(ctx, CAPTURE_TOOL, "committed_pending", candidate_id, call))
        except Replayed as r:
            self.core.vault.destroy(slot)
            return {**r.outcome, "status": "duplicate_exact"}
        except BaseException:
            self.core.vault.destroy(slot)
            raise
        self.core.quotas.add(ctx.scope, ctx.principal, "bytes_stored", facts["payload_bytes"])
        self.mutations.keep_early(candidate_id, early)
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
        with self.core.store.read(snapshot=False, as_writer=True) as tx:  # both checked again in the write transaction
            cand = tx.candidate(ctx.scope, args["candidate_id"])  # first: see gated_precondition
            prior = self.mutations.replay(tx, ctx, prepared.guard)
        if prior is not None:
            return {**prior, "replayed": True}
        if cand is None:
            raise EngramError(Code.NOT_FOUND, "candidate")
        grant_obj = None
        if authz.result.get("obligations", {}).get("confirmation_required"):
            grant_obj = self._verify_grant(ctx, prepared, require_grant(grant))
        return self.mutations.admit(ctx, cand, call, guard=prepared.guard, grant_id=grant_obj.grant_id if grant_obj else None)

    # -- withdraw and forget ------------------------------------------------------------------
    def withdraw(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        return self._gated_write(ctx, WITHDRAW_TOOL, args, grant)

    def forget(self, ctx: BoundContext, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        return self._gated_write(ctx, FORGET_TOOL, args, grant)

    def _gated_write(self, ctx: BoundContext, tool: str, args: dict[str, Any], grant: bytes | None) -> dict[str, Any]:
        """Withdraw and forget: the call prepared once, authorized, then the one gated precondition
        (a replay answers its stored outcome, no grant needed), the grant verified, and the
        target's write."""
        call = CallRecord()
        prepared = prepare(ctx, tool, args)
        self.core.authorize(ctx, tool, call, stored_strings=stored_strings(args))
        standing = self._gated_standing(ctx, tool, args, prepared, grant=grant, grant_required=True)
        if standing.replay is not None:
            return {**standing.replay, "replayed": True}
        assert standing.target is not None and grant is not None
        grant_id = self._verify_grant(ctx, prepared, grant).grant_id
        return _GATED_TARGETS[tool].write(self.mutations, ctx, standing.target, call, prepared.guard, grant_id,
                                          args["reason_ref"])

    def _gated_standing(self, ctx: BoundContext, tool: str, args: dict[str, Any], prepared: PreparedCall, *,
                        grant: bytes | None, grant_required: bool) -> Standing[Any]:
        gated = _GATED_TARGETS[tool]
        return gated_precondition(
            self.core, ctx, prepared.guard, grant=grant, grant_required=grant_required, what=gated.what,
            lookup=lambda tx: gated.read(tx, ctx.tenant, ctx.workspace, args[gated.field]),
            check_state=gated.check_state)
