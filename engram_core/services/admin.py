"""AdminService (SPEC §12): host-only maintenance, authorized by policy and audited."""

from __future__ import annotations

from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.contract.tools import TOOL_NAMES
from engram_core.services.core import CallRecord, Core
from engram_core.trust.hostctx import BoundContext


def target_facts(scope: Scope | None = None) -> dict[str, Any]:
    """``input.target`` of an ``admin.<op>`` decision: the scope the request acts on, or ``{}`` for
    the whole store (None, or a request that named no tenant: what the policy requires a key
    serving every tenant for; issue 26.3)."""
    return {"target": {"tenant": scope.tenant, "workspace": scope.workspace} if scope and scope.tenant else {}}


class AdminServiceCore:
    def __init__(self, core: Core) -> None:
        self.core = core

    def _authorize(self, ctx: BoundContext, op: str, stored: list[str], scope: Scope) -> CallRecord:
        call = CallRecord()
        self.core.authorize(ctx, f"admin.{op}", call, stored_strings=stored, facts=target_facts(scope))
        return call

    def activate(self, ctx: BoundContext, scope: Scope, tools: list[str], *, activated: bool) -> dict[str, Any]:
        op = "activate" if activated else "deactivate"
        call = self._authorize(ctx, op, [scope.tenant, scope.workspace], scope)  # scope names are stored
        if not scope.tenant or not scope.workspace or any(t not in TOOL_NAMES for t in tools):
            raise EngramError(Code.INVALID_SCHEMA, "activation target")
        with self.core.store.write() as tx:
            current = tx.scope(scope)
            enabled = set(current.tools) if current else set()
            if activated:
                enabled = set(tools or TOOL_NAMES) | (enabled if tools else set())
                now_active = True
            else:
                enabled = enabled - set(tools) if tools else set()
                now_active = bool(enabled) if tools else False
            row = tx.set_activation(scope, activated=now_active, tools=tuple(sorted(enabled)))
            tx.append_audit(self.core.audit_row(ctx, f"admin.{op}", "ok", str(scope), call))
        return {"tenant": scope.tenant, "workspace": scope.workspace, "activated": row.activated, "tools": list(row.tools)}
