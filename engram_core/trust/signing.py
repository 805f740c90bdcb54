"""The core's own signing keys: one for backups, one for chain-head anchors.

Each key has one role (SPEC §2: a key is trusted for one role), so a signature
made for one purpose never passes for another: ``DIR/backup.key`` signs backup
manifests, ``DIR/anchor.key`` signs exported journal and audit heads. Neither
is the confirmation key (which signs grants only) nor a host key, and neither
is ever trusted to sign host contexts. Both are Ed25519, created 0600 on first
use; their public keys are what an operator keeps outside the data directory
(``engram admin signing-keys``) and names when restoring or verifying later.

A signature covers a domain tag and a digest that already commits to the whole
document (the backup's ``manifest_digest``, the anchor's ``anchor`` digest).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engram_core.trust.hostkeys import key_id, load_or_create_private_key, load_public_pem, public_pem

BACKUP_KEY_FILE = "backup.key"
ANCHOR_KEY_FILE = "anchor.key"
BACKUP_DOMAIN = b"engram/backup-signature/v1\x00"
ANCHOR_DOMAIN = b"engram/anchor-signature/v1\x00"


@dataclass(frozen=True)
class CoreSigner:
    """One of the core's signing keys and the domain it signs in."""

    key: Ed25519PrivateKey
    domain: bytes

    @classmethod
    def load(cls, path: Path, domain: bytes) -> CoreSigner:
        return cls(load_or_create_private_key(path), domain)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.key.public_key()

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)

    def public(self) -> dict[str, str]:
        return {"key_id": self.key_id, "public_key_pem": public_pem(self.public_key)}

    def sign(self, digest: str) -> dict[str, str]:
        """The signature document over ``digest`` (a ``sha256:…`` string)."""
        sig = self.key.sign(self.domain + digest.encode())
        return {"alg": "ed25519", "key_id": self.key_id, "signature": base64.b64encode(sig).decode()}


def verify_signature(domain: bytes, digest: str, signature: Any, keys: list[Ed25519PublicKey]) -> str | None:
    """The key id among ``keys`` whose signature ``signature`` is over ``digest``; None if none verifies."""
    if not isinstance(signature, dict) or signature.get("alg") != "ed25519":
        return None
    try:
        raw = base64.b64decode(signature.get("signature", ""), validate=True)
    except (ValueError, TypeError):
        return None
    for pub in keys:
        try:
            pub.verify(raw, domain + digest.encode())
        except InvalidSignature:
            continue
        return key_id(pub)
    return None


def public_keys_from_pems(pems: list[str]) -> list[Ed25519PublicKey]:
    """Operator-named public keys; ValueError on anything that is not an Ed25519 public key PEM."""
    keys = []
    for pem in pems:
        try:
            keys.append(load_public_pem(pem))
        except Exception:
            raise ValueError("not an Ed25519 public key PEM") from None
    return keys


@dataclass(frozen=True)
class CoreSigners:
    backup: CoreSigner
    anchor: CoreSigner

    @classmethod
    def load(cls, data_dir: Path) -> CoreSigners:
        return cls(CoreSigner.load(data_dir / BACKUP_KEY_FILE, BACKUP_DOMAIN),
                   CoreSigner.load(data_dir / ANCHOR_KEY_FILE, ANCHOR_DOMAIN))
