"""HostService (SPEC §12): health, capabilities (the tool list), confirmations."""

from __future__ import annotations

import json
from typing import Any

from engram_core import __version__
from engram_core.contract.errors import HOST_REFUSAL_REASONS, REFUSALS, RETRIABLE, Code, EngramError
from engram_core.contract.tools import TOOL_NAMES
from engram_core.contract.validation import rebuild_pointer
from engram_core.policy.port import AUTHZ, TOOLS
from engram_core.services.core import POLICY_TIMEOUT_S, CallRecord, Core, context_facts, require_current_epoch
from engram_core.trust.hostctx import GRANT_EXECUTION_WINDOW_MS, BoundContext, make_grant

MAX_APPROVAL_AGE_MS = GRANT_EXECUTION_WINDOW_MS
# store_meta key: when the last signed anchor was made and at which audit row (maintenance.anchor).
LAST_ANCHOR_META = "audit.last_anchor"
_MAX_REASON_CODES = 16
_MAX_REF_BYTES = 512


class HostServiceCore:
    def __init__(self, core: Core, confirmation_key) -> None:
        self.core = core
        self._confirmation_key = confirmation_key

    def health(self) -> dict[str, Any]:
        store_open = self.core.store.is_open()
        active = self.core.policy.active()
        return {
            "status": "SERVING" if store_open and active else "NOT_SERVING",
            "store_open": store_open,
            "policy_active": active,
            "policy_revision": self.core.policy.revision() if active else "",
            "version": __version__,
            "semantic_available": self.core.embedder is not None,
            "audit_devices": len(self.core.store.audit_device_failures()),
            "last_anchor_at_ms": self._last_anchor_at_ms() if store_open else 0,
        }

    def _last_anchor_at_ms(self) -> int:
        with self.core.store.read(snapshot=False) as tx:
            stamp = tx.meta(LAST_ANCHOR_META)
        return int(json.loads(stamp)["at_ms"]) if stamp else 0

    def list_capabilities(self, ctx: BoundContext) -> dict[str, Any]:
        call = CallRecord()
        with self.core.store.read() as tx:
            scope = tx.scope(ctx.scope)
        require_current_epoch(ctx.authorization_epoch, scope, "context epoch older than scope epoch")
        facts = {"context": context_facts(ctx),
                 "scope": {"activated": bool(scope and scope.activated), "tools": list(scope.tools) if scope else []},
                 "now_ms": self.core.now_ms()}
        # The list and every agent tool's authorization in one engine call (seven took ~1.5 ms);
        # only the listed tools' decisions are recorded, as when each was asked on its own.
        d, *each = self.core.policy.decide_all([(TOOLS, facts)] + [(AUTHZ, {"operation": t, **facts}) for t in TOOL_NAMES],
                                               timeout_s=POLICY_TIMEOUT_S)
        call.add(d)
        authz_of = dict(zip(TOOL_NAMES, each, strict=True))
        tools = sorted(d.result["tools"])
        gated = []
        for tool in tools:
            authz = call.add(authz_of[tool]) if tool in authz_of else self.core.decide(AUTHZ, {"operation": tool, **facts}, call)
            if authz.result["allow"] and authz.result.get("obligations", {}).get("confirmation_required"):
                gated.append(tool)
        return {"tools": tools, "policy_revision": d.revision, "decision_id": d.decision_id,
                "confirmation_required": gated,
                "reason_codes": sorted({r["code"] for r in d.result.get("reasons", [])})}

    def authorization_epoch(self, ctx: BoundContext) -> dict[str, Any]:
        """The bound scope's revocation epoch, for a host principal (policy decides who).

        Not epoch-bound itself: it is how a host holding a trusted key learns the epoch
        to sign with after a revoke (any key holder can sign any epoch; revoke cuts off
        contexts and grants already signed, not keys — untrust a key for that)."""
        call = CallRecord()
        scope = self.core.store.latest_scope(ctx.scope)
        self.core.authorize(ctx, "host.authorization_epoch", call, scope=scope, epoch_bound=False)
        self.core.audit_standalone(ctx, "host.authorization_epoch", "ok", "", call)
        return {"authorization_epoch": scope.authorization_epoch if scope else 0}

    def issue_confirmation(self, ctx: BoundContext, *, tool: str, target: str, operation_digest: str,
                           approved_at_ms: int) -> dict[str, Any]:
        """Sign a single-use grant for a human approval the host obtained (SPEC §8)."""
        call = CallRecord()
        self.core.authorize(ctx, "host.issue_confirmation", call)
        now = self.core.now_ms()
        if not tool or not operation_digest or approved_at_ms > now + 5_000 or now - approved_at_ms > MAX_APPROVAL_AGE_MS:
            raise EngramError(Code.GATE_FAILED, "approval not recent")
        with self.core.store.read() as tx:
            scope = tx.scope(ctx.scope)
        raw = make_grant(
            self._confirmation_key, tenant=ctx.tenant, workspace=ctx.workspace, principal=ctx.principal,
            tool=tool, target=target, operation_digest=operation_digest, approved_at_ms=approved_at_ms,
            authorization_epoch=scope.authorization_epoch if scope else 0,
        )
        from engram_core.api import context_pb2

        env = context_pb2.SignedEnvelope()
        env.ParseFromString(raw)
        grant = context_pb2.ConfirmationGrant()
        grant.ParseFromString(env.body)
        self.core.audit_standalone(ctx, "host.issue_confirmation", "issued", target, call)
        return {"signed_grant": raw, "grant_id": grant.grant_id, "expires_at_ms": grant.expires_at_ms}

    def record_refusal(self, ctx: BoundContext, *, operation: str, code: str, reason_class: str,
                       reason_codes: list[str], pointer: str, target: str) -> dict[str, Any]:
        """The audit row of a refusal the host decided (SPEC §3: every auditId names a row).

        Authorized by policy (``host.record_refusal``); written through the audit spool like
        every row of a call that changed nothing. Only catalogue values are accepted: a tool
        name, a contract code, a class the catalogue holds for it, reason codes the catalogue
        holds for it (``errors.HOST_REFUSAL_REASONS``), a JSON pointer rebuilt from schema names,
        an id-sized target (stored as its digest): never free text. The pointer as stored and the
        target go through the secret scanner first, as every stored string does (SPEC §13); the
        reason codes and class are the catalogue's own strings or refused (INVALID_SCHEMA)."""
        call = CallRecord()
        stored_pointer = rebuild_pointer(pointer[:_MAX_REF_BYTES * 2])  # what the row keeps of it
        self.core.authorize(ctx, "host.record_refusal", call, stored_strings=[stored_pointer, target])
        try:
            refused = Code(code)
        except ValueError:
            raise EngramError(Code.INVALID_SCHEMA, "unknown refusal code", reason_class="value_not_allowed") from None
        if operation not in TOOL_NAMES or refused in RETRIABLE:  # refusals, not transient failures
            raise EngramError(Code.INVALID_SCHEMA, "not a refusal of a tool", reason_class="value_not_allowed")
        if reason_class and reason_class not in REFUSALS.get(refused, {}):
            raise EngramError(Code.INVALID_SCHEMA, "unknown reason class", reason_class="value_not_allowed")
        if len(reason_codes) > _MAX_REASON_CODES or not set(reason_codes) <= HOST_REFUSAL_REASONS.get(refused, set()):
            raise EngramError(Code.INVALID_SCHEMA, "reason codes not in the catalogue", reason_class="value_not_allowed")
        if len(target.encode()) > _MAX_REF_BYTES or len(pointer.encode()) > _MAX_REF_BYTES:
            raise EngramError(Code.INVALID_SCHEMA, "target or pointer too long", reason_class="length_out_of_range")
        error = EngramError(refused, "decided by the host", reason_class=reason_class or None,
                            reasons=tuple(reason_codes), pointer=stored_pointer)
        error.decisions = call.summaries()
        self.core.audit_refusal(ctx, operation, error, target, origin="host")
        return {"audit_id": ctx.audit_id}
