"""Trusted host keys kept current on every core of a store several cores share (SPEC §2).

Each core verifies contexts against its copy of the trusted keys (``hostkeys.TrustedHostKeys``,
loaded from the store at open). Where other cores can change the stored keys (``engram admin
trust-host-key``, ``untrust-host-key``, a re-binding, a restore), a copy loaded once would keep
honouring a key another core untrusted until this core restarts. So the store keeps a *trust
version*, moved in the transaction of every change to the keys (``Store.host_keys_version``),
and a core compares it with the version its copy was loaded at before it trusts a context:

- a call that spends its context reads the version in the statement that claims the context's
  nonce (``Store.claim_context``): no round trip of its own;
- a call that spends none (the tool listing, the check before a confirmation, a refusal's
  record) reads it in one statement of its own (one round trip on PostgreSQL);
- a key id the copy does not hold is looked up the same way before it is refused (one round trip),
  so a key another core trusted a moment ago is never refused from a stale copy.

When the version moved, the copy is reloaded (one read of the keys) and the context is checked
again against it: its key must still be trusted (else the refusal an unknown key gets), and the
binding the policy sees is the new one. Read-your-writes follows: a change another core
acknowledged was committed before this call's read began, so the version this call reads has
moved past it. The sole writer of its store (DuckDB) changes its keys only itself and updates
its copy as it does: it reads nothing (``host_keys_version`` is None).
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from engram_core.contract.errors import Code, EngramError
from engram_core.store.port import Store
from engram_core.trust.hostctx import BoundContext
from engram_core.trust.hostkeys import HostKeyBinding, TrustedHostKeys, key_id, load_public_pem

log = logging.getLogger("engram.hostkeys")
_UNLOADED = -1  # no version yet: the first version read reloads the copy (it was loaded before any was read)


class SharedHostTrust:
    """Keeps ``trusted`` current with ``store``'s trusted host keys (see the module docstring)."""

    def __init__(self, store: Store, trusted: TrustedHostKeys) -> None:
        self._store = store
        self._trusted = trusted
        self._lock = threading.Lock()  # one reload at a time: a copy is never set back by an older read
        self._loaded_at = _UNLOADED
        self.shared = store.host_keys_version() is not None
        if self.shared:
            trusted.on_unknown(self.refresh)

    def refresh(self, version: int | None = None) -> None:
        """Reload the copy if the store's trust version (``version``, read by the caller, else
        read now) is not the one it was loaded at."""
        if not self.shared:
            return
        if version is None:
            version = self._store.host_keys_version()
            if version is None:
                return
        with self._lock:
            if version == self._loaded_at:
                return
            # Read after ``version`` was: the rows are at least that new, so marking the copy with
            # it never marks an older copy as current (at worst a later call reloads once more).
            with self._store.read() as tx:
                rows = tx.host_key_rows()
            stored = []
            for row in rows:
                try:
                    key = load_public_pem(row.public_key_pem)
                except ValueError:
                    log.warning("stored trusted host key %s is not an Ed25519 key; not trusted", row.key_id)
                    continue
                stored.append((key, HostKeyBinding.of(key_id(key), tenants=row.tenants, all_tenants=row.all_tenants,
                                                      maintenance_scopes=row.maintenance_scopes)))
            self._trusted.sync_stored(stored)
            self._loaded_at = version
        log.debug("trusted host keys reloaded at trust version %d (%d stored)", version, len(stored))

    def current(self, ctx: BoundContext, version: int | None) -> BoundContext:
        """``ctx`` checked against the keys as of ``version`` (the store's trust version the call
        read; None: the sole writer's copy, exact): refused as an unknown key's context when its
        key is no longer trusted, with its key's current binding otherwise."""
        if version is None or version == self._loaded_at:
            return ctx
        self.refresh(version)
        if not self._trusted.trusts(ctx.host_key_id):
            # The refusal a context signed by an unknown key gets (hostctx.verify_context).
            raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context rejected: ValueError")
        return dataclasses.replace(ctx, host_key=self._trusted.binding(ctx.host_key_id))

    def checked(self, ctx: BoundContext) -> BoundContext:
        """``current`` for a call that claims no nonce: the version read on its own (nothing read
        by the sole writer)."""
        return self.current(ctx, self._store.host_keys_version() if self.shared else None)
