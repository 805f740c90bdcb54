"""Digest test vectors, one per kind (SPEC §4; domains listed in docs/digests.md)."""

from __future__ import annotations

import hashlib

import pytest

from engram_core.contract.canonical import DIGEST_KINDS, canonical_json, digest, with_receipt_digest
from engram_core.services.core import record_id_of

VALUE = {"b": [1, 2.5, "é"], "a": {"z": None, "y": True}, "n": 9007199254740991}
# RFC 8785: keys sorted by UTF-16 code units, shortest number form, no whitespace, UTF-8.
JCS = '{"a":{"y":true,"z":null},"b":[1,2.5,"é"],"n":9007199254740991}'.encode()

VECTORS = [
    ("payload", "sha256:4c0c47295d86746eeed31e88d8fac59a4c4f0b34aae39bf68ec6f81be636ceed"),
    ("record", "sha256:6195ad2f0f03c44f0f54be65205d0bb3b8c306413a80c0e70d5ea7480efbadf4"),
    ("receipt", "sha256:809630749e56fbc0df0dd7b88ded83665e4ab5e5e4f4d17b090545506bd28b34"),
    ("request", "sha256:3bd4127435cf7dd96e589ad5e1245f3fb9d76bbceb138dd3684b544276760a4f"),
    ("operation", "sha256:1533015d4c3d2c9d628f89f0771a23cb7e4886f4445bbf645b1cf7d5803bae7e"),
    ("event", "sha256:53ff8cff2102100291fb0273df007ac9cdf59b07f432f50fe3d920ad1af8f798"),
    ("audit", "sha256:6d0d1f7bbfd7aac1b9d6bc8fb3e43f242771b442c34d1c0dfd713c024ad203c4"),
    ("response", "sha256:0383a1597738c99962051e1f90704620472dd165c8b52966cf39eb3d668c8854"),
    ("packet", "sha256:905856155ad172593309be3415f27eebac6624df59f9d24f42dd3574ac0628fd"),
    ("policy-input", "sha256:1e395fa29ccd485fd8ca7298ea1aa0655538b9b428e68005e4a286fdf968848d"),
    ("ordered-ids", "sha256:3d4f91ee0a28389833d5736f04e3fc924d093d3a3139821250cce23fc343425c"),
    ("profile-config", "sha256:3ac86f4b3490c4c4d19acf92c2e25fe389577cb3b7fe2b89e72f73b92e972686"),
    ("query", "sha256:12c1a4ec96ce9de305e77364791ffb57ea31cf4e363af8c04b6c9df26c39b8fe"),
    ("backup-manifest", "sha256:3b037a1ea763d9bf2d2deb787679c5cd9041ea93a3118dfcca3c4eea19968160"),
    ("anchor", "sha256:72dda20748dbde89276e0368b3830e089526e655c39c570bca1d57b8dd6ef0bf"),
]


def test_every_kind_has_a_vector() -> None:
    assert sorted(k for k, _ in VECTORS) == sorted(DIGEST_KINDS)


def test_canonical_json_is_rfc8785() -> None:
    assert canonical_json(VALUE) == JCS
    # big integers are not rounded; floats use the shortest round-trip form
    assert canonical_json({"x": 2**53 - 1, "y": 1e21, "z": 0.1}) == b'{"x":9007199254740991,"y":1e+21,"z":0.1}'


@pytest.mark.parametrize(("kind", "expected"), VECTORS)
def test_digest_vector(kind: str, expected: str) -> None:
    independent = "sha256:" + hashlib.sha256(f"engram/{kind}/v1".encode() + b"\x00" + JCS).hexdigest()
    assert digest(kind, VALUE) == independent == expected


def test_receipt_digest_excludes_itself() -> None:
    r = with_receipt_digest({"a": 1, "receipt_digest": "sha256:" + "0" * 64})
    assert r["receipt_digest"] == digest("receipt", {"a": 1})


def test_record_id_is_base32_of_record_digest() -> None:
    rid = record_id_of("sha256:" + "00" * 31 + "ff")
    # 30 zero bytes -> 48 "a"; the last two bytes 0x00 0xff -> bits 00000 00011 11111 1(0000) -> "ad7q"
    assert rid == "mem_" + "a" * 48 + "ad7q"
    assert len(rid) == 4 + 52


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError):
        digest("nope", {})
