"""Search and get (SPEC §5, §11, §12 redaction): eligibility, ranking, redaction, receipts, paging."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from engram_core.canonical import canonical_json, digest, with_receipt_digest
from engram_core.crypto.sealing import unseal
from engram_core.errors import Code, EngramError
from engram_core.hostctx import BoundContext
from engram_core.policy.port import REDACTION
from engram_core.services.core import CallRecord, Core, context_facts
from engram_core.services.ranking import OFFLINE_LEXICAL_V1, Profile
from engram_core.store.duckdb_store import DuckDBTx
from engram_core.store.port import RecordRow
from engram_core.validation import validate_arguments

SEARCH_TOOL = "engram_memory_search"
GET_TOOL = "engram_memory_get"
DEFAULT_LIMIT = 10
DEFAULT_PACKET = 65_536
PAGE_PIN_TTL_MS = 15 * 60_000


def eligible(rec: RecordRow, now_ms: int) -> bool:
    """SPEC §5: accepted_current, within valid time, not expired (expiry counts from expires_at on)."""
    if rec.state != "accepted_current":
        return False
    if rec.valid_t > now_ms or (rec.valid_t_end is not None and rec.valid_t_end < now_ms):
        return False
    return rec.expires_at_ms is None or rec.expires_at_ms > now_ms


def _pointer(key: str) -> str:
    return "/" + key.replace("~", "~0").replace("/", "~1")


class ReadService:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.profiles: dict[str, Profile] = {"lexical": OFFLINE_LEXICAL_V1}

    def bind_purpose(self, ctx: BoundContext, purpose_ref: str) -> None:
        if purpose_ref != ctx.purpose_ref:
            # SPEC §2: a purpose mismatch is the same protocol refusal as a bad context.
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "purpose mismatch")

    # -- record views -----------------------------------------------------------------
    def _record_view(self, rec: RecordRow) -> dict[str, Any]:
        owner = f"record:{rec.record_id}"
        with self.core.store.read() as tx:
            slot = tx.data_key_slot(owner)
        key = self.core.vault.data_key(slot, owner) if slot is not None else None
        if key is None or rec.sealed_body is None:
            raise EngramError(Code.BLOB_MISSING, "record body unreadable")
        payload = json.loads(unseal(key, rec.sealed_body, kind="record", owner=rec.record_id))
        payload.pop("scope_ref", None)
        return {
            "record_id": rec.record_id, "record_digest": rec.record_digest, "candidate_id": rec.candidate_id,
            "state": rec.state, "trust_class": rec.trust_class, "payload_digest": rec.payload_digest,
            "accepted_at": self.core.instant(rec.accepted_at_ms), "cursor": str(rec.accepted_cursor),
            "payload": payload, "principal": rec.principal, "agent_id": rec.agent_id,
        }

    def _redaction(self, ctx: BoundContext, operation: str, call: CallRecord) -> tuple[set[str], int, str]:
        d = self.core.decide(
            REDACTION,
            {"context": context_facts(ctx), "operation": operation, "purpose_ref": ctx.purpose_ref,
             "now_ms": self.core.now_ms()},
            call,
        )
        allow = set(d.result["allow_fields"]) | {"/record_id"}  # record_id always present (SPEC §5)
        return allow, int(d.result["max_packet_bytes"]), self.core.decision_receipt(d)["receipt_digest"]

    @staticmethod
    def _redact(view: dict[str, Any], allow: set[str], decision_receipt: str) -> tuple[dict[str, Any], list[str], str]:
        kept = {k: v for k, v in view.items() if _pointer(k) in allow}
        omitted = sorted(_pointer(k) for k in view if _pointer(k) not in allow)
        receipt = with_receipt_digest({
            "kind": "redaction", "record_id": view["record_id"], "allow_fields": sorted(allow),
            "redacted_fields": omitted, "policy_receipt_digest": decision_receipt,
        })["receipt_digest"]
        return kept, omitted, receipt

    # -- get -----------------------------------------------------------------------------
    def get(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        call = CallRecord()
        validate_arguments(GET_TOOL, args)
        self.bind_purpose(ctx, args["purpose_ref"])
        authz = self.core.authorize(ctx, GET_TOOL, call)
        now = self.core.now_ms()
        with self.core.store.read() as tx:
            rec = tx.record(ctx.tenant, ctx.workspace, args["record_id"])
            scope = tx.scope(ctx.tenant, ctx.workspace)
        if rec is None or not eligible(rec, now):
            self._audit_read(ctx, GET_TOOL, "NOT_FOUND", args["record_id"], call)
            raise EngramError(Code.NOT_FOUND, "record")
        allow, cap, redaction_policy = self._redaction(ctx, GET_TOOL, call)
        record, omitted, redaction_receipt = self._redact(self._record_view(rec), allow, redaction_policy)
        max_bytes = min(args.get("max_packet_bytes", DEFAULT_PACKET), cap)
        instant = self.core.instant(now)
        revalidation = with_receipt_digest({"kind": "revalidation", "record_ids": [rec.record_id], "checked_at": instant,
                                            "eligible": True})["receipt_digest"]
        read_receipt = with_receipt_digest({
            "record_id": rec.record_id, "record_digest": rec.record_digest, "valid_as_of": instant,
            "system_as_of": str(scope.last_cursor if scope else 0),
            "validated_through_cursor": str(scope.last_cursor if scope else 0),
            "authorization_receipt_digest": self.core.decision_receipt(authz)["receipt_digest"],
            "revalidation_receipt_digest": revalidation, "checked_at": instant,
        })
        packet = {"record": record, "redacted_fields": omitted, "redaction_receipt_digest": redaction_receipt,
                  "read_receipt": read_receipt}
        packet["packet_digest"] = digest("packet", packet)
        if len(canonical_json(packet)) > max_bytes:
            self._audit_read(ctx, GET_TOOL, "PROJECTION_OVERSIZED", rec.record_id, call)
            raise EngramError(Code.PROJECTION_OVERSIZED, "record exceeds packet")
        self._audit_read(ctx, GET_TOOL, "ok", rec.record_id, call)
        return packet

    def _audit_read(self, ctx: BoundContext, op: str, outcome: str, target: str, call: CallRecord) -> None:
        self.core.audit_standalone(ctx, op, outcome, target, call)

    # -- search ---------------------------------------------------------------------------
    def _page_token(self, body: dict[str, Any]) -> str:
        raw = canonical_json(body)
        mac = hmac.new(self.core.page_key, raw, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(raw + mac).decode().rstrip("=")

    def _open_page_token(self, token: str) -> dict[str, Any]:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            body, mac = raw[:-16], raw[-16:]
            if not hmac.compare_digest(hmac.new(self.core.page_key, body, hashlib.sha256).digest()[:16], mac):
                raise ValueError("mac")
            return json.loads(body)
        except Exception:
            raise EngramError(Code.STALE_PAGE, "cursor does not verify") from None

    def _profile_for(self, args: dict[str, Any]) -> Profile:
        policy = args.get("capability_policy", {})
        if policy.get("minimum_channels", "lexical") == "lexical_and_semantic":
            profile = self.profiles.get("semantic")
            if profile is None or (policy.get("network", "forbid") == "forbid" and getattr(profile, "needs_network", False)):
                raise EngramError(Code.RANKING_UNAVAILABLE, "semantic channel unavailable")
            return profile
        return self.profiles["lexical"]

    def search(self, ctx: BoundContext, args: dict[str, Any]) -> dict[str, Any]:
        call = CallRecord()
        validate_arguments(SEARCH_TOOL, args)
        self.bind_purpose(ctx, args["purpose_ref"])
        authz = self.core.authorize(ctx, SEARCH_TOOL, call)
        profile = self._profile_for(args)
        limit = args.get("limit", DEFAULT_LIMIT)
        params = {k: args[k] for k in ("limit", "max_packet_bytes", "capability_policy") if k in args}
        query_digest = digest("query", {"query": args["query"], "params": params})
        now = self.core.now_ms()
        after: tuple[float, int, str] | None = None
        with self.core.store.read() as tx:
            scope = tx.scope(ctx.tenant, ctx.workspace)
            if "page_cursor" in args:
                pin = self._open_page_token(args["page_cursor"])
                expected = {"principal": ctx.principal, "tenant": ctx.tenant, "workspace": ctx.workspace,
                            "query_digest": query_digest, "profile": profile.config_digest()}
                if any(pin.get(k) != v for k, v in expected.items()) or now - pin["valid_as_of"] > PAGE_PIN_TTL_MS:
                    raise EngramError(Code.STALE_PAGE, "cursor bound to another search")
                system_as_of, valid_as_of, rank_base = int(pin["system_as_of"]), int(pin["valid_as_of"]), pin["rank"]
                after = (float(pin["after"][0]), int(pin["after"][1]), str(pin["after"][2]))
            else:
                system_as_of, valid_as_of, rank_base = (scope.last_cursor if scope else 0), now, 0
            total, rows = self.rank(tx, ctx, profile, args["query"], valid_as_of=valid_as_of,
                                    system_as_of=system_as_of, after=after, limit=limit + 1)
            more = len(rows) > limit
            rows = rows[:limit]
            recs = tx.records(ctx.tenant, ctx.workspace, [r[0] for r in rows])
        # Final revalidation: anything no longer eligible is dropped, never refilled (SPEC §11).
        kept_rows = [r for r in rows if r[0] in recs and eligible(recs[r[0]], now)]
        allow, cap, redaction_policy = self._redaction(ctx, SEARCH_TOOL, call)
        max_bytes = min(args.get("max_packet_bytes", DEFAULT_PACKET), cap)
        packets = []
        for i, (rid, score, _vt) in enumerate(kept_rows):
            record, omitted, redaction_receipt = self._redact(self._record_view(recs[rid]), allow, redaction_policy)
            packet = {"record": record, "redacted_fields": omitted, "redaction_receipt_digest": redaction_receipt,
                      "score": round(score, 9), "rank": rank_base + i + 1}
            if len(canonical_json(packet)) > max_bytes:
                self._audit_read(ctx, SEARCH_TOOL, "PROJECTION_OVERSIZED", "", call)
                raise EngramError(Code.PROJECTION_OVERSIZED, "one record exceeds packet")
            packets.append(packet)
        issued = self.core.instant(now)
        ordered = [p["record"]["record_id"] for p in packets]
        rank_receipt = with_receipt_digest({
            "request_digest": query_digest,
            "authorization_receipt_digest": self.core.decision_receipt(authz)["receipt_digest"],
            "profile": profile.name, "profile_version": profile.version, "profile_config_digest": profile.config_digest(),
            "valid_as_of": self.core.instant(valid_as_of), "system_as_of": str(system_as_of),
            "candidate_count": total, "ordered_ids_digest": digest("ordered-ids", ordered),
            "revalidation_receipt_digest": with_receipt_digest({
                "kind": "revalidation", "checked_at": issued, "kept": ordered,
                "dropped": len(rows) - len(kept_rows)})["receipt_digest"],
            "issued_at": issued,
        })
        response: dict[str, Any] = {"records": packets, "rank_receipt": rank_receipt}
        if more and rows:
            last = rows[-1]
            response["next_page_cursor"] = self._page_token({
                "principal": ctx.principal, "tenant": ctx.tenant, "workspace": ctx.workspace,
                "query_digest": query_digest, "profile": profile.config_digest(), "system_as_of": str(system_as_of),
                "valid_as_of": valid_as_of, "after": [repr(last[1]), last[2], last[0]], "rank": rank_base + len(packets),
            })
        response["response_digest"] = digest("response", response)
        if len(canonical_json(response)) > max_bytes:
            self._audit_read(ctx, SEARCH_TOOL, "RESULT_TOO_LARGE", "", call)
            raise EngramError(Code.RESULT_TOO_LARGE, "page exceeds packet")
        self._audit_read(ctx, SEARCH_TOOL, "ok", "", call)
        return response

    def rank(self, tx: DuckDBTx, ctx: BoundContext, profile: Profile, query: str, *, valid_as_of: int,
             system_as_of: int, after: tuple[float, int, str] | None, limit: int) -> tuple[int, list[tuple[str, float, int]]]:
        terms = sorted(set(self.core.hasher.terms(query)))
        return tx.rank_lexical(
            ctx.tenant, ctx.workspace, terms, profile.weights, k1=profile.k1, b=profile.b, now_ms=valid_as_of,
            half_life_ms=profile.half_life_ms, lexical_weight=profile.lexical_weight,
            max_accepted_cursor=system_as_of, after=after, limit=limit,
        )
