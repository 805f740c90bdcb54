"""KEK rotation, key destruction status, revocation epochs and trusted host keys (SPEC §10, §12)."""

from __future__ import annotations

import json

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.api import admin_pb2
from engram_core.contract.scope import Scope
from engram_core.trust.hostkeys import key_id, public_pem
from tests.support.admin_support import TENANT, WORKSPACE, code_of


def _bodies(env) -> dict[str, bytes]:
    with env.core.store.read() as tx:
        return {r.record_id: r.sealed_body for r in tx.scope_records(Scope(TENANT, WORKSPACE))}


def test_rotation_rewraps_every_data_key_and_touches_no_body(env):
    ids = [env.record(f"rotation record {i}") for i in range(3)]
    env.capture("a pending candidate keeps its key too")
    before = _bodies(env)
    answers = {rid: env.get(rid)["record"] for rid in ids}
    kek_before = json.loads((env.data_dir / "store.kek").read_text())
    out = env.admin("RotateKeys", admin_pb2.ScopeRequest())
    assert out["rewrapped"] == out["live_data_keys"] == 4 and out["bodies_rewritten"] == 0
    assert out["active_kek"] == kek_before["active"] + 1
    # The generation before stays in the ring, unwrapping only, for --key-retention (copies of the
    # key files made under it still restore); retire-keys --now retires it at once.
    assert out["retired_keks"] == []
    kek_after = json.loads((env.data_dir / "store.kek").read_text())
    assert sorted(kek_after["generations"]) == sorted([str(kek_before["active"]), str(out["active_kek"])])
    assert _bodies(env) == before
    assert {rid: env.get(rid)["record"] for rid in ids} == answers
    assert env.admin("RetireKeys", admin_pb2.RetireKeysRequest(now=True))["retired_keks"] == [kek_before["active"]]
    assert list(json.loads((env.data_dir / "store.kek").read_text())["generations"]) == [str(out["active_kek"])]
    assert {rid: env.get(rid)["record"] for rid in ids} == answers


def test_key_status_reports_live_and_destroyed_keys(env):
    keep, gone = env.record("key stays"), env.record("key goes")
    env.transition("tombstone", gone)
    status = env.admin("KeyStatus", env.scope_req())
    keys = {r["record_id"]: r for r in status["scope"]["records"]}
    assert keys[keep]["key"] == "live"
    assert keys[gone]["key"] == "destroyed" and "destroyed_at" in keys[gone]
    assert status["vault"]["active_kek"] == 1 and status["destroyed_data_keys"] >= 2  # candidate keys too


def test_revoke_bumps_epoch_and_refuses_older_contexts(env):
    rid = env.record("revocation target")
    assert env.admin("Revoke", env.scope_req())["authorization_epoch"] == 1
    with pytest.raises(grpc.RpcError) as err:
        env.get(rid)
    assert code_of(err.value) == "AUTHORIZATION_REVOKED"
    assert env.get(rid, md=env.agent_md(epoch=1))["record"]["record_id"] == rid
    # Other scopes are untouched.
    env.activate("globex", WORKSPACE)
    env.search("anything", md=env.agent_md(tenant="globex"))


def test_trusting_and_untrusting_a_host_key_takes_effect_live_and_persists(env):
    other = Ed25519PrivateKey.generate()
    history = admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE)
    with pytest.raises(grpc.RpcError) as err:
        env.admin("History", history, md=env.host_md(key=other))
    assert code_of(err.value) == "TRUSTED_CONTEXT_UNAVAILABLE"
    pem = public_pem(other.public_key())
    out = env.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=pem, all_tenants=True,
                                                              maintenance_scopes=["maintain"]))
    assert out == {"key_id": key_id(other.public_key()), "trusted": True,
                   "binding": {"id": key_id(other.public_key()), "local": False, "all_tenants": True,
                               "tenants": [], "maintenance_scopes": ["maintain"]}}
    assert env.admin("History", history, md=env.host_md(key=other))["records"] == []
    with env.core.store.read() as tx:
        assert out["key_id"] in dict(tx.trusted_host_keys())
    with pytest.raises(grpc.RpcError) as err:
        env.admin("UntrustHostKey", admin_pb2.HostKeyRequest(key_id=out["key_id"]), md=env.host_md(key=other))
    assert code_of(err.value) == "INVALID_SCHEMA"  # never the key signing the call
    assert env.admin("UntrustHostKey", admin_pb2.HostKeyRequest(key_id=out["key_id"]))["removed"] is True
    with pytest.raises(grpc.RpcError) as err:
        env.admin("History", history, md=env.host_md(key=other))
    assert code_of(err.value) == "TRUSTED_CONTEXT_UNAVAILABLE"
    with env.core.store.read() as tx:
        assert out["key_id"] not in dict(tx.trusted_host_keys())
    with pytest.raises(grpc.RpcError) as err:
        env.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem="not a key"))
    assert code_of(err.value) == "INVALID_SCHEMA"
