"""KEK generations (SPEC §10, docs/admin.md "Keys"): a destroyed data key's destruction is pending
until every generation that wrapped it retired, then complete; and the documented backup
procedure then brings nothing forgotten back, while key material kept beyond it can."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest

from engram_core.api import admin_pb2
from tests.admin.test_backup_restore import _backup, _restore, signing_public_pem_of
from tests.support.admin_support import TENANT, WORKSPACE, code_of, start_env

DAY_MS = 86_400_000


def _copy_keys(env, to: Path) -> Path:
    """What docs/admin.md says to copy after each rotation: the key files ``store.kek`` and
    ``datakeys.bin`` (DuckDB); a PostgreSQL store keeps its data keys in the database, so of its
    key directory the ring ``store.kek``."""
    to.mkdir(parents=True)
    for name in ("store.kek",) if env.stores.is_postgresql else ("store.kek", "datakeys.bin"):
        shutil.copy2(env.data_dir / name, to / name)
    return to


def _status(env) -> dict:
    return env.admin("KeyStatus", admin_pb2.ScopeRequest(tenant=TENANT, workspace=WORKSPACE), scopes=("read",))


def _destruction(env, record_id: str) -> str:
    [entry] = [r for r in _status(env)["scope"]["records"] if r["record_id"] == record_id]
    return entry["destruction"]


def _files_hold(env, needle: bytes) -> list[str]:
    """The files of ``env``'s store holding ``needle``: its data directory's and, on PostgreSQL,
    its database's heap files and WAL (``EngineStores.blobs``)."""
    return [path for path, blob in env.stores.blobs(env.data_dir).items() if needle in blob]


def test_the_documented_procedure_restores_nothing_forgotten_once_destruction_is_complete(tmp_path, clock, env):
    kept = env.record("ledger decision kept: the osprey migration runs on tuesdays")
    doomed = env.record("ledger decision to forget: the kestrel rotation plan")
    data = _backup(env)  # the data backup, and the key files copied as the docs say
    keys_at_backup = _copy_keys(env, tmp_path / "keys-at-backup")
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
    keys_kept = _copy_keys(env, tmp_path / "keys-after-rotation")
    trust = (signing_public_pem_of(str(env.data_dir)),)
    target = start_env(env.stores, tmp_path / "restored", clock, activate=False)
    try:
        out = _restore(target, data, key_dir=str(keys_kept), trust=trust, key_store=env.key_store)
        assert out["records_restored"] == 1 and out["records_unrecoverable"] == [doomed]
        assert target.get(kept)["record"]["record_id"] == kept
        with pytest.raises(grpc.RpcError) as err:
            target.get(doomed)
        assert code_of(err.value) == "NOT_FOUND"
        assert target.search_ids("kestrel rotation plan") == []
    finally:
        target.stop()
    assert _files_hold(target, b"kestrel") == []

    elsewhere = start_env(env.stores, tmp_path / "restored-with-an-old-copy", clock, activate=False)
    try:
        if env.stores.is_postgresql:
            # The ring copied at backup time is behind the live store's (generation 2 wraps its
            # keys now), and the forgotten key's row left the database at the forget: the old copy
            # does not match the key store (RESTORE_REFUSED, never a retry-later), and nothing is
            # written. Only a database copy taken before the forget could bring it back
            # (docs/admin.md, "A backup of a PostgreSQL store").
            with pytest.raises(grpc.RpcError) as err:
                _restore(elsewhere, data, key_dir=str(keys_at_backup), trust=trust, key_store=env.key_store)
            assert code_of(err.value) == "RESTORE_REFUSED"
            with elsewhere.core.store.read() as tx:
                assert tx.is_empty()
        else:
            # What docs/admin.md says plainly: key material kept beyond that (the copy made at
            # backup time still holds generation 1) brings the forgotten record back into a new store.
            out = _restore(elsewhere, data, key_dir=str(keys_at_backup), trust=trust, key_store=env.key_store)
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


def test_the_schedule_rotates_and_retires_on_its_own(tmp_path, clock, stores):
    from engram_core.services.keyring import KeyRingScheduler, KeySchedule

    env = start_env(stores, tmp_path / "core", clock)
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
