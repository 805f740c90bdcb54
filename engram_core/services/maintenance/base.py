"""What every host maintenance operation shares (SPEC §12): authorizing the host context for
``admin.<op>``, re-binding it to the scope it acts on, auditing, and the host views of rows
(never a body). Host mutations are idempotent by the request's ``event_id``."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.crypto.sealing import unseal
from engram_core.services.admin import target_facts
from engram_core.services.core import CallRecord, Core
from engram_core.services.mutations import Mutations, candidate_facts
from engram_core.store.port import CandidateRow, Event, RecordRow, Tx
from engram_core.trust.hostctx import BoundContext
from engram_core.trust.signing import CoreSigners

log = logging.getLogger("engram.maintenance")
_CURSOR = re.compile(r"^(0|[1-9][0-9]{0,19})$")
EVENT_ID = re.compile(r"^[A-Za-z0-9_.:/-]{16,256}$")


class HostOps:
    """The core, the mutations hosts perform as agents do (``mutations.Mutations``) and the
    core's signers, and the steps every operation takes."""

    def __init__(self, core: Core, mutations: Mutations, signers: CoreSigners) -> None:
        self.core = core
        self.mutations = mutations
        self.signers = signers

    # -- shared steps ----------------------------------------------------------------------
    def authorize(self, ctx: BoundContext, op: str, stored: Iterable[str] = (), *,
                  target: Scope | None = None) -> CallRecord:
        """``stored``: the request's free strings the operation may store (event ids, reason
        refs, scope names); the authz policy sees the secret scanner's findings over them.
        ``target``: the scope the request acts on; None (or no tenant) for the whole store
        (the policy then asks for a host key that serves every tenant)."""
        call = CallRecord()
        self.core.authorize(ctx, f"admin.{op}", call, stored_strings=stored, facts=target_facts(target))
        return call

    @staticmethod
    def target_ctx(ctx: BoundContext, scope: Scope) -> BoundContext:
        """The host context re-bound to the scope it acts on (identity and audit id unchanged)."""
        checked_ref(scope.tenant, "tenant")
        checked_ref(scope.workspace, "workspace")
        return dataclasses.replace(ctx, tenant=scope.tenant, workspace=scope.workspace)

    def _audit(self, ctx: BoundContext, op: str, outcome: str, target: str, call: CallRecord) -> None:
        self.core.audit_standalone(ctx, f"admin.{op}", outcome, target, call)


def checked_ref(value: str, what: str) -> str:
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


def event_summary(e: Event) -> dict[str, Any]:
    out = {"cursor": str(e.cursor), "event_id": e.event_id, "operation": e.operation, "target": e.target,
           "from_state": e.from_state, "to_state": e.to_state, "at_ms": e.at_ms, "event_digest": e.event_digest}
    if e.body.get("reason_ref"):
        out["reason_ref"] = e.body["reason_ref"]
    for key in ("successor", "source", "disputed_by"):
        if e.body.get(key):
            out[key] = e.body[key]
    return out


def facts_of(core: Core, tx: Tx, cand: CandidateRow) -> dict[str, Any]:
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


def sizes_of(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: facts[k] for k in ("components", "citations", "evidence", "payload_bytes") if k in facts}


def open_body(core: Core, tx: Tx, rec: RecordRow) -> dict[str, Any] | None:
    found = core.data_key(tx, f"record:{rec.record_id}", rec.key_slot)
    if found is None or rec.sealed_body is None:
        return None
    return json.loads(unseal(found[1], rec.sealed_body, kind="record", owner=rec.record_id))
