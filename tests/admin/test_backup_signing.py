"""Backups are signed by the core that made them (issue 13, finding 4), attacked through `engram admin`.

An attacker who can write a backup file (or the bucket it sits in) can recompute every digest
in it. What they cannot do is sign with the source core's ``backup.key``: restore verifies the
signature against the backup keys the operator names and refuses anything else, and even a
genuine backup's trusted host keys are trusted only when the operator asks for them.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from engram_core.api import admin_pb2
from engram_core.clock import SystemClock
from engram_core.contract.canonical import canonical_json, digest
from engram_core.contract.scope import Scope
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import create_private_key_file, key_id, public_pem
from engram_core.trust.signing import BACKUP_DOMAIN, CoreSigner
from tests.support.admin_support import TENANT, WORKSPACE, code_of, start_env

ENGRAM = str(Path(sys.executable).with_name("engram"))


def admin(env, *argv: str) -> subprocess.CompletedProcess:
    cmd = [ENGRAM, "admin", "--core", env.running.address, "--host-key", str(env.running.host_key_path), "--json"]
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=60)


@pytest.fixture
def source(tmp_path, stores):
    env = start_env(stores, tmp_path / "source", SystemClock())  # type: ignore[arg-type]
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def target(tmp_path, stores):
    env = start_env(stores, tmp_path / "target", SystemClock(), activate=False)  # type: ignore[arg-type]
    try:
        yield env
    finally:
        env.stop()


def _export_keys(env, out_dir: Path) -> Path:
    res = admin(env, "signing-keys", "--out-dir", str(out_dir))
    assert res.returncode == 0, res.stderr
    return out_dir / "backup.pub"


def _backup(env, out: Path) -> bytes:
    res = admin(env, "backup", "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out.read_bytes()


def _forge(data: bytes, extra: list[dict], *, resign: CoreSigner | None = None, drop_signature: bool = False) -> bytes:
    """What an attacker does: add lines, recompute every digest, keep (or replace) the signature."""
    lines = data.rstrip(b"\n").split(b"\n")
    manifest = json.loads(lines[-1])
    body = b"".join(line + b"\n" for line in lines[:-1]) + b"".join(canonical_json(e) + b"\n" for e in extra)
    counts = dict(manifest["counts"])
    for e in extra:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    manifest.update(counts=counts, items_sha256=hashlib.sha256(body).hexdigest(), bytes=len(body))
    signature = manifest.pop("signature")
    for k in ("kind", "manifest_digest"):
        manifest.pop(k)
    manifest["manifest_digest"] = digest("backup-manifest", manifest)
    if resign is not None:
        signature = resign.sign(manifest["manifest_digest"])
    if not drop_signature:
        manifest["signature"] = signature
    return body + canonical_json({"kind": "manifest", **manifest}) + b"\n"


def _as_host(env, key) -> list[tuple[str, bytes]]:
    ctx = make_context(key, call="admin", tenant="_host", workspace="_admin", principal="host:intruder", agent_id="x",
                       session="s",
                       now_ms=env.clock.now_ms(), host_principal=True, maintenance_scopes=("read", "maintain"),
                       memory_enabled=False)
    return [(CONTEXT_METADATA_KEY, ctx)]


def test_forged_trusted_host_key_line_is_refused(tmp_path, source, target):
    source.record("backed up decision")
    pub = _export_keys(source, tmp_path / "source-keys")
    data = _backup(source, tmp_path / "b.jsonl")
    attacker = create_private_key_file(tmp_path / "attacker.key")
    line = {"kind": "trusted_host_key", "key_id": key_id(attacker.public_key()),
            "public_key_pem": public_pem(attacker.public_key())}
    for name, forged in (("kept-signature", _forge(data, [line])),
                         ("unsigned", _forge(data, [line], drop_signature=True)),
                         ("self-signed", _forge(data, [line], resign=CoreSigner(attacker, BACKUP_DOMAIN)))):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(forged)
        res = admin(target, "restore", "--in", str(path), *source.restore_key_args(),
                    "--trust-backup-key", str(pub), "--restore-trusted-host-keys")
        assert res.returncode == 1, (name, res.stdout, res.stderr)
        out = json.loads(res.stdout)
        assert out["code"] == "RESTORE_REFUSED", name
        assert "sign" in out["detail"], name  # the operator is told why
    # Nothing was restored and the attacker's key signs nothing on the target.
    with pytest.raises(grpc.RpcError) as err:
        target.admin("Activate", admin_pb2.ActivateRequest(tenant=TENANT, workspace=WORKSPACE), md=_as_host(target, attacker))
    assert code_of(err.value) in ("TRUSTED_CONTEXT_UNAVAILABLE", "UNAUTHORIZED")
    assert not _scope_exists(target)


def _scope_exists(env) -> bool:
    with env.core.store.read() as tx:
        return tx.scope(Scope(TENANT, WORKSPACE)) is not None


def test_backup_of_another_core_needs_its_key_named(tmp_path, source, target):
    source.record("a record of the source core")
    other = start_env(source.stores, tmp_path / "other", SystemClock())  # type: ignore[arg-type]
    try:
        other.record("a record of some other core")
        other_pub = _export_keys(other, tmp_path / "other-keys")
        _backup(other, tmp_path / "other.jsonl")
    finally:
        other.stop()
    source_pub = _export_keys(source, tmp_path / "source-keys")
    # Signed by a real core, but not the one the operator named: refused, and stderr says so.
    res = subprocess.run([ENGRAM, "admin", "--core", target.running.address, "--host-key",
                          str(target.running.host_key_path), "restore", "--in", str(tmp_path / "other.jsonl"),
                          *other.restore_key_args(), "--trust-backup-key", str(source_pub)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "RESTORE_REFUSED" in res.stderr and "--trust-backup-key" in res.stderr
    assert not _scope_exists(target)
    # Named, it restores.
    ok = admin(target, "restore", "--in", str(tmp_path / "other.jsonl"), *other.restore_key_args(),
               "--trust-backup-key", str(other_pub))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["records_restored"] == 1


def test_valid_backup_restores_without_its_host_keys_unless_asked(tmp_path, source, target):
    rid = source.record("a record worth restoring")
    pub = _export_keys(source, tmp_path / "keys")
    _backup(source, tmp_path / "b.jsonl")
    source_host = source.key  # listed in the source's trusted host keys, so in the backup
    res = admin(target, "restore", "--in", str(tmp_path / "b.jsonl"), *source.restore_key_args(),
                "--trust-backup-key", str(pub))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["records_restored"] == 1 and out["trusted_host_keys_restored"] == 0
    assert out["trusted_host_keys_skipped"] >= 1
    assert target.get(rid)["record"]["record_id"] == rid
    # The source's host key is not trusted by the target: not in memory, and not after a restart.
    with pytest.raises(grpc.RpcError) as err:
        target.admin("KeyStatus", admin_pb2.ScopeRequest(), md=_as_host(target, source_host))
    assert code_of(err.value) == "TRUSTED_CONTEXT_UNAVAILABLE"
    with target.core.store.read() as tx:
        assert key_id(source_host.public_key()) not in {kid for kid, _ in tx.trusted_host_keys()}


def test_trusted_host_keys_restored_on_request(tmp_path, source, target):
    source.record("a record")
    globex = create_private_key_file(tmp_path / "globex.key")
    source.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(globex.public_key()),
                                                          tenants=["globex"], maintenance_scopes=["read"]))
    pub = _export_keys(source, tmp_path / "keys")
    _backup(source, tmp_path / "b.jsonl")
    res = admin(target, "restore", "--in", str(tmp_path / "b.jsonl"), *source.restore_key_args(),
                "--trust-backup-key", str(pub), "--restore-trusted-host-keys")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["trusted_host_keys_restored"] >= 2
    # A bound key comes back serving what it served: globex's reads globex, not the whole store.
    globex_scope = admin_pb2.HistoryRequest(tenant="globex", workspace=WORKSPACE)
    assert target.admin("History", globex_scope, md=_as_host(target, globex))["records"] == []
    with pytest.raises(grpc.RpcError) as err:
        target.admin("KeyStatus", admin_pb2.ScopeRequest(), md=_as_host(target, globex))
    assert code_of(err.value) == "UNAUTHORIZED"
    # The source's own host key served every tenant there as the operator's key, not by a binding:
    # it is trusted again but serves nothing until the target's operator binds it (issue 26.3).
    with pytest.raises(grpc.RpcError) as err:
        target.admin("KeyStatus", admin_pb2.ScopeRequest(), md=_as_host(target, source.key))
    assert code_of(err.value) == "UNAUTHORIZED"
    target.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(source.key.public_key()),
                                                          all_tenants=True, maintenance_scopes=["read"]))
    assert "vault" in target.admin("KeyStatus", admin_pb2.ScopeRequest(), md=_as_host(target, source.key))


def test_backup_files_are_owner_only(tmp_path, source):
    source.record("private enough")
    out = tmp_path / "b.jsonl"
    # A leftover partial file with a wide mode must not lend it to the new backup.
    partial = tmp_path / "b.jsonl.partial"
    partial.write_bytes(b"stale")
    partial.chmod(0o644)
    old = os.umask(0o022)
    try:
        _backup(source, out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not partial.exists()
    exported = tmp_path / "audit.jsonl"
    assert admin(source, "export", "audit", "--out", str(exported)).returncode == 0
    assert stat.S_IMODE(exported.stat().st_mode) == 0o600
