"""The core: its ports held together (store, key vault, policy engine, trusted keys, clock,
embedder), as the composition root (``engram_core.app.composition``) chose them.

Also the steps every operation shares: authorization by policy (with the
revocation epoch), recording decisions, and audit rows.
"""

from __future__ import annotations

import base64
import dataclasses
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any

from engram_core.clock import Clock, SystemClock
from engram_core.contract.canonical import digest, with_receipt_digest
from engram_core.contract.errors import Code, EngramError, class_of_reasons
from engram_core.contract.validation import format_instant
from engram_core.crypto.keyvault import KeyVault, record_data_keys
from engram_core.embedding.port import Embedder
from engram_core.policy.port import AUTHZ, Decision, PolicyEngine
from engram_core.secret_scan.scan import scan
from engram_core.services.host_trust import SharedHostTrust
from engram_core.services.key_schedule import KeySchedule
from engram_core.services.lexical import TermHasher
from engram_core.services.projection_status import ProjectionStatus
from engram_core.services.quotas import TOOL_METRIC, RateLimited
from engram_core.store.page_pins import MAX_PINS
from engram_core.store.port import AuditRow, RecordRow, ScopeRow, SharedPin, Store, Tx
from engram_core.trust.context_nonces import ContextNonceLedger
from engram_core.trust.hostctx import CLOCK_SKEW_MS, MAX_CONTEXT_TTL_MS, BoundContext
from engram_core.trust.hostkeys import HostKeyBinding, TrustedHostKeys

# Longer than a loaded 2-core machine needs for an embedded decision (~0.5 ms idle),
# well inside any sensible call deadline; a later answer is discarded (fail closed).
POLICY_TIMEOUT_S = 1.0


def b32(data: bytes) -> str:
    return base64.b32encode(data).decode().rstrip("=").lower()


def new_id(prefix: str) -> str:
    return prefix + b32(secrets.token_bytes(16))


def record_id_of(record_digest: str) -> str:
    """SPEC §4: ``mem_`` + unpadded lowercase base32 of the 32 digest bytes."""
    return "mem_" + b32(bytes.fromhex(record_digest.removeprefix("sha256:")))


def require_current_epoch(epoch: int, scope: ScopeRow | None, detail: str) -> None:
    """Revocation (SPEC §12: ``engram admin revoke`` bumps the scope's epoch): a context or a
    grant signed under an older epoch than the scope's is AUTHORIZATION_REVOKED. The one
    check, for contexts (every authorization, the tool list) and grants alike."""
    if scope is not None and epoch < scope.authorization_epoch:
        raise EngramError(Code.AUTHORIZATION_REVOKED, detail)


def context_facts(ctx: BoundContext) -> dict[str, Any]:
    """What policies see of the caller: identifiers and flags, never content."""
    return {
        "tenant": ctx.tenant,
        "workspace": ctx.workspace,
        "principal": ctx.principal,
        "agent_id": ctx.agent_id,
        "session": ctx.session,
        "purpose_ref": ctx.purpose_ref,
        "host_key_id": ctx.host_key_id,
        # The signing key's binding (tenants, maintenance scopes): the authz policy decides on it.
        "host_key": (ctx.host_key or HostKeyBinding(key_id=ctx.host_key_id)).facts(),
        "memory_enabled": ctx.memory_enabled,
        "host_principal": ctx.host_principal,
        "maintenance_scopes": list(ctx.maintenance_scopes),
        "authorization_epoch": ctx.authorization_epoch,
    }


@dataclass
class CallRecord:
    """Decisions taken during one call, for receipts and the audit row."""

    decisions: list[Decision] = field(default_factory=list)

    def add(self, d: Decision) -> Decision:
        self.decisions.append(d)
        return d

    def summaries(self) -> list[dict[str, Any]]:
        return [d.summary() for d in self.decisions]


class Core:
    def __init__(
        self,
        *,
        data_dir: Path,
        store: Store,
        vault: KeyVault,
        policy: PolicyEngine,
        trusted: TrustedHostKeys,
        clock: Clock | None = None,
        embedder: Embedder | None = None,
        key_schedule: KeySchedule | None = None,
        hasher: TermHasher,
        page_key: bytes,
        open_key_dir: Callable[[Path, str | None], KeyVault | None] | None = None,
        page_pin_capacity: int = MAX_PINS,
    ) -> None:
        self.data_dir = data_dir
        # The semantic channel's local model (SPEC §11), or None: then lexical_and_semantic
        # searches are RANKING_UNAVAILABLE and admission stores no vectors.
        self.embedder = embedder
        self.store = store
        self.vault = vault
        # When KEK generations rotate and retire (services/keyring.py).
        self.key_schedule: KeySchedule = key_schedule or KeySchedule()
        # Another core's key directory (a restore's source) and, for an engine keeping its keys in
        # its database, that store's URL: opened as a vault, None if the directory holds none.
        self.open_key_dir: Callable[[Path, str | None], KeyVault | None] = open_key_dir or (lambda _d, _s: None)
        self.policy = policy
        self.trusted = trusted
        # Where other cores change the trusted keys too, the copy follows the store's (host_trust.py).
        self.host_trust = SharedHostTrust(store, trusted)
        self.clock: Clock = clock or SystemClock()
        # Usage the authz policy decides quotas on (in memory; see services.quotas).
        self.quotas = store.usage_counters(self.clock.now_ms)
        # SPEC §2: a context's nonce is single use within its lifetime, across restarts too: the
        # nonces claimed in the last context lifetime are read back from the audit log.
        started = self.clock.now_ms()
        self.context_nonces = ContextNonceLedger(started_at_ms=started, skew_ms=CLOCK_SKEW_MS)
        horizon = MAX_CONTEXT_TTL_MS + CLOCK_SKEW_MS
        self.context_nonces.seed([(ref, at + horizon) for ref, at in store.recent_context_nonces(started - horizon)])
        # The keyed term hashes and the cursors' HMAC key: DIR/index.key and DIR/page.key, read
        # by the composition root (engram_core/app/composition.py).
        self.hasher = hasher
        self.page_key = page_key
        # The most search pins (paged searches' snapshots) kept in memory: the composition root's
        # to set (a test proves what happens beyond it with tens of searches, not thousands).
        self.page_pin_capacity = page_pin_capacity
        # Scopes whose projections an operator invalidated and has not rebuilt (PROJECTION_STALE).
        self.projections = ProjectionStatus(store)
        # Finish crypto-shredding interrupted by a crash and clear key slots of
        # transactions that never committed (SPEC §10). Never on a store that
        # holds nothing: a lost or replaced database must not zero every key
        # (restore reads them from the key directory).
        with store.read() as tx:
            live = tx.live_key_slots()
            empty = tx.is_empty()
        if not empty:
            vault.reconcile(set(live))

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def claim_context(self, ctx: BoundContext) -> BoundContext:
        """Spend a verified context's nonce (SPEC §2: single use), per signing key and lane
        (context_nonces.py); the context returned names the claim for its audit rows.
        TRUSTED_CONTEXT_UNAVAILABLE for a replay, RATE_LIMITED when the key's lane is full.
        The claim also reads the store's host-key trust version: a key another core untrusted
        (or re-bound) since this core's copy was loaded is refused (or re-bound) here."""
        ref = self.context_nonces.claim(ctx.host_key_id, ctx.nonce, issued_at_ms=ctx.issued_at_ms,
                                        expires_at_ms=ctx.expires_at_ms, now_ms=self.now_ms(), lane=ctx.nonce_lane)
        # Where the usage counts are the store's, the claim's round trip reads them too (one
        # round trip fewer for every call the quotas decide on); host and admin calls, which
        # the quotas do not decide on, read nothing.
        usage = (self.quotas.begin_read(ctx.scope, ctx.principal)
                 if self.quotas.shared and ctx.call in TOOL_METRIC else None)
        try:
            claim = self.store.claim_context(ref, ctx.expires_at_ms, usage=usage)
        except BaseException:
            if usage is not None:
                self.quotas.abandon_read(usage)
            raise
        if not claim.claimed:  # claimed on another core of the store
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context replayed", reasons=("CONTEXT_REPLAYED",))
        counts = self.quotas.finish_read(usage, claim.usage) if usage is not None and claim.usage is not None else None
        return dataclasses.replace(self.host_trust.current(ctx, claim.host_keys_version), nonce_ref=ref, usage=counts)

    def instant(self, ms: int | None = None) -> str:
        return format_instant(self.now_ms() if ms is None else ms)

    # -- policy --------------------------------------------------------------------
    def data_key(self, tx: Tx | None, owner: str, slot: int | None) -> tuple[int, bytes] | None:
        """The live data key of ``owner`` and its slot: by the slot its row names (records since
        migration 3, candidates since migration 8), else by the ``data_keys`` ledger (read in
        ``tx``, or in a read of its own when ``tx`` is None). None once destroyed: a destroyed
        key's slot is zeroed in the vault, so a slot left in a row opens nothing."""
        if slot is None and tx is not None:
            slot = tx.data_key_slot(owner)
        elif slot is None:
            with self.store.read(snapshot=False) as own:
                slot = own.data_key_slot(owner)
        key = self.vault.data_key(slot, owner) if slot is not None else None
        return None if key is None or slot is None else (slot, key)

    def data_keys(self, records: list[RecordRow]) -> dict[str, tuple[int, bytes]]:
        """``data_key`` of many records that name their slot, at once (one read of a remote
        vault), by record id; a record whose key is destroyed, or that names no slot, is left
        out (``data_key`` answers for it)."""
        return record_data_keys(self.vault, records)

    def decide(self, path: str, input: dict[str, Any], call: CallRecord) -> Decision:
        return call.add(self.policy.decide(path, input, timeout_s=POLICY_TIMEOUT_S))

    def authorize(self, ctx: BoundContext, operation: str, call: CallRecord, tx: Tx | None = None, *,
                  scope: ScopeRow | None | EllipsisType = ..., facts: dict[str, Any] | None = None,
                  stored_strings: Iterable[str] = (), epoch_bound: bool = True) -> Decision:
        """Ask the authz policy; enforce the revocation epoch (a mechanism, not a policy choice).
        ``scope``: the scope row if the caller has just read it (search pins it anyway);
        ``facts``: further input keys the operation's rule reads (e.g. ``attestation``);
        ``stored_strings``: the request's free strings that the operation would store
        (idempotency keys, reason refs, event ids, names); the policy sees the secret
        scanner's findings over them (SPEC §13) and decides.
        ``epoch_bound`` False only for the one question that reads the epoch itself."""
        if scope is ...:
            scope = (self.store.latest_scope(ctx.scope) if tx is None
                     else tx.scope(ctx.scope))
        return self._admitted(ctx, self.decide(AUTHZ, {**self._authz_input(ctx, operation, scope, stored_strings,
                                                                            epoch_bound),
                                                       **(facts or {})}, call), operation)

    def authorize_with(self, ctx: BoundContext, operation: str, call: CallRecord, scope: ScopeRow | None,
                       path: str, input: dict[str, Any], *, stored_strings: Iterable[str] = ()) -> tuple[Decision, Decision]:
        """``authorize`` and one more decision the call will need, asked together (one engine
        call in the embedded backend). Only the authorization is recorded on ``call``; the caller
        records the other (``call.add``) if it uses it."""
        authz, other = self.policy.decide_all(
            [(AUTHZ, self._authz_input(ctx, operation, scope, stored_strings)), (path, input)],
            timeout_s=POLICY_TIMEOUT_S)
        return self._admitted(ctx, call.add(authz), operation), other

    def _authz_input(self, ctx: BoundContext, operation: str, scope: ScopeRow | None,
                     stored_strings: Iterable[str] = (), epoch_bound: bool = True) -> dict[str, Any]:
        if epoch_bound:
            require_current_epoch(ctx.authorization_epoch, scope, "context epoch older than scope epoch")
        out: dict[str, Any] = {
            "operation": operation,
            "context": context_facts(ctx),
            "scope": {"activated": bool(scope and scope.activated), "tools": list(scope.tools) if scope else []},
            "now_ms": self.now_ms(),
            "findings": scan(stored_strings),
        }
        if operation in TOOL_METRIC:
            out["usage"] = (ctx.usage if ctx.usage is not None
                            else self.quotas.usage(ctx.scope, ctx.principal))
        return out

    def _admitted(self, ctx: BoundContext, d: Decision, operation: str) -> Decision:
        """``_allowed``, then count the call against the quotas (only calls that go ahead count).
        A denial carrying ``retry_after_ms`` is the policy saying "not now": RATE_LIMITED."""
        if not d.result["allow"] and "retry_after_ms" in d.result:
            raise RateLimited(d.result["retry_after_ms"], f"quota for {operation}")
        self._allowed(d, operation)
        if operation in TOOL_METRIC:
            self.quotas.add(ctx.scope, ctx.principal, TOOL_METRIC[operation])
        return d

    @staticmethod
    def _allowed(d: Decision, operation: str) -> Decision:
        if not d.result["allow"]:
            raise denied(Code.UNAUTHORIZED, f"authz denied {operation}", [d])
        return d

    def check_revision(self, call: CallRecord) -> None:
        """SPEC §5: a decision made under another bundle revision than the active one is stale."""
        active = self.policy.revision()
        if any(d.revision != active for d in call.decisions):
            raise EngramError(Code.POLICY_STALE, "policy revision changed")

    def decision_receipt(self, d: Decision) -> dict[str, Any]:
        return with_receipt_digest(
            {
                "kind": "decision",
                "path": d.path,
                "decision_id": d.decision_id,
                "revision": d.revision,
                "input_digest": d.input_digest,
                "result": d.summary()["result"],
                "reason_codes": d.summary()["reason_codes"],
            }
        )

    # -- audit ---------------------------------------------------------------------
    def audit_row(self, ctx: BoundContext, operation: str, outcome: str, target: str, call: CallRecord) -> AuditRow:
        return AuditRow(
            at_ms=self.now_ms(),
            audit_id=ctx.audit_id,
            tenant=ctx.tenant,
            workspace=ctx.workspace,
            principal=ctx.principal,
            agent_id=ctx.agent_id,
            operation=operation,
            outcome=outcome,
            target_digest=digest("request", {"target": target}) if target else "",
            decisions=call.summaries(),
            context_nonce=ctx.nonce_ref,
        )

    def audit_standalone(self, ctx: BoundContext, operation: str, outcome: str, target: str, call: CallRecord,
                         *, page_pins: Sequence[SharedPin] = ()) -> None:
        """Audit a call that changed nothing (reads, refusals) in its own transaction, with the
        search pins ``page_pins`` it held back (``Store.append_audit``)."""
        self.store.append_audit(self.audit_row(ctx, operation, outcome, target, call), page_pins=page_pins)

    def audit_refusal(self, ctx: BoundContext, operation: str, error: EngramError, target: str = "", *,
                      origin: str = "core") -> None:
        """The audit row of a refused call (SPEC §3: the envelope's auditId names a real row):
        outcome = the code; the decisions taken before the refusal, then one ``refusal`` entry
        with the reason class, the policy or validation reason codes and the JSON pointer."""
        refusal: dict[str, Any] = {"path": "refusal", "origin": origin, "code": error.code.value,
                                   "reason_codes": sorted(set(error.reasons))}
        if error.reason_class:
            refusal["reason_class"] = error.reason_class
        if error.pointer:
            refusal["pointer"] = error.pointer
        row = self.audit_row(ctx, operation, error.code.value, target, CallRecord())
        self.store.append_audit(dataclasses.replace(row, decisions=[*error.decisions, refusal]))

    def close(self) -> None:
        self.policy.close()
        self.store.close()
        self.vault.close()


def denied(code: Code, detail: str, decisions: list[Decision]) -> EngramError:
    """A refusal a policy decided: its reason codes (for logs and audit) pick the class the
    caller is told (``engram_core.contract.errors.POLICY_REASON_CLASSES``)."""
    summaries = [d.summary() for d in decisions]
    reasons = tuple(sorted({r for s in summaries for r in s["reason_codes"] if r}))
    error = EngramError(code, detail, reason_class=class_of_reasons(reasons), reasons=reasons)
    error.decisions = summaries
    return error
