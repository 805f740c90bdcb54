"""KEK generations (SPEC §10, docs/admin.md "Keys"): a destroyed data key's destruction is pending
until every generation that wrapped it retired, then complete; and the documented backup
procedure then brings nothing forgotten back, while key material kept beyond it can."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest
from admin_support import TENANT, WORKSPACE, code_of, start_env
from test_backup_restore import _backup, _restore, signing_public_pem_of

from engram_core.api import admin_pb2

DAY_MS = 86_400_000
KEY_FILES = ("store.kek", "datakeys.bin")  # what docs/admin.md says to copy after each rotation


def _copy_keys(data_dir: Path, to: Path) -> Path:
    to.mkdir(parents=True)
    for name in KEY_FILES:
        shutil.copy2(data_dir / name, to / name)
    return to


def _status(env) -> dict:
    return env.admin("KeyStatus", admin_pb2.ScopeRequest(tenant=TENANT, workspace=WORKSPACE), scopes=("read",))


def _destruction(env, record_id: str) -> str:
    [entry] = [r for r in _status(env)["scope"]["records"] if r["record_id"] == record_id]
    return entry["destruction"]


def _files_hold(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_the_documented_procedure_restores_nothing_forgotten_once_destruction_is_complete(tmp_path, clock, env):
    kept = env.record("ledger decision kept: the osprey migration runs on tuesdays")
    doomed = env.record("ledger decision to forget: the kestrel rotation plan")
    data = _backup(env)  # the data backup, and the key files copied as the docs say
    keys_at_backup = _copy_keys(env.data_dir, tmp_path / "keys-at-backup")
    env.transition("tombstone", doomed)
    assert _destruction(env, doomed) == "pending"  # zeroed here, but generation 1 is still in the ring

    rotated = env.admin("RotateKeys", admin_pb2.ScopeRequest())
    assert rotated["active_kek"] == 2 and rotated["rewrapped"] >= 1 and rotated["retired_keks"] == []
    assert _destruction(env, doomed) == "pending"  # generation 1 retained for the retention (24 h)
    clock.advance(DAY_MS + 60_000)
    assert env.admin("RetireKeys", admin_pb2.RetireKeysRequest())["retired_keks"] == [1]
    assert _destruction(env, doomed) == "complete"
    status = _status(env)
    assert [(g["generation"], g["state"]) for g in status["generations"]] == [(1, "retired"), (2, "active")]
    assert status["destructions_pending"] == 0

    # The docs: copy the key files again after a rotation, and delete the copies that hold a
    # retired generation. What is kept then is this copy only.
    keys_kept = _copy_keys(env.data_dir, tmp_path / "keys-after-rotation")
    trust = (signing_public_pem_of(str(env.data_dir)),)
    target = start_env(tmp_path / "restored", clock, activate=False)
    try:
        out = _restore(target, data, key_dir=str(keys_kept), trust=trust)
        assert out["records_restored"] == 1 and out["records_unrecoverable"] == [doomed]
        assert target.get(kept)["record"]["record_id"] == kept
        with pytest.raises(grpc.RpcError) as err:
            target.get(doomed)
        assert code_of(err.value) == "NOT_FOUND"
        assert target.search_ids("kestrel rotation plan") == []
    finally:
        target.stop()
    assert _files_hold(tmp_path / "restored", b"kestrel") == []

    # What docs/admin.md says plainly: key material kept beyond that (the copy made at backup
    # time still holds generation 1) brings the forgotten record back into a new store.
    elsewhere = start_env(tmp_path / "restored-with-an-old-copy", clock, activate=False)
    try:
        out = _restore(elsewhere, data, key_dir=str(keys_at_backup), trust=trust)
        assert doomed not in out["records_unrecoverable"]
        assert elsewhere.get(doomed)["record"]["record_id"] == doomed
    finally:
        elsewhere.stop()


def test_withdraw_reports_its_key_destruction_pending_until_the_generation_retires(env, clock):
    cid = env.capture("a draft the agent withdraws: the merlin note")
    out = env.transition("withdraw", cid)
    assert out["key_destruction"] == "pending"
    assert _status(env)["destructions_pending"] == 1
    env.admin("RotateKeys", admin_pb2.ScopeRequest())
    assert env.admin("RetireKeys", admin_pb2.RetireKeysRequest())["retired_keks"] == []  # retention not passed
    assert env.admin("RetireKeys", admin_pb2.RetireKeysRequest(now=True))["retired_keks"] == [1]  # the operator's call
    assert _status(env)["destructions_pending"] == 0


def test_the_schedule_rotates_and_retires_on_its_own(tmp_path, clock):
    from engram_core.services.keyring import KeyRingScheduler, KeySchedule

    env = start_env(tmp_path / "core", clock)
    try:
        rid = env.record("scheduled rotation keeps the bittern note readable")
        env.transition("tombstone", env.record("scheduled rotation shreds the dunlin note"))
        scheduler = KeyRingScheduler(env.core, KeySchedule(rotation_interval_ms=DAY_MS, retention_ms=DAY_MS))
        assert scheduler.tick() == {"retired": []}  # nothing due yet
        clock.advance(DAY_MS + 60_000)
        assert scheduler.tick()["rotated"]["active_generation"] == 2
        clock.advance(DAY_MS + 60_000)
        ticked = scheduler.tick()
        assert ticked["rotated"]["active_generation"] == 3 and ticked["retired"] == [1]
        assert _status(env)["destructions_pending"] == 0
        assert env.get(rid)["record"]["record_id"] == rid  # live keys followed every rotation
    finally:
        env.stop()
