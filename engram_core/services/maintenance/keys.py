"""Keys and authorization: KEK generations and key destructions (SPEC §10), scope revocation,
and the host keys the core trusts with what each is bound to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.services import keyring
from engram_core.services.maintenance.base import HostOps, checked_ref
from engram_core.store.port import HostKeyRow
from engram_core.trust.hostctx import BoundContext
from engram_core.trust.hostkeys import key_id, load_public_pem, public_pem

# The maintenance scopes of SPEC §12 a host key may be bound to (what each permits is the policy's).
MAINTENANCE_SCOPES = ("read", "maintain")


class KeyOps(HostOps):
    # -- keys and authorization ------------------------------------------------------------------
    def rotate_keys(self, ctx: BoundContext) -> dict[str, Any]:
        """SPEC §10: a new KEK generation re-wraps every live data key (no sealed body is touched);
        generations whose retention has passed and that no key needs any more retire."""
        call = self.authorize(ctx, "rotate_keys")
        rotated = keyring.rotate(self.core)
        retired = keyring.retire(self.core, self.core.key_schedule)
        self._audit(ctx, "rotate_keys", "ok", "", call)
        return {"active_kek": rotated["active_generation"], "live_data_keys": rotated["live_data_keys"],
                "rewrapped": rotated["rewrapped"], "retired_keks": retired, "bodies_rewritten": 0,
                "vault": self.core.vault.status()}

    def retire_keys(self, ctx: BoundContext, *, now: bool) -> dict[str, Any]:
        """Retire the generations due (``now``: every retained one no key is wrapped by, whatever its
        retention: what an operator runs to complete destructions at once, giving up restores of
        older backups)."""
        call = self.authorize(ctx, "retire_keys")
        retired = keyring.retire(self.core, self.core.key_schedule, now=now)
        self._audit(ctx, "retire_keys", "ok", "", call)
        return {"retired_keks": retired, "generations": self._generations()}

    def _generations(self) -> list[dict[str, Any]]:
        out = []
        for g in self.core.vault.generations():
            entry: dict[str, Any] = {"generation": g.generation, "state": g.state}
            if g.created_at_ms:
                entry["created_at"] = self.core.instant(g.created_at_ms)
            if g.deactivated_at_ms:
                entry["deactivated_at"] = self.core.instant(g.deactivated_at_ms)
                if g.state == "retained":
                    entry["retires_after"] = self.core.instant(g.deactivated_at_ms + self.core.key_schedule.retention_ms)
            if g.retired_at_ms:
                entry["retired_at"] = self.core.instant(g.retired_at_ms)
            out.append(entry)
        return out

    def key_status(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        """The vault's generations, and per record of a scope: its key live, or destroyed and
        whether that destruction is complete (every generation that wrapped it retired) or pending."""
        call = self.authorize(ctx, "key_status", target=scope)
        vault = self.core.vault
        schedule = self.core.key_schedule
        out: dict[str, Any] = {"vault": vault.status(), "generations": self._generations(),
                               "schedule": {"rotation_interval_s": schedule.rotation_interval_ms // 1000,
                                            "retention_s": schedule.retention_ms // 1000}}
        with self.core.store.read() as tx:
            destructions = tx.key_destructions()
            out["live_data_keys"] = len(tx.live_key_slots())
            out["destroyed_data_keys"] = len(destructions)
            out["destructions_pending"] = sum(1 for d in destructions if not vault.destruction_complete(d.generation))
            if scope.tenant:
                self.target_ctx(ctx, scope)
                records = []
                for rec in tx.scope_records(scope):
                    owner = f"record:{rec.record_id}"
                    slot = tx.data_key_slot(owner)
                    destroyed = tx.key_destruction(owner)
                    if slot is not None:
                        status = "live" if vault.data_key(slot, owner) is not None else "unreadable"
                    else:
                        status = "destroyed" if destroyed is not None else "missing"
                    entry: dict[str, Any] = {"record_id": rec.record_id, "state": rec.state, "key": status}
                    if destroyed is not None:
                        entry["destroyed_at"] = self.core.instant(destroyed.at_ms)
                        entry["destruction"] = "complete" if vault.destruction_complete(destroyed.generation) else "pending"
                    records.append(entry)
                out["scope"] = {"tenant": scope.tenant, "workspace": scope.workspace, "records": records}
        self._audit(ctx, "key_status", "ok", scope.tenant and str(scope), call)
        return out

    def revoke(self, ctx: BoundContext, scope: Scope) -> dict[str, Any]:
        """Bump the scope's authorization epoch: older contexts and grants are refused from now on."""
        call = self.authorize(ctx, "revoke", [scope.tenant, scope.workspace], target=scope)
        tctx = self.target_ctx(ctx, scope)
        with self.core.store.write() as tx:
            epoch = tx.bump_epoch(scope)
            tx.append_audit(self.core.audit_row(tctx, "admin.revoke", "ok", str(scope), call))
        return {"tenant": scope.tenant, "workspace": scope.workspace, "authorization_epoch": epoch}

    def trust_host_key(self, ctx: BoundContext, pem: str, kid: str, *, tenants: Sequence[str] = (),
                       all_tenants: bool = False, maintenance_scopes: Sequence[str] = ()) -> dict[str, Any]:
        """Trust a host key bound to the tenants (or all of them) and maintenance scopes it serves,
        or re-bind one already trusted (issue 26.3). The policy decides on the binding; here it is
        only checked for shape: at least one tenant or all of them, known scope names."""
        call = self.authorize(ctx, "trust_host_key", list(tenants))  # tenant names are stored
        try:
            pub = load_public_pem(pem)
        except Exception:
            raise EngramError(Code.INVALID_SCHEMA, "public key") from None
        found = key_id(pub)
        if kid and kid != found:
            raise EngramError(Code.INVALID_SCHEMA, "key id does not match key")
        if self.core.trusted.is_grant_signer(found):
            # Key separation (SPEC §2): the core's confirmation key signs grants only.
            raise EngramError(Code.INVALID_SCHEMA, "the confirmation key cannot be a host key")
        if self.core.trusted.binding(found).local:
            raise EngramError(Code.INVALID_SCHEMA, "the operator's own key (host.key, --trust-host-key) is not bound")
        for tenant in tenants:
            checked_ref(tenant, "tenant")
        if all_tenants == bool(tenants):
            raise EngramError(Code.INVALID_SCHEMA, "name the tenants the key serves, or all tenants (not both)")
        if any(scope not in MAINTENANCE_SCOPES for scope in maintenance_scopes):
            raise EngramError(Code.INVALID_SCHEMA, "unknown maintenance scope")
        row = HostKeyRow(key_id=found, public_key_pem=public_pem(pub), added_at_ms=self.core.now_ms(),
                         tenants=tuple(sorted(set(tenants))), all_tenants=all_tenants,
                         maintenance_scopes=tuple(sorted(set(maintenance_scopes))))
        with self.core.store.write() as tx:
            tx.bind_trusted_host_key(row)
            tx.append_audit(self.core.audit_row(ctx, "admin.trust_host_key", "ok", found, call))
        self.core.trusted.add(pub, tenants=row.tenants, all_tenants=all_tenants,
                              maintenance_scopes=row.maintenance_scopes)
        return {"key_id": found, "trusted": True, "binding": self.core.trusted.binding(found).facts()}

    def list_host_keys(self, ctx: BoundContext) -> dict[str, Any]:
        """The keys the core trusts now, each with the binding the policy sees (issue 26.3)."""
        call = self.authorize(ctx, "list_host_keys")
        with self.core.store.read() as tx:
            stored = {row.key_id: row for row in tx.host_key_rows()}
        keys = []
        for binding in self.core.trusted.bindings():
            entry = {**binding.facts(), "stored": binding.key_id in stored}
            row = stored.get(binding.key_id)
            if row is not None and row.added_at_ms:
                entry["added_at"] = self.core.instant(row.added_at_ms)
            keys.append(entry)
        self._audit(ctx, "list_host_keys", "ok", "", call)
        return {"host_keys": keys}

    def untrust_host_key(self, ctx: BoundContext, pem: str, kid: str) -> dict[str, Any]:
        call = self.authorize(ctx, "untrust_host_key")
        if not kid:
            try:
                kid = key_id(load_public_pem(pem))
            except Exception:
                raise EngramError(Code.INVALID_SCHEMA, "public key") from None
        if kid == ctx.host_key_id:
            # Removing the key that signs this very call would lock the operator out mid-flight.
            raise EngramError(Code.INVALID_SCHEMA, "cannot untrust the calling host key")
        with self.core.store.write() as tx:
            removed = tx.remove_trusted_host_key(kid)
            tx.append_audit(self.core.audit_row(ctx, "admin.untrust_host_key", "ok" if removed else "absent", kid, call))
        live = self.core.trusted.remove(kid)
        return {"key_id": kid, "trusted": False, "removed": removed or live}
