"""Canonical JSON (RFC 8785) and domain-separated digests (SPEC §4).

A digest is ``sha256:`` + hex(SHA-256(``engram/<kind>/v1`` + NUL + JCS(value))).
Each kind below has exactly one domain string; docs/digests.md lists them and
tests/test_digests.py pins a vector per kind.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import rfc8785

DIGEST_KINDS: tuple[str, ...] = (
    "payload",          # effective capture payload (host defaults filled, scope bound)
    "record",           # record without record_id / record_digest
    "receipt",          # any receipt without its receipt_digest
    "request",          # a tool request (arguments) as received, for idempotency
    "operation",        # tool + target + scope + principal + arguments minus idempotency_key
    "event",            # journal event without its event_digest
    "audit",            # audit row without its row digest
    "response",         # a search response without response_digest
    "packet",           # a get packet without packet_digest
    "policy-input",     # the input document of a policy decision
    "ordered-ids",      # the ordered list of ranked record ids
    "profile-config",   # a ranking profile's pinned configuration
    "query",            # a search query and its parameters
    "backup-manifest",  # a backup manifest without its digest
)

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def canonical_json(value: Any) -> bytes:
    """RFC 8785 canonical bytes of a JSON value."""
    return rfc8785.dumps(value)


def digest(kind: str, value: Any) -> str:
    """Domain-separated digest of a JSON value."""
    if kind not in DIGEST_KINDS:
        raise ValueError(f"unknown digest kind {kind!r}")
    h = hashlib.sha256()
    h.update(f"engram/{kind}/v1".encode())
    h.update(b"\x00")
    h.update(canonical_json(value))
    return "sha256:" + h.hexdigest()


def digest_bytes(kind: str, data: bytes) -> str:
    """Domain-separated digest of raw bytes (used for chain links over stored rows)."""
    if kind not in DIGEST_KINDS:
        raise ValueError(f"unknown digest kind {kind!r}")
    return "sha256:" + hashlib.sha256(f"engram/{kind}/v1".encode() + b"\x00" + data).hexdigest()


def with_receipt_digest(receipt: dict[str, Any]) -> dict[str, Any]:
    """Return the receipt with ``receipt_digest`` over everything else."""
    body = {k: v for k, v in receipt.items() if k != "receipt_digest"}
    return {**body, "receipt_digest": digest("receipt", body)}
