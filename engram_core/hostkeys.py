"""Ed25519 host keys: creation, loading, key ids, and the trusted-key set.

Two roles (SPEC §2, §8). A *host key* belongs to a host: it signs host contexts,
and confirmation grants for approvals its human gave (the MCP adapter is such a
host). The core's own ``confirmation.key`` is a *grant signer*: it signs the
grants ``HostService.IssueConfirmation`` issues and nothing else, so a context
signed with it is refused, whoever holds the file. ``engram serve`` creates
``DIR/host.key`` on first run and trusts it. Private key bytes are never logged.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

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


class KeyRoleConflict(ValueError):
    """A key offered as a host key is the core's grant signer (or the reverse)."""


class TrustedHostKeys:
    """The public keys the core trusts, by key id, each in one role. Thread-safe.

    Host keys verify contexts and grants; grant signers verify grants only. A key
    never holds both roles: adding one in the other role raises KeyRoleConflict.
    """

    def __init__(self, keys: list[Ed25519PublicKey] | None = None, *,
                 grant_signers: list[Ed25519PublicKey] | None = None) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._grant_signers: dict[str, Ed25519PublicKey] = {}
        for g in grant_signers or []:
            self.add_grant_signer(g)
        for k in keys or []:
            self.add(k)

    def add(self, key: Ed25519PublicKey) -> str:
        """Trust a host key (contexts and grants)."""
        kid = key_id(key)
        with self._lock:
            if kid in self._grant_signers:
                raise KeyRoleConflict("the core's confirmation key cannot be trusted as a host key")
            self._keys[kid] = key
        return kid

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
            return self._keys.pop(kid, None) is not None

    def is_grant_signer(self, kid: str) -> bool:
        with self._lock:
            return kid in self._grant_signers

    def context_key(self, kid: str) -> Ed25519PublicKey | None:
        """The key that may have signed a host context: host keys only."""
        with self._lock:
            return self._keys.get(kid)

    def grant_key(self, kid: str) -> Ed25519PublicKey | None:
        """The key that may have signed a confirmation grant: host keys and grant signers."""
        with self._lock:
            return self._keys.get(kid) or self._grant_signers.get(kid)

    def ids(self) -> list[str]:
        """The trusted host keys (grant signers are not host keys)."""
        with self._lock:
            return sorted(self._keys)
