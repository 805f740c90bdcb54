"""Bundle signatures in OPA's format: ``.signatures.json`` holding one JWT over the files' digests.

The JWT's payload is ``{"files": [{"name", "hash", "algorithm": "SHA-256"}, ...]}`` (plus
optional ``scope``, ``iat``, ``iss``); its header names ``alg`` and ``kid``. A file's hash is
SHA-256 over its bytes, except structured files (``data.json``, ``.manifest``), which are
parsed and hashed in OPA's canonical form (object keys sorted, no whitespace, numbers as
written), so a bundle Engram signs verifies in OPA and one ``opa sign`` made verifies here.

Verification is OPA's: the JWT verifies with the configured public key, the signed file list
and the bundle's files are the same set, and every file's hash matches. Anything else is a
BundleError naming the file (``.signatures.json`` when the signature itself is at fault).
PyJWT does the JWS; the algorithms accepted are only those of the key's type, so a token can
never choose a weaker one (``none``, or HMAC keyed with the public key).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from engram_core.policy.bundle import MANIFEST, SIGNATURES, BundleError

HASH_ALGORITHM = "SHA-256"
DEFAULT_KEY_ID = "default"  # OPA's key id when none is configured
_STRUCTURED = frozenset({"data.json", "data.yaml", MANIFEST})


def is_structured(relpath: str) -> bool:
    """OPA hashes these as parsed JSON, everything else as bytes (``bundle.IsStructuredDoc``)."""
    return PurePosixPath(relpath).name in _STRUCTURED


class _Number(str):
    """A JSON number kept as written: OPA decodes numbers as json.Number and hashes the literal."""


def _parse_json(relpath: str, blob: bytes) -> Any:
    try:
        return json.loads(blob.decode("utf-8"), parse_int=_Number, parse_float=_Number,
                          parse_constant=_Number)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BundleError(f"cannot hash: invalid JSON ({exc})", file=relpath) from exc


def _encode_string(value: str) -> str:
    # Go's encoding/json with SetEscapeHTML(false): what Python's ensure_ascii=False writes,
    # except that Go also escapes U+2028 and U+2029.
    return json.dumps(value, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _canonical(value: Any, out: list[str]) -> None:
    """OPA's ``bundle.walk``: ``{`` sorted ``"key":value`` pairs ``}``, ``[`` values ``]``."""
    if isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value)):
            if i:
                out.append(",")
            out.append(_encode_string(key))
            out.append(":")
            _canonical(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _canonical(item, out)
        out.append("]")
    elif isinstance(value, _Number):
        out.append(str.__str__(value))
    elif isinstance(value, str):
        out.append(_encode_string(value))
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif value is None:
        out.append("null")
    else:  # pragma: no cover - json.loads yields nothing else
        raise TypeError(type(value).__name__)


def file_digest(relpath: str, blob: bytes) -> str:
    """The hex SHA-256 OPA records for one bundle file."""
    if is_structured(relpath):
        parts: list[str] = []
        _canonical(_parse_json(relpath, blob), parts)
        blob = "".join(parts).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def _algorithms_for(key: Any) -> list[str]:
    """The JWS algorithms a key of this type verifies (never ``none`` nor HMAC)."""
    if isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        return ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        return {"secp256r1": ["ES256"], "secp384r1": ["ES384"], "secp521r1": ["ES512"]}.get(key.curve.name, [])
    if isinstance(key, ed25519.Ed25519PublicKey | ed25519.Ed25519PrivateKey):
        return ["EdDSA"]
    return []


def load_signing_key(pem: bytes) -> Any:
    """A PEM private key (RSA, ECDSA P-256/384/521 or Ed25519); ValueError otherwise."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not an unencrypted PEM private key ({exc})") from None
    if not _algorithms_for(key):
        raise ValueError(f"unsupported signing key type {type(key).__name__}")
    return key


def load_verification_key(pem: bytes) -> Any:
    """A PEM public key (or certificate) of a supported type; ValueError otherwise."""
    try:
        if b"BEGIN CERTIFICATE" in pem:
            from cryptography import x509

            key = x509.load_pem_x509_certificate(pem).public_key()
        else:
            key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise ValueError(f"not a PEM public key ({exc})") from None
    if not _algorithms_for(key):
        raise ValueError(f"unsupported verification key type {type(key).__name__}")
    return key


def sign_files(files: Mapping[str, bytes], key: Any, *, key_id: str = DEFAULT_KEY_ID,
               algorithm: str | None = None, issuer: str = "engram", scope: str = "",
               issued_at: int | None = None) -> bytes:
    """``.signatures.json`` for ``files`` (relative path -> bytes, the signatures file excluded).
    ``iat`` (now, or ``issued_at``) orders signed bundles: a core refuses one signed before the
    bundle it last accepted (``engram_core/policy/ordering.py``)."""
    allowed = _algorithms_for(key)
    algorithm = algorithm or allowed[0]
    if algorithm not in allowed:
        raise ValueError(f"algorithm {algorithm} does not fit a {type(key).__name__} (use one of {allowed})")
    payload: dict[str, Any] = {
        "files": [{"name": rel, "hash": file_digest(rel, blob), "algorithm": HASH_ALGORITHM}
                  for rel, blob in sorted(files.items())],
        "iat": int(time.time()) if issued_at is None else issued_at,
        "iss": issuer,
    }
    if scope:
        payload["scope"] = scope
    token = jwt.encode(payload, key, algorithm=algorithm, headers={"kid": key_id})
    return (json.dumps({"signatures": [token]}, indent=1) + "\n").encode()


@dataclass(frozen=True)
class BundleVerifier:
    """Checks a bundle's ``.signatures.json`` against one trusted public key (``scope`` as OPA's
    ``signing.scope``: when set, the signature must carry exactly it; when not, none)."""

    key: Any
    scope: str = ""
    origin: str = ""  # where the key came from, for messages

    @classmethod
    def from_pem_file(cls, path: str) -> BundleVerifier:
        with open(path, "rb") as f:
            return cls(load_verification_key(f.read()), origin=path)

    def verify(self, files: Mapping[str, bytes], signatures: bytes | None) -> dict[str, Any]:
        """Raise BundleError naming the file that fails, else return the verified claims (the
        bundle is authentic; ``signed_at(claims)`` is when it was signed)."""
        if signatures is None:
            raise BundleError("the bundle is not signed (no .signatures.json) and a verification key is configured",
                              file=SIGNATURES)
        claims = self._claims(signatures)
        signed: dict[str, dict[str, Any]] = {}
        for entry in claims.get("files") or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise BundleError("signed file list is malformed", file=SIGNATURES)
            signed[entry["name"].lstrip("/")] = entry
        for rel in sorted(files):
            entry = signed.pop(rel, None)
            if entry is None:
                raise BundleError("file not included in the bundle signature", file=rel)
            if entry.get("algorithm") != HASH_ALGORITHM:
                raise BundleError(f"unsupported hashing algorithm {entry.get('algorithm')!r}", file=rel)
            if entry.get("hash") != file_digest(rel, files[rel]):
                raise BundleError("digest mismatch: the file is not the one that was signed", file=rel)
        if signed:
            missing = sorted(signed)
            raise BundleError("signed but missing from the bundle", file=missing[0])
        return claims

    def _claims(self, signatures: bytes) -> dict[str, Any]:
        try:
            doc = json.loads(signatures.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise BundleError(f"not JSON ({exc})", file=SIGNATURES) from exc
        tokens = doc.get("signatures") if isinstance(doc, dict) else None
        if not isinstance(tokens, list) or len(tokens) != 1 or not isinstance(tokens[0], str):
            raise BundleError("expected exactly one JWT in \"signatures\"", file=SIGNATURES)
        try:
            claims = jwt.decode(tokens[0], self.key, algorithms=_algorithms_for(self.key),
                                options={"verify_iat": False, "verify_aud": False, "require": ["files"]})
        except jwt.PyJWTError as exc:
            raise BundleError(f"signature does not verify with the configured key ({exc})", file=SIGNATURES) from exc
        if (claims.get("scope") or "") != self.scope:
            raise BundleError("signature scope mismatch", file=SIGNATURES)
        return claims


def signed_at(claims: Mapping[str, Any]) -> float | None:
    """The verified ``iat`` (seconds since the epoch), or None when the signature carries none
    usable (``opa sign`` adds it only from a ``--claims-file``)."""
    value = claims.get("iat")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return value
