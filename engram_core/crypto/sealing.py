"""AES-256-GCM sealing of candidate envelopes and record bodies (SPEC §5, §10).

Associated data binds what is sealed (``kind``) and its id (``owner``), so a
sealed body cannot be swapped onto another candidate or record.
"""

from __future__ import annotations

import secrets

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_NONCE = 12


def _ad(kind: str, owner: str) -> bytes:
    return f"engram/sealed-{kind}/v1\x00{owner}".encode()


def seal(data_key: bytes, plaintext: bytes, *, kind: str, owner: str) -> bytes:
    nonce = secrets.token_bytes(_NONCE)
    return nonce + AESGCM(data_key).encrypt(nonce, plaintext, _ad(kind, owner))


def unseal(data_key: bytes, sealed: bytes, *, kind: str, owner: str) -> bytes:
    return AESGCM(data_key).decrypt(sealed[:_NONCE], sealed[_NONCE:], _ad(kind, owner))
