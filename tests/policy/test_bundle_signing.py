"""Signed bundles: OPA's .signatures.json format, refused when unsigned or tampered, naming the
file, at start and at reload (issue 30)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import tarfile
from pathlib import Path

import jwt
import pytest

from engram_core.policy.bundle import BundleError, read_bundle, read_bundle_archive
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import AUTHZ, BundleRefused
from engram_core.policy.signing import BundleVerifier, file_digest, load_signing_key, sign_files
from tests.support.policy_support import copy_bundle, engram, write_keys


def test_structured_files_are_hashed_in_opas_canonical_form():
    """OPA hashes data.json and .manifest parsed: keys sorted, no whitespace, numbers as written,
    no HTML escaping, U+2028 escaped (Go's encoding/json); everything else byte for byte."""
    blob = '{"b": [1.50, 2e3, "x<y>&"], "a": {"d": null, "c": true, "s": "l\u2028m"}}'.encode()
    canonical = b'{"a":{"c":true,"d":null,"s":"l\\u2028m"},"b":[1.50,2e3,"x<y>&"]}'
    assert file_digest("engram/x/data.json", blob) == hashlib.sha256(canonical).hexdigest()
    assert file_digest(".manifest", b'{"roots": ["engram"], "revision": "r"}') == \
        hashlib.sha256(b'{"revision":"r","roots":["engram"]}').hexdigest()
    assert file_digest("engram/a.rego", b"package a\n") == hashlib.sha256(b"package a\n").hexdigest()


def _signed(tmp_path: Path, kind: str = "rsa") -> tuple[Path, BundleVerifier]:
    bundle = copy_bundle(tmp_path)
    private, public = write_keys(tmp_path, kind)
    files = dict(read_bundle(bundle).files)
    (bundle / ".signatures.json").write_bytes(sign_files(files, load_signing_key(private.read_bytes())))
    return bundle, BundleVerifier.from_pem_file(str(public))


@pytest.mark.parametrize("kind", ["rsa", "ec"])
def test_a_signed_bundle_verifies_and_its_jwt_is_opas(tmp_path, kind):
    bundle, verifier = _signed(tmp_path, kind)
    read = read_bundle(bundle)
    verifier.verify(read.files, read.signatures)
    doc = json.loads((bundle / ".signatures.json").read_text())
    token = doc["signatures"][0]
    header = jwt.get_unverified_header(token)
    assert header["alg"] == ("RS256" if kind == "rsa" else "ES256") and header["kid"] == "default"
    claims = jwt.decode(token, options={"verify_signature": False})
    assert {f["name"] for f in claims["files"]} == set(read.files) and ".manifest" in set(read.files)
    assert all(f["algorithm"] == "SHA-256" and len(f["hash"]) == 64 for f in claims["files"])


def _refusal(bundle: Path, verifier: BundleVerifier) -> BundleError:
    read = read_bundle(bundle)
    with pytest.raises(BundleError) as caught:
        verifier.verify(read.files, read.signatures)
    return caught.value


def test_a_tampered_file_is_refused_by_name(tmp_path):
    bundle, verifier = _signed(tmp_path)
    rego = bundle / "engram" / "authz" / "authz.rego"
    rego.write_text(rego.read_text() + "\n# one more line\n")
    refused = _refusal(bundle, verifier)
    assert refused.file == "engram/authz/authz.rego" and "digest mismatch" in refused.error


def test_a_file_added_after_signing_is_refused_by_name(tmp_path):
    bundle, verifier = _signed(tmp_path)
    (bundle / "engram" / "authz" / "extra.rego").write_text("package engram.authz\n\nextra := 1\n")
    assert _refusal(bundle, verifier).file == "engram/authz/extra.rego"


def test_a_file_removed_after_signing_is_refused_by_name(tmp_path):
    bundle, verifier = _signed(tmp_path)
    (bundle / "engram" / "retention" / "retention_test.rego").unlink()
    refused = _refusal(bundle, verifier)
    assert refused.file == "engram/retention/retention_test.rego" and "missing" in refused.error


def test_data_reformatted_but_equal_still_verifies(tmp_path):
    bundle, verifier = _signed(tmp_path)
    data = bundle / "data.json"
    data.write_text(json.dumps(json.loads(data.read_text()), indent=8))  # whitespace and key order only
    read = read_bundle(bundle)
    verifier.verify(read.files, read.signatures)


def test_unsigned_and_foreign_signatures_are_refused(tmp_path):
    bundle, verifier = _signed(tmp_path)
    (tmp_path / "other").mkdir()
    other_private, _ = write_keys(tmp_path / "other")
    read = read_bundle(bundle)
    foreign = sign_files(dict(read.files), load_signing_key(other_private.read_bytes()))
    (bundle / ".signatures.json").write_bytes(foreign)
    assert _refusal(bundle, verifier).file == ".signatures.json"
    (bundle / ".signatures.json").unlink()
    refused = _refusal(bundle, verifier)
    assert refused.file == ".signatures.json" and "not signed" in refused.error


def test_a_token_cannot_choose_hmac_keyed_with_the_public_key(tmp_path):
    """The classic JWT confusion: HS256 with the verifier's public PEM as the secret."""
    bundle, verifier = _signed(tmp_path)
    public_pem = (tmp_path / "bundle-rsa.pub").read_bytes()
    files = dict(read_bundle(bundle).files)
    claims = {"files": [{"name": n, "hash": file_digest(n, b), "algorithm": "SHA-256"} for n, b in files.items()]}
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=")
    mac = hmac.new(public_pem, header + b"." + payload, hashlib.sha256).digest()
    token = (header + b"." + payload + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()
    (bundle / ".signatures.json").write_text(json.dumps({"signatures": [token]}))
    assert _refusal(bundle, verifier).file == ".signatures.json"


def test_engine_refuses_a_tampered_bundle_at_start_and_at_reload_keeping_the_signed_revision(tmp_path):
    bundle, verifier = _signed(tmp_path)
    engine = EmbeddedPolicyEngine(bundle, verifier=verifier)
    revision = engine.reload()
    policy = bundle / "engram" / "capture" / "capture.rego"
    policy.write_text(policy.read_text().replace("RETAIN_NOT_ALLOWED", "RETAIN_ALLOWED_NOW"))
    with pytest.raises(BundleRefused) as caught:
        engine.reload()
    assert caught.value.problem["file"] == "engram/capture/capture.rego"
    assert caught.value.active_revision == revision and engine.decide(AUTHZ, {}).revision == revision
    fresh = EmbeddedPolicyEngine(bundle, verifier=verifier)
    with pytest.raises(BundleRefused) as at_start:
        fresh.reload()
    assert at_start.value.problem["file"] == "engram/capture/capture.rego" and not fresh.active()


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name.lstrip("/"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _rewrite(archive: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo("/" + name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def test_cli_signs_an_archive_that_check_verifies_and_a_tampered_one_fails_naming_the_file(tmp_path):
    private, public = write_keys(tmp_path)
    out = tmp_path / "engram-policies.tar.gz"
    done = engram("policy", "bundle", str(copy_bundle(tmp_path)), "--out", str(out), "--sign", str(private), check=True)
    assert "signed with" in done.stdout
    members = _members(out)
    assert ".signatures.json" in members and not any(n.endswith("_test.rego") for n in members)
    ok = engram("policy", "check", str(out), "--verification-key", str(public))
    assert ok.returncode == 0 and "signature: verified" in ok.stdout, ok.stdout + ok.stderr
    members["engram/redaction/redaction.rego"] += b"\n# tampered\n"
    _rewrite(out, members)
    bad = engram("policy", "check", str(out), "--verification-key", str(public))
    assert bad.returncode == 1 and "engram/redaction/redaction.rego" in bad.stderr and "digest mismatch" in bad.stderr


def test_cli_sign_writes_signatures_beside_the_directory(tmp_path):
    private, public = write_keys(tmp_path, "ec")
    bundle = copy_bundle(tmp_path)
    done = engram("policy", "sign", str(bundle), "--signing-key", str(private), check=True)
    assert str(bundle / ".signatures.json") in done.stdout
    read = read_bundle(bundle)
    BundleVerifier.from_pem_file(str(public)).verify(read.files, read.signatures)


@pytest.mark.parametrize("name", ["../escape.rego", "/../../etc/x.rego", "a/../../b.rego"])
def test_archives_with_paths_outside_the_bundle_are_refused(tmp_path, name):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for member, blob in ((".manifest", b'{"revision": "r", "roots": ["engram"]}'), (name, b"package engram.x\n")):
            info = tarfile.TarInfo(member)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    with pytest.raises(BundleError, match="not a path inside the bundle"):
        read_bundle_archive(buffer.getvalue())
