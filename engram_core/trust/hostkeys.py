"""Ed25519 host keys: creation, loading, key ids, and the trusted-key set.

Two roles (SPEC §2, §8). A *host key* belongs to a host: it signs host contexts,
and confirmation grants for approvals its human gave (the MCP adapter is such a
host). The core's own ``confirmation.key`` is a *grant signer*: it signs the
grants ``HostService.IssueConfirmation`` issues and nothing else, so a context
signed with it is refused, whoever holds the file. ``engram serve`` creates
``DIR/host.key`` on first run and trusts it. Private key bytes are never logged.

Each host key carries a *binding* (:class:`HostKeyBinding`): the tenants and the
maintenance scopes it serves. The authz policy sees the binding of the key that signed a
context (``input.context.host_key``) and decides; the core only carries it. The data
directory's own ``host.key`` and keys named by ``engram serve --trust-host-key`` are the
operator's own (``local``); keys added through ``AdminService.TrustHostKey`` serve the
tenants and scopes named there, and a key stored without a binding serves nothing.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:32]


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def load_public_pem(pem: str) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem.encode())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def create_private_key_file(path: Path) -> Ed25519PrivateKey:
    """Create a new PEM private key at ``path`` with mode 0600 (never overwrites)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key


def load_private_key_file(path: Path | str) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 private key")
    return key


def load_or_create_private_key(path: Path) -> Ed25519PrivateKey:
    if path.exists():
        return load_private_key_file(path)
    return create_private_key_file(path)


@dataclass(frozen=True)
class HostKeyBinding:
    """What one trusted host key is bound to serve (issue 26.3); the policy decides on it.

    ``local``: the operator's own key (``DIR/host.key``, ``--trust-host-key`` at start), which
    the default policy lets act for every tenant and maintenance scope, as before bindings.
    ``all_tenants``: a key added for every tenant, with the maintenance scopes named.
    ``tenants``/``maintenance_scopes``: sorted, unique; empty serves nothing."""

    key_id: str
    local: bool = False
    all_tenants: bool = False
    tenants: tuple[str, ...] = ()
    maintenance_scopes: tuple[str, ...] = ()

    @classmethod
    def of(cls, key_id: str, *, tenants: list[str] | tuple[str, ...] = (), all_tenants: bool = False,
           maintenance_scopes: list[str] | tuple[str, ...] = (), local: bool = False) -> HostKeyBinding:
        return cls(key_id=key_id, local=local, all_tenants=all_tenants, tenants=tuple(sorted(set(tenants))),
                   maintenance_scopes=tuple(sorted(set(maintenance_scopes))))

    def facts(self) -> dict[str, Any]:
        """``input.context.host_key`` of every policy decision made for a context this key signed."""
        return {"id": self.key_id, "local": self.local, "all_tenants": self.all_tenants,
                "tenants": list(self.tenants), "maintenance_scopes": list(self.maintenance_scopes)}


class KeyRoleConflict(ValueError):
    """A key offered as a host key is the core's grant signer (or the reverse)."""


class TrustedHostKeys:
    """The public keys the core trusts, by key id, each in one role. Thread-safe.

    Host keys verify contexts and grants; grant signers verify grants only. A key
    never holds both roles: adding one in the other role raises KeyRoleConflict.
    """

    def __init__(self, keys: list[Ed25519PublicKey] | None = None, *,
                 grant_signers: list[Ed25519PublicKey] | None = None) -> None:
        """``keys``: the operator's own host keys (bound ``local``)."""
        self._lock = threading.Lock()
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._bindings: dict[str, HostKeyBinding] = {}
        self._grant_signers: dict[str, Ed25519PublicKey] = {}
        # Asked before a key id is answered as unknown (``on_unknown``): brings the copy up to date
        # where other cores change the trusted keys; None where nobody else does.
        self._refresh: Callable[[], None] | None = None
        for g in grant_signers or []:
            self.add_grant_signer(g)
        for k in keys or []:
            self.add(k, local=True)

    def add(self, key: Ed25519PublicKey, *, local: bool = False, tenants: list[str] | tuple[str, ...] = (),
            all_tenants: bool = False, maintenance_scopes: list[str] | tuple[str, ...] = ()) -> str:
        """Trust a host key (contexts and grants) with its binding. A local key stays local: the
        operator's own key is not narrowed by a stored row naming it."""
        kid = key_id(key)
        with self._lock:
            if kid in self._grant_signers:
                raise KeyRoleConflict("the core's confirmation key cannot be trusted as a host key")
            if not (kid in self._bindings and self._bindings[kid].local):
                self._bindings[kid] = HostKeyBinding.of(kid, tenants=tenants, all_tenants=all_tenants,
                                                        maintenance_scopes=maintenance_scopes, local=local)
            self._keys[kid] = key
        return kid

    def binding(self, kid: str) -> HostKeyBinding:
        """The binding of a trusted host key; an unknown key serves nothing."""
        with self._lock:
            return self._bindings.get(kid) or HostKeyBinding(key_id=kid)

    def bindings(self) -> list[HostKeyBinding]:
        with self._lock:
            return [self._bindings[k] for k in sorted(self._keys)]

    def add_grant_signer(self, key: Ed25519PublicKey) -> str:
        """Trust a key for confirmation grants only (the core's confirmation.key)."""
        kid = key_id(key)
        with self._lock:
            if kid in self._keys:
                raise KeyRoleConflict("a host key cannot be the core's confirmation key")
            self._grant_signers[kid] = key
        return kid

    def remove(self, kid: str) -> bool:
        with self._lock:
            self._bindings.pop(kid, None)
            return self._keys.pop(kid, None) is not None

    def on_unknown(self, refresh: Callable[[], None] | None) -> None:
        """Call ``refresh`` (which may ``sync_stored``) before answering that a key id is not
        trusted, so a key another core trusted a moment ago is never refused from a stale copy."""
        self._refresh = refresh

    def sync_stored(self, stored: list[tuple[Ed25519PublicKey, HostKeyBinding]]) -> None:
        """Make the keys trusted through the store exactly ``stored`` (each with its binding), as
        the store holds them now: keys another core trusted are added, re-bound ones take their
        new binding, untrusted ones are dropped. The operator's own keys (``local``) are this
        core's configuration and stay as they are; a stored key that is a grant signer is left
        out (``KeyRoleConflict`` at start names it)."""
        with self._lock:
            wanted = {b.key_id: (k, b) for k, b in stored if b.key_id not in self._grant_signers}
            for kid in [k for k in self._keys if k not in wanted and not self._is_local(k)]:
                del self._keys[kid]
                self._bindings.pop(kid, None)
            for kid, (key, binding) in wanted.items():
                if self._is_local(kid):
                    continue
                self._keys[kid] = key
                self._bindings[kid] = binding

    def _is_local(self, kid: str) -> bool:
        binding = self._bindings.get(kid)
        return binding is not None and binding.local

    def trusts(self, kid: str) -> bool:
        """Whether ``kid`` is a trusted host key in this copy (no refresh)."""
        with self._lock:
            return kid in self._keys

    def _refreshed(self) -> bool:
        refresh = self._refresh
        if refresh is None:
            return False
        refresh()
        return True

    def is_grant_signer(self, kid: str) -> bool:
        with self._lock:
            return kid in self._grant_signers

    def context_key(self, kid: str) -> Ed25519PublicKey | None:
        """The key that may have signed a host context: host keys only."""
        with self._lock:
            found = self._keys.get(kid)
        if found is None and self._refreshed():
            with self._lock:
                found = self._keys.get(kid)
        return found

    def grant_key(self, kid: str) -> Ed25519PublicKey | None:
        """The key that may have signed a confirmation grant: host keys and grant signers."""
        with self._lock:
            found = self._keys.get(kid) or self._grant_signers.get(kid)
        if found is None and self._refreshed():
            with self._lock:
                found = self._keys.get(kid)
        return found

    def ids(self) -> list[str]:
        """The trusted host keys (grant signers are not host keys)."""
        with self._lock:
            return sorted(self._keys)
