"""Verification (SPEC §6, §10): every journal and audit chain recomputed, signed anchors of their
heads, and the keys that sign anchors and backups."""

from __future__ import annotations

import json
from typing import Any

from engram_core.contract.canonical import digest
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.services.host import LAST_ANCHOR_META
from engram_core.services.maintenance.base import HostOps, event_doc, log
from engram_core.store.chain import GENESIS, LEGACY_CHAIN, by_chain, check_audit, event_digest_of, scope_chain
from engram_core.store.port import Event, ScopeRow
from engram_core.trust.hostctx import BoundContext
from engram_core.trust.signing import ANCHOR_DOMAIN, public_keys_from_pems, verify_signature

ANCHOR_FORMAT = "engram-anchor/v2"  # v2: a head per audit chain (v1, one audit head, still verifies)
ANCHOR_FORMATS = ("engram-anchor/v1", ANCHOR_FORMAT)


class AuditOps(HostOps):
    def verify(self, ctx: BoundContext, scope: Scope, *, report_only: bool, anchor_json: str = "",
               anchor_key_pems: tuple[str, ...] = ()) -> dict[str, Any]:
        """Recompute every journal and audit digest and link (SPEC §6, §10); JOURNAL_CORRUPT if any differ.

        With an anchor (``anchor``), the chains must also still reach the heads it signed: a chain
        shorter than an anchored head was truncated, a different digest there was rewritten. The
        anchor's signature must verify under ``anchor_key_pems`` (the operator's copy of the anchor
        public key) or, when none is named, the core's own anchor key."""
        # The whole store even for one scope: every audit chain is checked, the writer chains of
        # calls that changed nothing included, and they are no one scope's.
        call = self.authorize(ctx, "verify")
        anchor = self._parse_anchor(anchor_json, anchor_key_pems) if anchor_json else None
        with self.core.store.read() as tx:
            scopes = [tx.scope(scope)] if scope.tenant else tx.scopes()
            if scope.tenant and scopes[0] is None:
                raise EngramError(Code.NOT_FOUND, "scope")
            scope_reports = []
            heads: dict[tuple[str, str], dict[int, str]] = {}
            for s in scopes:
                events = tx.events(Scope(s.tenant, s.workspace), 0, None)  # type: ignore[union-attr]
                problems = check_journal(s, events)  # type: ignore[arg-type]
                heads[(s.tenant, s.workspace)] = {e.cursor: e.event_digest for e in events}  # type: ignore[union-attr]
                scope_reports.append({"tenant": s.tenant, "workspace": s.workspace,  # type: ignore[union-attr]
                                      "head_cursor": str(s.last_cursor), "ok": not problems,  # type: ignore[union-attr]
                                      "problems": problems})
            rows = tx.audit_rows(None, 0, None)
            stored_heads = tx.audit_heads()
        audit_problems = check_audit(rows, stored_heads)
        chains = by_chain(rows)
        ok = not audit_problems and all(r["ok"] for r in scope_reports)
        report: dict[str, Any] = {"ok": ok, "scopes": scope_reports,
                                  "audit": {"rows": len(rows), "chains": len(chains), "ok": not audit_problems,
                                            "problems": audit_problems}}
        if anchor is not None:
            digests = {c: {int(r["seq"]): r["row_digest"] for r in rs} for c, rs in chains.items()}
            report["anchor"] = check_anchor(anchor, heads, digests,
                                            (scope.tenant, scope.workspace) if scope.tenant else None)
            report["ok"] = ok = ok and report["anchor"]["ok"]
        outcome = "ok" if ok else Code.JOURNAL_CORRUPT.value
        self._audit(ctx, "verify", outcome, scope.tenant and str(scope), call)
        if not ok:
            log.warning("verification failed: %s", json.dumps(report, sort_keys=True))
            if not report_only:
                raise EngramError(Code.JOURNAL_CORRUPT, "hash chain does not verify")
        return report

    def _parse_anchor(self, anchor_json: str, key_pems: tuple[str, ...]) -> dict[str, Any]:
        """The anchor document with ``key_id`` set to the key that verified it (None: no key did)."""
        try:
            keys = public_keys_from_pems(list(key_pems)) or [self.signers.anchor.public_key]
        except ValueError:
            raise EngramError(Code.INVALID_SCHEMA, "anchor key is not an Ed25519 public key PEM") from None
        try:
            doc = json.loads(anchor_json)
            body = {k: v for k, v in doc.items() if k not in ("anchor_digest", "signature")}
            if doc["format"] not in ANCHOR_FORMATS or not isinstance(doc["journals"], list):
                raise ValueError("format")
            for chain, (seq, head) in _anchored_audit_heads(doc).items():
                str(chain), int(seq), str(head)
            for j in doc["journals"]:
                int(j["cursor"]), str(j["tenant"]), str(j["workspace"]), str(j["digest"])
        except (ValueError, TypeError, KeyError, AttributeError):
            raise EngramError(Code.INVALID_SCHEMA, "not an anchor document") from None
        claimed = doc.get("anchor_digest")
        verified = claimed == digest("anchor", body) and verify_signature(
            ANCHOR_DOMAIN, claimed, doc.get("signature"), keys)
        return {**doc, "verified_by": verified or None}

    def anchor(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        """The current journal heads (all scopes, or the named one) and audit head, signed."""
        # A scope's anchor signs that scope's journal and audit chain only: a key serving its tenant
        # may ask for it; the whole store's (every chain) needs a key serving every tenant.
        call = self.authorize(ctx, "anchor", target=scope)
        if bool(scope.tenant) != bool(scope.workspace):
            raise EngramError(Code.INVALID_SCHEMA, "a scope anchor names both tenant and workspace")
        with self.core.store.read() as tx:
            scopes = [tx.scope(scope)] if scope.tenant else tx.scopes()
            if scope.tenant and scopes[0] is None:
                raise EngramError(Code.NOT_FOUND, "scope")
            audit_heads = tx.audit_heads()
        if scope.tenant:
            audit_heads = {c: h for c, h in audit_heads.items() if c == scope_chain(scope.tenant, scope.workspace)}
        body: dict[str, Any] = {
            "format": ANCHOR_FORMAT, "created_at": self.core.instant(),
            "audit_chains": [{"chain": c, "seq": str(seq), "digest": d} for c, (seq, d) in sorted(audit_heads.items())],
            "journals": [{"tenant": s.tenant, "workspace": s.workspace, "cursor": str(s.last_cursor),  # type: ignore[union-attr]
                          "digest": s.last_event_digest} for s in scopes],  # type: ignore[union-attr]
        }
        if scope.tenant:
            body["scope"] = {"tenant": scope.tenant, "workspace": scope.workspace}
        anchor_digest = digest("anchor", body)
        doc = {**body, "anchor_digest": anchor_digest, "signature": self.signers.anchor.sign(anchor_digest)}
        with self.core.store.write() as tx:  # what `engram doctor` reads (HostService.Health)
            tx.set_meta(LAST_ANCHOR_META, json.dumps({"at_ms": self.core.now_ms(), "audit_chains": len(audit_heads)}))
        self._audit(ctx, "anchor", "ok", anchor_digest, call)
        return doc

    def signing_keys(self, ctx: BoundContext) -> dict[str, Any]:
        call = self.authorize(ctx, "signing_keys")
        out = {"backup": self.signers.backup.public(), "anchor": self.signers.anchor.public()}
        self._audit(ctx, "signing_keys", "ok", "", call)
        return out


def check_journal(scope: ScopeRow, events: list[Event]) -> list[dict[str, Any]]:
    """Problems in one scope's hash chain: dense cursors, prev links, recomputed digests, head."""
    problems: list[dict[str, Any]] = []
    prev, expected = GENESIS, 1
    for e in events:
        if e.cursor != expected:
            problems.append({"cursor": str(e.cursor), "problem": "cursor_gap"})
        if e.prev_digest != prev:
            problems.append({"cursor": str(e.cursor), "problem": "prev_link"})
        if event_digest_of(event_doc(e)) != e.event_digest:
            problems.append({"cursor": str(e.cursor), "problem": "event_digest"})
        prev, expected = e.event_digest, e.cursor + 1
    if scope.last_cursor != expected - 1 or scope.last_event_digest != prev:
        problems.append({"cursor": str(scope.last_cursor), "problem": "head"})
    return problems


def check_anchor(anchor: dict[str, Any], journals: dict[tuple[str, str], dict[int, str]],
                 audit: dict[str, dict[int, str]], scope: tuple[str, str] | None) -> dict[str, Any]:
    """Whether the chains still reach the heads an anchor signed.

    ``journals`` maps each verified scope to its events' digests by cursor, ``audit`` each audit
    chain to its rows' digests by seq (all already checked as chains, so a matching digest at
    the anchored position vouches for everything before it). A head no longer there is
    ``anchor_truncated``, a different digest there ``anchor_rewritten``. With ``scope``, only
    that journal (and its audit chain) is compared.
    """
    problems: list[dict[str, Any]] = []
    if anchor.get("verified_by") is None:
        problems.append({"problem": "anchor_signature"})
    heads = _anchored_audit_heads(anchor)
    if scope is not None:
        heads = {c: h for c, h in heads.items() if c == scope_chain(*scope)}
    for chain, (seq, want) in sorted(heads.items()):
        rows = audit.get(chain, {})
        if seq > 0 and rows.get(seq) != want:
            where = {"chain": f"audit:{chain}" if chain else "audit", "seq": str(seq)}
            problems.append({**where, "problem": "anchor_truncated" if seq not in rows else "anchor_rewritten"})
    for j in anchor["journals"]:
        key, cursor = (j["tenant"], j["workspace"]), int(j["cursor"])
        if scope is not None and key != scope:
            continue
        events = journals.get(key, {})
        if cursor > 0 and events.get(cursor) != j["digest"]:
            problems.append({"chain": f"{key[0]}/{key[1]}", "cursor": str(cursor),
                             "problem": "anchor_truncated" if cursor not in events else "anchor_rewritten"})
    return {"ok": not problems, "created_at": anchor.get("created_at"), "key_id": anchor.get("verified_by"),
            "audit_chains": len(heads), "journals": len(anchor["journals"]), "problems": problems}


def _anchored_audit_heads(anchor: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """The audit chain heads an anchor signed (a v1 anchor: the one chain there was then)."""
    if "audit_chains" in anchor:
        return {a["chain"]: (int(a["seq"]), a["digest"]) for a in anchor["audit_chains"]}
    return {LEGACY_CHAIN: (int(anchor["audit"]["seq"]), anchor["audit"]["digest"])}
