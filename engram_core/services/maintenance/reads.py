"""Host reads: a record's history, a candidate's structure, journal and audit export (no bodies)."""

from __future__ import annotations

from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.services.maintenance.base import (
    HostOps,
    checked_ref,
    event_doc,
    event_summary,
    facts_of,
    parse_cursor,
    record_meta,
    sizes_of,
)
from engram_core.trust.hostctx import BoundContext


class ReadOps(HostOps):
    # -- reads -----------------------------------------------------------------------------------
    def history(self, ctx: BoundContext, scope: Scope, record_id: str, disputed_only: bool) -> dict[str, Any]:
        call = self.authorize(ctx, "history", target=scope)
        tctx = self.target_ctx(ctx, scope)
        with self.core.store.read() as tx:
            if record_id:
                rec = tx.record(scope, record_id)
                if rec is None:
                    raise EngramError(Code.NOT_FOUND, "record")
                recs = [rec]
                targets = {rec.record_id, rec.candidate_id}
                # A record's history includes what it caused elsewhere (derivative rule, reconciliation).
                events = [event_summary(e) for e in tx.events(scope, 0, None)
                          if e.target in targets or rec.record_id in (e.body.get("source"), e.body.get("successor"),
                                                                      e.body.get("disputed_by"))]
            else:
                recs = tx.scope_records(scope, ("accepted_disputed",) if disputed_only else None)
                events = None
        out: dict[str, Any] = {"tenant": scope.tenant, "workspace": scope.workspace,
                               "records": [record_meta(self.core, r) for r in recs]}
        if events is not None:
            out["events"] = events
        self._audit(tctx, "history", "ok", record_id, call)
        return out

    def inspect_candidate(self, ctx: BoundContext, scope: Scope, candidate_id: str) -> dict[str, Any]:
        """A candidate's structure for hosts: control fields, sizes, findings — structurally no body."""
        call = self.authorize(ctx, "inspect_candidate", target=scope)
        tctx = self.target_ctx(ctx, scope)
        with self.core.store.read() as tx:
            c = tx.candidate(scope, checked_ref(candidate_id, "candidate_id"))
            # Nothing names a candidate before its capture: read the journal from there, not from
            # the scope's first event (the console's candidate page at 100k records, issue 61).
            events = [event_summary(e) for e in tx.events(scope, c.cursor, None)
                      if e.target == candidate_id] if c else []
            facts = facts_of(self.core, tx, c) if c is not None else {}
        if c is None:
            raise EngramError(Code.NOT_FOUND, "candidate")
        view = {
            "candidate_id": c.candidate_id, "state": c.state, "payload_digest": c.payload_digest,
            "record_digest": c.record_digest, "trust_class": c.trust_class, "principal": c.principal,
            "agent_id": c.agent_id, "session": c.session, "captured_at": self.core.instant(c.captured_at_ms),
            "cursor": str(c.cursor), "sizes": sizes_of(facts), "findings": facts.get("findings", {}),
            "retention": facts.get("retention", {}), "family_refs": facts.get("family_refs", []),
            "sealed_envelope_present": c.sealed_envelope is not None, "events": events,
        }
        if c.decision:
            view["decision"] = c.decision
        self._audit(tctx, "inspect_candidate", "ok", candidate_id, call)
        return view

    def export(self, ctx: BoundContext, scope: Scope, what: str, from_cursor: str,
               to_cursor: str) -> dict[str, Any]:
        call = self.authorize(ctx, "export", target=scope)
        lo, hi = parse_cursor(from_cursor, 0), parse_cursor(to_cursor, None)
        if what == "journal":
            tctx = self.target_ctx(ctx, scope)
            with self.core.store.read() as tx:
                items: list[dict[str, Any]] = [event_doc(e) for e in tx.events(scope, lo or 0, hi)]
        elif what == "audit":
            tctx = self.target_ctx(ctx, scope) if scope.tenant else ctx
            with self.core.store.read() as tx:
                items = tx.audit_rows(scope if scope.tenant else None, lo or 0, hi)
            for row in items:
                row["seq"] = str(row["seq"])
        else:
            raise EngramError(Code.INVALID_SCHEMA, "what must be journal or audit")
        self._audit(tctx, "export", "ok", what, call)
        return {"what": what, "tenant": scope.tenant, "workspace": scope.workspace, "count": len(items), "items": items}
