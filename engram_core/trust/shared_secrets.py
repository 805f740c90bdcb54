"""The key files every core of one store must hold alike, checked against the store at open.

A store's data is only readable, searchable and verifiable with the key files it was written
with: ``index.key`` (term hashes of every sealed projection, and of each query), ``page.key``
(the MAC of page cursors: a cursor from one core pages on another), ``confirmation.key`` (the
grants ``IssueConfirmation`` signs, verified wherever the confirmed call lands), ``backup.key``
and ``anchor.key`` (one signer for the store's backups and anchors), and the KEK ring
(``store.kek``, whose identity stays while its generations rotate). A core that opened with a
different one would answer wrongly rather than fail: searches that find nothing, cursors and
grants refused, a ring that unwraps no key. So the first core to open a store records each
file's fingerprint in the store (``store_meta``), and every later open compares and refuses to
start, naming the file, on any difference.

A fingerprint is a domain-separated SHA-256 digest of the file's content (or of the ring's
identity), cut to 128 bits: it identifies the key, it does not reveal it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from engram_core.contract.errors import Code, EngramError
from engram_core.store.port import Store

SHARED_KEY_FILES = ("index.key", "page.key", "confirmation.key", "backup.key", "anchor.key")
META_PREFIX = "secret_fingerprint."
_DOMAIN = b"engram/secret-fingerprint/v1\x00"


def fingerprint(name: str, content: bytes) -> str:
    return hashlib.sha256(_DOMAIN + name.encode() + b"\x00" + content).hexdigest()[:32]


def fingerprints(key_dir: Path, ring_id: str) -> dict[str, str]:
    """The fingerprints of the shared key files in ``key_dir`` (each must exist by now)."""
    out = {name: fingerprint(name, (key_dir / name).read_bytes()) for name in SHARED_KEY_FILES}
    out["store.kek"] = fingerprint("store.kek", ring_id.encode())
    return out


def check_shared_secrets(store: Store, key_dir: Path, ring_id: str) -> dict[str, str]:
    """Record the key files' fingerprints in a store that has none; refuse (STORE_UNAVAILABLE,
    naming the files) when the store's differ. Returns what the store holds now."""
    found = fingerprints(key_dir, ring_id)
    with store.write() as tx:
        held = {k.removeprefix(META_PREFIX): v for k, v in tx.meta_with_prefix(META_PREFIX).items()}
        wrong = sorted(name for name, fp in found.items() if name in held and held[name] != fp)
        if wrong:
            raise EngramError(
                Code.STORE_UNAVAILABLE,
                f"key file(s) {', '.join(wrong)} in {key_dir} are not the ones this store was written with "
                "(their fingerprints differ from the store's): every core of a store needs the same key files")
        for name, fp in found.items():
            if name not in held:
                tx.set_meta(META_PREFIX + name, fp)
    return {**held, **found}
