"""Host verifiers for trust (SPEC §5 Trust, §12; issue 18).

A host principal attests a candidate or record as ``signed`` — with the
verifier's Ed25519 public key and its signature over the record digest, which
the core verifies — or ``earned`` (after the host's own adjudication). The
authorization policy decides (``host.attest``, with the attestation's trust
class and verifier key id in its input); the change is one journal event
(``attest``), idempotent by the request's ``event_id``, audited. Every later
policy input that carries a trust class sees the attested one; trust
invalidation takes it back (``services.maintenance``).

Signed bytes: ``ATTESTATION_DOMAIN`` + the record digest as ASCII
(``sha256:<hex>``). The domain keeps an attestation signature from ever passing
as a host context or a confirmation grant, and the other way round.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.contract.canonical import digest, with_receipt_digest
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.services.core import CallRecord, Core
from engram_core.services.pipeline import stored_outcome
from engram_core.store.port import IdempotencyRow
from engram_core.trust.hostctx import BoundContext
from engram_core.trust.hostkeys import key_id, load_public_pem

ATTEST_OPERATION = "host.attest"
ATTESTATION_DOMAIN = b"engram/attestation/v1\x00"
ATTESTED_CLASSES = ("signed", "earned")
# What can be attested: a candidate not yet decided, or a record that is still eligible
# or kept as history. Expired, trust_invalid and tombstoned records are past trusting.
CANDIDATE_STATES = frozenset({"pending", "pending_adjudication"})
RECORD_STATES = frozenset({"accepted_current", "accepted_disputed", "historical"})
_EVENT_ID = re.compile(r"^[A-Za-z0-9_.:/-]{16,256}$")


def attestation_message(record_digest: str) -> bytes:
    return ATTESTATION_DOMAIN + record_digest.encode("ascii")


def sign_attestation(private_key: Ed25519PrivateKey, record_digest: str) -> bytes:
    """What a verifier (or ``engram admin attest``) sends as ``signature``."""
    return private_key.sign(attestation_message(record_digest))


def _ref(value: str, what: str) -> str:
    if not value or len(value.encode()) > 512:
        raise EngramError(Code.INVALID_SCHEMA, f"{what} must be 1-512 bytes")
    return value


class AttestationService:
    def __init__(self, core: Core) -> None:
        self.core = core

    def attest(self, ctx: BoundContext, req: dict[str, Any]) -> dict[str, Any]:
        trust_class = req.get("trust_class", "")
        if trust_class not in ATTESTED_CLASSES:
            raise EngramError(Code.INVALID_SCHEMA, "trust_class must be signed or earned")
        tenant, workspace = _ref(req.get("tenant", ""), "tenant"), _ref(req.get("workspace", ""), "workspace")
        target = _ref(req.get("target", ""), "target")
        reason = _ref(req.get("reason_ref", ""), "reason_ref")
        event_id = req.get("event_id", "")
        if not _EVENT_ID.match(event_id):
            raise EngramError(Code.INVALID_SCHEMA, "event_id")
        pem, signature = req.get("verifier_public_key_pem", ""), req.get("signature", b"")
        verifier = None
        if trust_class == "signed":
            if len(signature) != 64:
                raise EngramError(Code.INVALID_SCHEMA, "signed needs a 64-byte Ed25519 signature")
            try:
                verifier = load_public_pem(pem)
            except Exception:
                raise EngramError(Code.INVALID_SCHEMA, "verifier public key") from None
        elif pem or signature:
            raise EngramError(Code.INVALID_SCHEMA, "earned carries no verifier key or signature")
        verifier_key_id = key_id(verifier) if verifier is not None else ""
        # As for maintenance: the host's own context is authorized (the policy reads the target
        # scope from the attestation facts), then re-bound to the scope it acts on, so journal,
        # idempotency and audit rows land there with the host's principal and audit id.
        call = CallRecord()
        authz = self.core.authorize(ctx, ATTEST_OPERATION, call, facts={
            "attestation": {"tenant": tenant, "workspace": workspace, "trust_class": trust_class,
                            "verifier_key_id": verifier_key_id,
                            "target_kind": "record" if target.startswith("mem_") else "candidate"}},
            stored_strings=[tenant, workspace, target, reason, event_id])  # SPEC §13: secret findings
        tctx = dataclasses.replace(ctx, tenant=tenant, workspace=workspace)
        request_digest = digest("request", {"tool": ATTEST_OPERATION, "target": target, "arguments": {
            "trust_class": trust_class, "verifier_key_id": verifier_key_id,
            "signature": base64.b64encode(signature).decode(), "reason_ref": reason}})
        now = self.core.now_ms()
        with self.core.store.write() as tx:
            prior = stored_outcome(tx, tctx, tool=ATTEST_OPERATION, target=target, key=event_id,
                                   request_digest=request_digest)
            if prior is not None:
                return {**prior, "replayed": True}
            self.core.check_revision(call)
            rec = tx.record(Scope(tenant, workspace), target) if target.startswith("mem_") else None
            cand = None if rec is not None else tx.candidate(Scope(tenant, workspace), target)
            row = rec or cand
            if row is None:
                raise EngramError(Code.NOT_FOUND, "target")
            allowed = RECORD_STATES if rec is not None else CANDIDATE_STATES
            if row.state in ("tombstoned", "rejected", "withdrawn"):
                raise EngramError(Code.ALREADY_TERMINAL, f"target is {row.state}")
            if row.state not in allowed:
                raise EngramError(Code.ILLEGAL_TRANSITION, f"cannot attest a {row.state} target")
            if verifier is not None:
                try:
                    verifier.verify(signature, attestation_message(row.record_digest))
                except InvalidSignature:
                    raise EngramError(Code.UNAUTHORIZED, "attestation signature does not verify") from None
            body: dict[str, Any] = {"trust_class": trust_class, "previous_trust_class": row.trust_class,
                                    "record_digest": row.record_digest, "reason_ref": reason,
                                    "decisions": call.summaries(), "audit_id": tctx.audit_id}
            if verifier is not None:
                body.update(verifier_key_id=verifier_key_id, signature=base64.b64encode(signature).decode())
            event = tx.append_event(Scope(tenant, workspace), event_id=event_id, operation="attest", target=target,
                                    from_state=row.state, to_state=row.state, at_ms=now, body=body)
            if rec is not None:
                tx.set_record_trust_class(target, trust_class)
            else:
                tx.set_candidate_trust_class(target, trust_class)
            receipt = with_receipt_digest({
                "kind": "attestation", "event_id": event.event_id, "operation": "attest", "target": target,
                "record_digest": row.record_digest, "trust_class": trust_class,
                "previous_trust_class": row.trust_class, "verifier_key_id": verifier_key_id,
                "cursor": str(event.cursor), "event_digest": event.event_digest,
                "authorization_receipt_digest": self.core.decision_receipt(authz)["receipt_digest"],
                "at": self.core.instant(now),
            })
            outcome = {"receipt": receipt}
            tx.idempotency_put(Scope(tenant, workspace), tctx.principal, event_id,
                               IdempotencyRow(ATTEST_OPERATION, target, request_digest, outcome), now)
            tx.append_audit(self.core.audit_row(tctx, ATTEST_OPERATION, trust_class, target, call))
        return {**outcome, "replayed": False}
