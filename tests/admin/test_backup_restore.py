"""Backup and restore (SPEC §10, §12): cursor-pinned, sealed, verified; forgotten stays forgotten."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from engram_core.api import admin_pb2, memory_pb2
from engram_core.trust.hostkeys import load_private_key_file, public_pem
from tests.support.admin_support import TENANT, WORKSPACE, capture_args, code_of, start_env


def signing_public_pem_of(data_dir: str) -> str:
    """The backup public key of the core on ``data_dir`` (what the operator exported earlier)."""
    return public_pem(load_private_key_file(Path(data_dir) / "backup.key").public_key())


def _backup(env) -> bytes:
    chunks = list(env.admin_stub.Backup(admin_pb2.ScopeRequest(), metadata=env.host_md(), timeout=30))
    data = b"".join(c.data for c in chunks)
    assert all(c.total_bytes == len(data) for c in chunks)
    return data


def _restore(env, data: bytes, key_dir: str = "", *, trust: tuple[str, ...] | None = None,
             host_keys: bool = False, key_store: str = "") -> dict:
    """Restore into ``env``, trusting the backup key of the core whose ``key_dir`` is named (the source);
    ``key_store``: the source's database its data keys are in (a PostgreSQL source, ``Env.key_store``)."""
    if trust is None:
        trust = (signing_public_pem_of(key_dir),) if key_dir else ()

    def stream():
        for i in range(0, max(len(data), 1), 4096):
            if i == 0:
                yield admin_pb2.BackupChunk(data=data[i:i + 4096], key_dir=key_dir, trusted_backup_key_pem=trust,
                                            restore_trusted_host_keys=host_keys, key_store=key_store)
            else:
                yield admin_pb2.BackupChunk(data=data[i:i + 4096])

    return json.loads(env.admin_stub.Restore(stream(), metadata=env.host_md(), timeout=60).json)


def test_backup_holds_no_candidate_content_and_no_key_material(env):
    env.record("admitted content alpha")
    env.capture("pending content that must never be backed up")
    data = _backup(env)
    lines = [json.loads(line) for line in data.splitlines()]
    kinds = {line["kind"] for line in lines}
    assert kinds >= {"header", "scope", "event", "record", "audit", "manifest"}
    assert "candidate" not in kinds and b"pending content" not in data and b"admitted content" not in data
    for wrapped in _wrapped_data_keys(env):
        assert wrapped not in data
    manifest = lines[-1]
    assert manifest["counts"]["record"] == 1 and manifest["manifest_digest"].startswith("sha256:")
    assert manifest["pins"] == [{"tenant": TENANT, "workspace": WORKSPACE, "cursor": "3"}]


def _wrapped_data_keys(env) -> list[bytes]:
    """The data keys as the source's vault holds them (wrapped): datakeys.bin's slots (DuckDB), or
    the vault_keys rows of its database (PostgreSQL)."""
    if env.stores.is_postgresql:
        with env.stores.sql(env.data_dir) as con:
            wrapped = [bytes(w) for (w,) in con.all("SELECT wrapped FROM vault_keys")]
    else:
        slots = (env.data_dir / "datakeys.bin").read_bytes()
        wrapped = [slots[i:i + 64] for i in range(0, len(slots), 64)]
    wrapped = [w for w in wrapped if w.strip(b"\0")]
    assert wrapped
    return wrapped


def test_restore_gives_identical_answers_and_forgotten_stays_unreadable(tmp_path, clock, env):
    kept = [env.record(f"service mesh decision number {i}") for i in range(3)]
    doomed = env.record("service mesh secret roadmap to forget")
    env.transition("dispute", kept[2])
    data = _backup(env)
    env.transition("tombstone", doomed)  # after the backup: its key is destroyed in the vault
    # The source's answers for every record that survives (same corpus on both sides).
    before_get = {rid: env.get(rid)["record"] for rid in kept[:2]}
    before_search = env.search("service mesh decision")["records"]

    target = start_env(env.stores, tmp_path / "restored", clock, activate=False)
    try:
        out = _restore(target, data, key_dir=str(env.data_dir), key_store=env.key_store)
        assert out["records_restored"] == 3 and out["records_unrecoverable"] == [doomed]
        assert {rid: target.get(rid)["record"] for rid in kept[:2]} == before_get
        after_search = target.search("service mesh decision")["records"]
        assert [(r["record"], r["score"], r["rank"]) for r in after_search] == \
               [(r["record"], r["score"], r["rank"]) for r in before_search]
        with pytest.raises(grpc.RpcError) as err:
            target.get(doomed)
        assert code_of(err.value) == "NOT_FOUND"
        assert doomed not in target.search_ids("secret roadmap")
        hist = target.admin("History", admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE, record_id=doomed))
        assert hist["records"][0]["state"] == "tombstoned" and hist["events"][-1]["reason_ref"] == "restore:data-key-destroyed"
        disputed = target.admin("History", admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE, disputed_only=True))
        assert [r["record_id"] for r in disputed["records"]] == [kept[2]]
        assert target.admin("Verify", admin_pb2.ScopeRequest())["ok"] is True
        # Re-capturing the forgotten content is caught by the restored tombstone ledger.
        assert target.admit(target.capture("service mesh secret roadmap to forget"))["status"] == "pending_adjudication"
        with pytest.raises(grpc.RpcError) as err:
            _restore(target, data, key_dir=str(env.data_dir), key_store=env.key_store)
        assert code_of(err.value) == "RESTORE_REFUSED"  # target no longer empty
    finally:
        target.stop()


def test_restore_verifies_everything(tmp_path, clock, env):
    rid = env.record("integrity matters")
    data = _backup(env)
    target = start_env(env.stores, tmp_path / "restored", clock, activate=False)
    try:
        tampered = data.replace(b'"to_state":"accepted_current"', b'"to_state":"historical"', 1)
        assert tampered != data
        with pytest.raises(grpc.RpcError) as err:
            _restore(target, tampered, key_dir=str(env.data_dir), key_store=env.key_store)
        assert code_of(err.value) == "BACKUP_INVALID"
        for bad in (data[:-20], b"not a backup\n", b""):
            with pytest.raises(grpc.RpcError) as err:
                _restore(target, bad, key_dir=str(env.data_dir), key_store=env.key_store)
            assert code_of(err.value) == "BACKUP_INVALID"
        # The target's own vault never held these keys: a mismatched store.
        source_key = (signing_public_pem_of(str(env.data_dir)),)
        with pytest.raises(grpc.RpcError) as err:
            _restore(target, data, trust=source_key)
        assert code_of(err.value) == "RESTORE_REFUSED"
        with pytest.raises(grpc.RpcError) as err:
            _restore(target, data, key_dir=str(tmp_path / "nowhere"), trust=source_key, key_store=env.key_store)
        assert code_of(err.value) == "RESTORE_REFUSED"
        # Nothing was written by the refused attempts: a valid restore still works.
        assert _restore(target, data, key_dir=str(env.data_dir), key_store=env.key_store)["records_restored"] == 1
        assert target.get(rid)["record"]["record_id"] == rid
    finally:
        target.stop()
    with pytest.raises(grpc.RpcError) as err:
        _restore(env, data, key_dir=str(env.data_dir), key_store=env.key_store)
    assert code_of(err.value) == "RESTORE_REFUSED"


def test_scope_backup_holds_one_scope_and_restores_it_identically(tmp_path, clock, env):
    kept = [env.record(f"scope backup decision number {i}") for i in range(2)]
    env.activate(TENANT, "other-ws")
    cid = env._mem("Capture", capture_args("another workspace's ledger entry", env.clock.now_ms()),
                   memory_pb2.CaptureRequest, env.agent_md(workspace="other-ws"))["candidate_id"]
    other = env._mem("RequestAdmission", {"candidate_id": cid, "idempotency_key": "adm-other-ws-000001"},
                     memory_pb2.RequestAdmissionRequest, env.agent_md(workspace="other-ws"))["outcome"]["record_id"]
    chunks = list(env.admin_stub.Backup(admin_pb2.ScopeRequest(tenant=TENANT, workspace=WORKSPACE),
                                        metadata=env.host_md(), timeout=30))
    data = b"".join(c.data for c in chunks)
    lines = [json.loads(line) for line in data.splitlines()]
    manifest = lines[-1]
    assert manifest["scope"] == {"tenant": TENANT, "workspace": WORKSPACE}
    assert {(s["tenant"], s["workspace"]) for s in lines if s["kind"] == "scope"} == {(TENANT, WORKSPACE)}
    assert not [line for line in lines if line["kind"] == "audit"]
    before = {rid: env.get(rid)["record"] for rid in kept}
    target = start_env(env.stores, tmp_path / "scope-restored", clock, activate=False)
    try:
        out = _restore(target, data, key_dir=str(env.data_dir), key_store=env.key_store)
        assert out["records_restored"] == 2
        assert {rid: target.get(rid)["record"] for rid in kept} == before
        assert target.admin("Verify", admin_pb2.ScopeRequest())["ok"] is True
        target.activate(TENANT, "other-ws")
        with pytest.raises(grpc.RpcError) as missing:
            target.get(other, md=target.agent_md(workspace="other-ws"))
        assert code_of(missing.value) == "NOT_FOUND"
    finally:
        target.stop()
    with pytest.raises(grpc.RpcError) as err:
        list(env.admin_stub.Backup(admin_pb2.ScopeRequest(tenant=TENANT), metadata=env.host_md(), timeout=30))
    assert code_of(err.value) == "INVALID_SCHEMA"


def _key_state(env) -> object:
    """What a key source holds that a restore reading it must leave as it is: the file vault's
    bytes (DuckDB), or the ring the database agreed on (vault_state, vault_rings: PostgreSQL)."""
    if env.stores.is_postgresql:
        with env.stores.sql(env.data_dir) as con:
            return (con.all("SELECT active_generation FROM vault_state"),
                    con.all("SELECT generation, canary FROM vault_rings ORDER BY generation"))
    return {name: (env.data_dir / name).read_bytes() for name in ("store.kek", "datakeys.bin")}


def test_a_restore_naming_the_wrong_key_directory_changes_nothing_in_the_key_store(tmp_path, clock, env):
    """A restore reads its key source and nothing else: pointed at the live store with another
    core's key directory (a ring further on than the store's), it is refused and the live store
    keeps serving, its ring as it was (it once took the other ring's generation as its own, and
    then no key could be made: every capture STORE_UNAVAILABLE)."""
    rid = env.record("a record of the live store")
    data = _backup(env)
    other = start_env(env.stores, tmp_path / "other", clock)
    try:
        for _ in range(2):
            other.admin("RotateKeys", admin_pb2.ScopeRequest())  # its ring at generation 3
    finally:
        other.stop()
    before = _key_state(env)
    target = start_env(env.stores, tmp_path / "restored", clock, activate=False)
    try:
        with pytest.raises(grpc.RpcError) as err:
            _restore(target, data, key_dir=str(tmp_path / "other"), trust=(signing_public_pem_of(str(env.data_dir)),),
                     key_store=env.key_store)
        assert code_of(err.value) == "RESTORE_REFUSED"
        with target.core.store.read() as tx:
            assert tx.is_empty()
    finally:
        target.stop()
    assert _key_state(env) == before
    assert env.get(rid)["record"]["record_id"] == rid
    assert env.admit(env.capture("the live store still makes keys"))["status"] == "accepted"
