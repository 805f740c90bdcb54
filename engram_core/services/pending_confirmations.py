"""Confirmations a person gives in the console's browser page (MCP URL-mode elicitation, issue 61).

A client without form elicitation (URL mode only) cannot show the adapter's approve form, so the
adapter parks the exact operation here and sends the person to the console's page for it:

* ``park`` (the adapter, under the agent call's own context): the withdraw or forget, bound to
  tool, target, reason, the operation digest the core recomputes, and the binding (tenant,
  workspace, principal, agent, session). Answers an unguessable single-use id (32 random bytes);
  the console's URL carries only it.
* ``list`` / ``decide`` (the console, under a host-principal context naming the signed-in person,
  on the scope the person's console role covers): what is pending, and the person's approve or
  deny, audited under the person's principal.
* ``claim`` (the adapter, under a context of the same binding): the decision, once. An approved
  confirmation is claimed exactly once and within 30 s of the approval (SPEC §8); the adapter then
  signs the same grant a form elicitation yields, and the core checks it as always.

Nothing here grants anything by itself: the core's confirmation check of the tool call is
unchanged. Pending confirmations live in this process's memory only, at most 300 s (SPEC §8), never
in the store (no memory content is involved: ids, the reason ref and digests). A core restart, or a
confirmation parked on another core of a scale-out deployment, is simply not found: the adapter
answers gate_failed (fail closed).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import asdict, dataclass
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.operation import operation_digest
from engram_core.contract.tools import GATED_TOOLS, TARGET_FIELD
from engram_core.services.core import CallRecord, Core
from engram_core.trust.hostctx import GRANT_EXECUTION_WINDOW_MS, MAX_GRANT_TTL_MS, BoundContext

PARK = "host.park_confirmation"
CLAIM = "host.claim_confirmation"
LIST = "host.list_confirmations"
DECIDE = "host.decide_confirmation"
MAX_WAIT_MS = 5_000           # a claim waits at most this long for the decision (one gRPC worker held)
MAX_PENDING_PER_BINDING = 16  # a flood of gated calls from one principal cannot crowd out others
MAX_PENDING = 10_000
_MAX_REF_BYTES = 512


@dataclass
class Pending:
    confirmation_id: str
    tenant: str
    workspace: str
    principal: str
    agent_id: str
    session: str
    tool: str
    target: str
    reason_ref: str
    operation_digest: str
    requested_audit_id: str
    requested_at_ms: int
    expires_at_ms: int
    state: str = "pending"  # pending | approved | denied | claimed
    decided_by: str = ""
    decided_at_ms: int = 0

    def view(self, now_ms: int) -> dict[str, Any]:
        out = asdict(self)
        if self.state == "pending" and now_ms >= self.expires_at_ms:
            out["state"] = "expired"
        return out


def _ref(value: str, name: str) -> str:
    if not value or len(value.encode()) > _MAX_REF_BYTES:
        raise EngramError(Code.INVALID_SCHEMA, name, reason_class="length_out_of_range")
    return value


class PendingConfirmations:
    """The core's pending confirmations and the four calls on them."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self._by_id: dict[str, Pending] = {}
        self._changed = threading.Condition()

    # -- the adapter ---------------------------------------------------------------------------
    def park(self, ctx: BoundContext, *, tool: str, target: str, reason_ref: str, digest: str,
             ttl_ms: int) -> dict[str, Any]:
        call = CallRecord()
        self.core.authorize(ctx, PARK, call, stored_strings=[target, reason_ref])
        if tool not in GATED_TOOLS:
            raise EngramError(Code.INVALID_SCHEMA, "tool", reason_class="value_not_allowed")
        _ref(target, "target")
        _ref(reason_ref, "reason_ref")
        # The page shows tool, target and reason: they must be exactly what the digest binds.
        target_field = TARGET_FIELD[tool]
        assert target_field is not None  # every gated tool has a target
        expected = operation_digest(tool=tool, tenant=ctx.tenant, workspace=ctx.workspace, principal=ctx.principal,
                                    arguments={target_field: target, "reason_ref": reason_ref})
        if digest != expected:
            raise EngramError(Code.INVALID_DIGEST, "operation digest does not bind these fields")
        now = self.core.now_ms()
        ttl = min(max(int(ttl_ms), 1_000), MAX_GRANT_TTL_MS)
        with self._changed:
            self._sweep(now)
            mine = [p for p in self._by_id.values() if p.state == "pending" and
                    (p.tenant, p.workspace, p.principal) == (ctx.tenant, ctx.workspace, ctx.principal)]
            if len(mine) >= MAX_PENDING_PER_BINDING or len(self._by_id) >= MAX_PENDING:
                raise EngramError(Code.RATE_LIMITED, "too many confirmations pending")
            pending = Pending(
                confirmation_id="cfm_" + secrets.token_urlsafe(32), tenant=ctx.tenant, workspace=ctx.workspace,
                principal=ctx.principal, agent_id=ctx.agent_id, session=ctx.session, tool=tool, target=target,
                reason_ref=reason_ref, operation_digest=digest, requested_audit_id=ctx.audit_id,
                requested_at_ms=now, expires_at_ms=now + ttl)
            self._by_id[pending.confirmation_id] = pending
        self.core.audit_standalone(ctx, PARK, "pending", target, call)
        return {"confirmation_id": pending.confirmation_id, "expires_at_ms": pending.expires_at_ms}

    def claim(self, ctx: BoundContext, *, confirmation_id: str, tool: str, target: str, digest: str,
              wait_ms: int, time_left_ms: int | None) -> dict[str, Any]:
        """The person's decision for the adapter that parked it, once (see the module doc)."""
        call = CallRecord()
        self.core.authorize(ctx, CLAIM, call)
        budget = min(max(int(wait_ms), 0), MAX_WAIT_MS)
        if time_left_ms is not None:
            budget = max(0, min(budget, time_left_ms - 500))
        with self._changed:
            pending = self._by_id.get(confirmation_id)
            if pending is None or (pending.tenant, pending.workspace, pending.principal, pending.agent_id,
                                   pending.session, pending.tool, pending.target, pending.operation_digest) != (
                    ctx.tenant, ctx.workspace, ctx.principal, ctx.agent_id, ctx.session, tool, target, digest):
                raise EngramError(Code.NOT_FOUND, "confirmation")  # never says which of them differed
            deadline = self.core.now_ms() + budget
            while pending.state == "pending" and self.core.now_ms() < min(deadline, pending.expires_at_ms):
                self._changed.wait(max(0.0, (min(deadline, pending.expires_at_ms) - self.core.now_ms()) / 1000))
            now = self.core.now_ms()
            status = pending.state
            if status == "pending" and now >= pending.expires_at_ms:
                status = "expired"
            elif status == "approved":
                # SPEC §8: the confirmed operation runs within 30 s of the approval.
                status = "claimed" if now - pending.decided_at_ms <= GRANT_EXECUTION_WINDOW_MS else "expired"
            elif status == "claimed":
                raise EngramError(Code.NOT_FOUND, "confirmation")  # single use: a second claim finds nothing
            if status in ("claimed", "denied", "expired"):
                del self._by_id[confirmation_id]
            decided_at = pending.decided_at_ms
        answer = "approved" if status == "claimed" else status
        self.core.audit_standalone(ctx, CLAIM, answer, target, call)
        return {"status": answer, "decided_at_ms": decided_at}

    # -- the console -----------------------------------------------------------------------------
    def list(self, ctx: BoundContext, confirmation_id: str) -> dict[str, Any]:
        """The context's scope's pending confirmations (or the one named, if it is this scope's)."""
        call = CallRecord()
        self.core.authorize(ctx, LIST, call, epoch_bound=False)
        now = self.core.now_ms()
        with self._changed:
            self._sweep(now)
            found = [p.view(now) for p in self._by_id.values()
                     if (p.tenant, p.workspace) == (ctx.tenant, ctx.workspace)
                     and (p.confirmation_id == confirmation_id if confirmation_id else p.state == "pending")]
        if confirmation_id and not found:
            raise EngramError(Code.NOT_FOUND, "confirmation")
        found.sort(key=lambda p: p["requested_at_ms"])
        self.core.audit_standalone(ctx, LIST, "ok", found[0]["target"] if confirmation_id else "", call)
        return {"confirmations": found}

    def decide(self, ctx: BoundContext, confirmation_id: str, approve: bool) -> dict[str, Any]:
        """A person's approval or denial (the console names the person in the context): once, while
        pending and not expired; audited under the person's principal."""
        call = CallRecord()
        self.core.authorize(ctx, DECIDE, call, epoch_bound=False)
        now = self.core.now_ms()
        with self._changed:
            pending = self._by_id.get(confirmation_id)
            if pending is None or (pending.tenant, pending.workspace) != (ctx.tenant, ctx.workspace):
                raise EngramError(Code.NOT_FOUND, "confirmation")
            if pending.state != "pending" or now >= pending.expires_at_ms:
                raise EngramError(Code.ALREADY_TERMINAL, "confirmation already decided or expired")
            pending.state = "approved" if approve else "denied"
            pending.decided_by, pending.decided_at_ms = ctx.principal, now
            view = pending.view(now)
            self._changed.notify_all()
        self.core.audit_standalone(ctx, DECIDE, pending.state, pending.target, call)
        return {"confirmations": [view]}

    def _sweep(self, now: int) -> None:
        """Forget what can no longer be claimed (held under the lock)."""
        for cid in [cid for cid, p in self._by_id.items()
                    if now >= p.expires_at_ms + GRANT_EXECUTION_WINDOW_MS]:
            del self._by_id[cid]
