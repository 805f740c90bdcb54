"""Reconciliation families at admission (SPEC §5 ``reconciliation.family_refs``, §9).

When an accepted newcomer names families, the reconciliation policy
(``engram/reconciliation/decision``) sees the family's current members — ids,
digests, trust class, primary kind, valid time, who captured them; never text —
and answers per member (keep, supersede, dispute) or holds the newcomer back
for a host adjudication. The core asks before the admission's write
transaction and applies the answer inside it: one journal event per member that
changes. If the set of current members moved between the decision and the
commit, the answer is stale (POLICY_STALE, retriable: the retry decides again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.contract.validation import parse_instant
from engram_core.policy.port import RECONCILIATION, Decision
from engram_core.services import lifecycle
from engram_core.services.core import CallRecord, Core, context_facts
from engram_core.services.reading import in_effect
from engram_core.store.port import RecordRow, Tx
from engram_core.trust.hostctx import BoundContext

# Members are the records a newcomer could replace: current, disputed or not.
MEMBER_STATES = ("accepted_current", "accepted_disputed")
_RECORD_ID = re.compile(r"^mem_[a-z2-7]{52}$")


@dataclass(frozen=True)
class PayloadLinks:
    """What a payload says about other records, as identifiers and labels only."""

    family_refs: list[str]
    primary_kind: str
    source_refs: list[str]  # citation source_refs shaped like a record id (derivative sources)


def payload_links(effective: dict[str, Any]) -> PayloadLinks:
    primary: dict[str, Any] = next(
        (c for c in effective["components"] if c["component_id"] == effective["primary_component_id"]), {})
    sources = sorted({c["source_ref"] for c in effective["citations"] if _RECORD_ID.match(c["source_ref"])})
    return PayloadLinks(family_refs=list(effective.get("reconciliation", {}).get("family_refs", [])),
                        primary_kind=str(primary.get("kind", "")), source_refs=sources)


def write_links(tx: Tx, scope: Scope, record_id: str, links: PayloadLinks) -> None:
    """Record the newcomer's families and its sources (those that are records of this scope)."""
    known = tx.records(scope, [s for s in links.source_refs if s != record_id]) if links.source_refs else {}
    tx.add_record_links(scope, record_id, family_refs=links.family_refs, primary_kind=links.primary_kind,
                        source_ids=sorted(sid for sid, row in known.items() if row.state != "tombstoned"))


@dataclass(frozen=True)
class Plan:
    """The reconciliation answer for one newcomer, with the member states it was decided on."""

    decision: Decision
    admission: str  # proceed | adjudication_required
    actions: dict[str, str]  # member record_id -> keep | supersede | dispute
    seen: dict[str, str]  # member record_id -> state when decided


def _valid_time(rec: RecordRow) -> dict[str, int]:
    vt = {"t": rec.valid_t}
    if rec.valid_t_end is not None:
        vt["t_end"] = rec.valid_t_end
    return vt


class Reconciler:
    def __init__(self, core: Core) -> None:
        self.core = core

    def decide(self, ctx: BoundContext, *, record_id: str, record_digest: str, payload_digest: str, trust_class: str,
               principal: str, agent_id: str, effective: dict[str, Any], call: CallRecord, now: int,
               adjudicated: bool) -> Plan | None:
        """Ask the policy about a newcomer that names families; None when it names none."""
        links = payload_links(effective)
        if not links.family_refs:
            return None
        with self.core.store.read(snapshot=False) as tx:  # checked again in the write transaction
            members = [m for m in tx.family_members(ctx.scope, links.family_refs, MEMBER_STATES)
                       if m[0].record_id != record_id]
        vt = effective["valid_time"]
        expires = effective.get("retention", {}).get("expires_at")
        # eligible_now (issue 26.5): whether the record would be served now by its times, as search
        # and get decide it. A newcomer dated ahead, ended or expired must not replace a current
        # member: it would hide it while showing nothing in its place.
        record = {"record_id": record_id, "record_digest": record_digest, "payload_digest": payload_digest,
                  "trust_class": trust_class, "primary_kind": links.primary_kind,
                  "valid_time": {k: vt[k] for k in ("t", "t_end") if k in vt},
                  "eligible_now": in_effect(vt["t"], vt.get("t_end"), parse_instant(expires) if expires else None, now),
                  "principal": principal, "agent_id": agent_id, "family_refs": links.family_refs}
        member_docs = [
            {"record_id": rec.record_id, "record_digest": rec.record_digest, "payload_digest": rec.payload_digest,
             "state": rec.state, "trust_class": rec.trust_class, "primary_kind": kind, "valid_time": _valid_time(rec),
             "eligible_now": in_effect(rec.valid_t, rec.valid_t_end, rec.expires_at_ms, now),
             "principal": rec.principal, "agent_id": rec.agent_id, "family_refs": shared,
             "accepted_at_ms": rec.accepted_at_ms}
            for rec, kind, shared in members
        ]
        d = self.core.decide(RECONCILIATION, {"context": context_facts(ctx), "now_ms": now, "adjudicated": adjudicated,
                                              "record": record, "members": member_docs}, call)
        answered = [m["record_id"] for m in d.result["members"]]
        seen = {rec.record_id: rec.state for rec, _, _ in members}
        if len(answered) != len(set(answered)) or set(answered) != set(seen):
            # An answer about records it was not asked about (or missing some) is no answer: fail closed.
            raise EngramError(Code.POLICY_UNAVAILABLE, "reconciliation answer does not cover its members")
        return Plan(decision=d, admission=d.result["admission"],
                    actions={m["record_id"]: m["action"] for m in d.result["members"]}, seen=seen)

    @staticmethod
    def members_as_decided(tx: Tx, ctx: BoundContext, plan: Plan, *, record_id: str,
                           family_refs: list[str]) -> dict[str, RecordRow]:
        """Inside the admission's transaction, before it writes: the family's current members,
        which must be those the decision saw (else POLICY_STALE, and the retry decides again)."""
        current = {rec.record_id: rec for rec, _, _ in tx.family_members(ctx.scope, family_refs,
                                                                          MEMBER_STATES)
                   if rec.record_id != record_id}
        if {rid: rec.state for rid, rec in current.items()} != plan.seen:
            raise EngramError(Code.POLICY_STALE, "family members changed since the reconciliation decision")
        return current

    def apply(self, tx: Tx, ctx: BoundContext, plan: Plan, current: dict[str, RecordRow], *, record_id: str,
              event_id: str, now: int, call: CallRecord) -> list[dict[str, Any]]:
        """Apply a proceeding plan inside the admission's transaction (``current``: from
        ``members_as_decided``); one journal event per changed member."""
        changed: list[dict[str, Any]] = []
        for n, (member_id, action) in enumerate(sorted(plan.actions.items()), start=1):
            rec = current[member_id]
            if action == "keep" or (action == "dispute" and rec.state == "accepted_disputed"):
                continue  # nothing to change (an already disputed member stays disputed)
            operation = {"supersede": "supersede", "dispute": "dispute"}[action]
            to_state = lifecycle.check_record(operation, rec.state)
            body: dict[str, Any] = {"reason_ref": "reconciliation", "decisions": [plan.decision.summary()],
                                    "audit_id": ctx.audit_id}
            body["successor" if operation == "supersede" else "disputed_by"] = record_id
            event = tx.append_event(ctx.scope, event_id=f"{event_id}/reconcile/{n}",
                                    operation=operation, target=member_id, from_state=rec.state, to_state=to_state,
                                    at_ms=now, body=body)
            tx.set_record_state(member_id, to_state, state_cursor=event.cursor,
                                successor_id=record_id if operation == "supersede" else None)
            changed.append({"record_id": member_id, "operation": operation, "from_state": rec.state,
                            "to_state": to_state, "cursor": str(event.cursor), "event_digest": event.event_digest})
        return changed
