"""A trusted host key acts only for the tenants and maintenance scopes it is bound to (issue 26.3).

The attack: a second tenant's host holds a key the core trusts. Before bindings it signed
host-principal contexts with maintenance scopes for every tenant and read, changed and
exported them. Here a real core serves two tenants; globex's host key is trusted for globex
only, and everything it signs for acme is refused, through the agent path, the host calls
and AdminService, while it keeps working for globex. The data directory's own host.key and a
key named at `engram serve --trust-host-key` keep acting for every tenant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.api import admin_pb2, host_pb2, host_pb2_grpc, memory_pb2
from engram_core.clock import SystemClock
from engram_core.contract.scope import Scope
from engram_core.rpc.convert import value_to_message
from engram_core.trust.hostctx import (
    ADMIN_CALL,
    CONTEXT_METADATA_KEY,
    HOST_CALL,
    TOOLS_LIST_CALL,
    make_context,
)
from engram_core.trust.hostkeys import key_id, public_pem
from tests.support.admin_support import PURPOSE, TENANT, WORKSPACE, Env, code_of
from tests.support.core_engines import EngineStores

OTHER = "globex"
ENGRAM = str(Path(sys.executable).with_name("engram"))


class _AgentMd:
    """An agent's metadata signed by ``key``, its context signed for the call it is sent with."""

    def __init__(self, env: Env, key: Ed25519PrivateKey, tenant: str) -> None:
        self.env, self.key, self.tenant = env, key, tenant

    def for_call(self, call: str) -> list[tuple[str, bytes]]:
        return [(CONTEXT_METADATA_KEY, make_context(self.key, call=call, tenant=self.tenant, workspace=WORKSPACE,
                                                    principal="user:mallory", agent_id="a", session="s",
                                                    purpose_ref=PURPOSE, now_ms=self.env.clock.now_ms()))]


def _agent_md(env: Env, key: Ed25519PrivateKey, tenant: str) -> _AgentMd:
    return _AgentMd(env, key, tenant)


def _host_md(env: Env, key: Ed25519PrivateKey, tenant: str = "_host", workspace: str = "_admin",
             scopes: tuple[str, ...] = ("read", "maintain"), call: str = ADMIN_CALL) -> list[tuple[str, bytes]]:
    return [(CONTEXT_METADATA_KEY, make_context(key, call=call, tenant=tenant, workspace=workspace,
                                                principal="host:globex", agent_id="ops", session="s",
                                                now_ms=env.clock.now_ms(), host_principal=True,
                                                maintenance_scopes=scopes, memory_enabled=False))]


def _refused(call) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return code_of(err.value)


@pytest.fixture
def live(tmp_path: Path, stores: EngineStores):
    """A core on the system clock (the CLI signs with the real time)."""
    env = Env(stores, tmp_path / "live", SystemClock())  # type: ignore[arg-type]
    env.activate()
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def two_tenants(env: Env) -> tuple[Env, Ed25519PrivateKey, str]:
    return _two_tenants(env)


def _two_tenants(env: Env) -> tuple[Env, Ed25519PrivateKey, str]:
    """acme holds a record; globex's host key is trusted for globex with both maintenance scopes."""
    env.activate(OTHER, WORKSPACE)
    rid = env.record("acme decided to keep the billing ledger in the eu-west region")
    globex = Ed25519PrivateKey.generate()
    out = env.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(globex.public_key()),
                                                              tenants=[OTHER], maintenance_scopes=["maintain"]))
    assert out["binding"] == {"id": key_id(globex.public_key()), "local": False, "all_tenants": False,
                              "tenants": [OTHER], "maintenance_scopes": ["maintain"]}
    return env, globex, rid


def test_another_tenants_key_cannot_act_for_a_tenant_on_the_agent_path(two_tenants) -> None:
    env, globex, rid = two_tenants
    acme = lambda: _agent_md(env, globex, TENANT)  # noqa: E731 - a fresh context (nonce) per call
    lanes_before = env.core.context_nonces.lane_sizes()
    assert _refused(lambda: env.get(rid, md=acme())) == "UNAUTHORIZED"
    assert _refused(lambda: env.search("billing ledger", md=acme())) == "UNAUTHORIZED"
    capture = value_to_message(
        {"idempotency_key": "key-mallory-000001", "payload": {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": env.clock.now_ms() - 1000},
            "components": [{"component_id": "c1", "kind": "decision", "text": "acme moves billing to us-east",
                            "citation_ids": ["cit1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": env.clock.now_ms() - 1000, "type_ref": "event:decision", "citation_id": "cit1"},
            "citations": [{"citation_id": "cit1", "source_ref": "doc:x", "locator": {"scheme": "path", "value": "x"},
                           "content_digest": "sha256:" + "a" * 64}]},
         "evidence": {"evidence_ref": "ev:1", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]}},
        memory_pb2.CaptureRequest())
    assert _refused(lambda: env.memory_stub.Capture(capture, metadata=acme().for_call("engram_memory_capture"),
                                                    timeout=30)) == "UNAUTHORIZED"
    host = host_pb2_grpc.HostServiceStub(env.channel)
    assert list(host.ListCapabilities(host_pb2.ListCapabilitiesRequest(), metadata=acme().for_call(TOOLS_LIST_CALL),
                                      timeout=30).tools) == []
    # The refused calls' nonces were claimed in globex's own lane of the per-key ledger (issue 26.2):
    # the binding is decided after the claim, and no other key's lane changed.
    lanes = env.core.context_nonces.lane_sizes()
    globex_calls = (key_id(globex.public_key()), "calls")
    # get, search, capture and the listing (every call spends its context: issue 57)
    assert lanes.get(globex_calls, 0) - lanes_before.get(globex_calls, 0) == 4
    assert {k: v for k, v in lanes.items() if k[0] != globex_calls[0]} == \
        {k: v for k, v in lanes_before.items() if k[0] != globex_calls[0]}
    # The same key for its own tenant works; the operator's host.key still reads acme's record.
    assert env.search("billing ledger", md=_agent_md(env, globex, OTHER))["records"] == []
    assert len(host.ListCapabilities(host_pb2.ListCapabilitiesRequest(),
                                     metadata=_agent_md(env, globex, OTHER).for_call(TOOLS_LIST_CALL),
                                     timeout=30).tools) == 6
    assert env.get(rid)["record"]["record_id"] == rid
    with env.core.store.read() as tx:
        assert [c.candidate_id for c in tx.candidates_in_state(Scope(TENANT, WORKSPACE), "pending")] == []


def test_another_tenants_key_cannot_maintain_or_attest_a_tenant(two_tenants) -> None:
    env, globex, rid = two_tenants
    scope = dict(tenant=TENANT, workspace=WORKSPACE)
    acme_history = admin_pb2.HistoryRequest(**scope)
    export = admin_pb2.ExportRequest(**scope, what="journal")
    assert _refused(lambda: env.admin("History", acme_history, md=_host_md(env, globex))) == "UNAUTHORIZED"
    assert _refused(lambda: env.admin("Export", export, md=_host_md(env, globex))) == "UNAUTHORIZED"
    assert _refused(lambda: env.admin("Revoke", admin_pb2.ScopeRequest(**scope),
                                      md=_host_md(env, globex))) == "UNAUTHORIZED"
    tombstone = admin_pb2.TransitionRequest(**scope, operation="tombstone", target=rid,
                                            event_id="evt_mallory_tombstone_1", reason_ref="r:x")
    assert _refused(lambda: env.admin("Transition", tombstone, md=_host_md(env, globex))) == "UNAUTHORIZED"
    host = host_pb2_grpc.HostServiceStub(env.channel)
    attest = host_pb2.AttestRequest(**scope, target=rid, trust_class="earned", event_id="evt_mallory_attest_1",
                                    reason_ref="r:x")
    assert _refused(lambda: host.Attest(attest, metadata=_host_md(env, globex, call=HOST_CALL), timeout=30)) == "UNAUTHORIZED"
    # Signing the context in acme's own scope changes nothing: maintenance acts on the scope named.
    assert _refused(lambda: env.admin("History", acme_history,
                                      md=_host_md(env, globex, TENANT, WORKSPACE))) == "UNAUTHORIZED"
    # The whole store (every tenant's) is not globex's either, nor is widening its own trust.
    for rpc, request in (("RotateKeys", admin_pb2.ScopeRequest()), ("Verify", admin_pb2.ScopeRequest()),
                         ("Export", admin_pb2.ExportRequest(what="audit")), ("ListHostKeys", admin_pb2.ScopeRequest()),
                         ("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(globex.public_key()),
                                                                   all_tenants=True,
                                                                   maintenance_scopes=["maintain"]))):
        assert _refused(lambda rpc=rpc, request=request: env.admin(rpc, request, md=_host_md(env, globex))) \
            == "UNAUTHORIZED", rpc
    # Nothing of acme changed: the record is current, and no event was written for it by globex.
    history = env.admin("History", admin_pb2.HistoryRequest(**scope, record_id=rid))
    assert history["records"][0]["state"] == "accepted_current"
    assert [e["operation"] for e in history["events"]] == ["capture", "accept"]
    # For its own tenant the key maintains as bound.
    assert env.admin("History", admin_pb2.HistoryRequest(tenant=OTHER, workspace=WORKSPACE),
                     md=_host_md(env, globex))["records"] == []
    with env.core.store.read() as tx:
        rows = tx.audit_rows(None, 0, None)
    refusals = [r for r in rows if r["principal"] == "host:globex" and r["outcome"] == "UNAUTHORIZED"]
    assert refusals and all("HOST_KEY_NOT_BOUND" in r["decisions"][0]["reason_codes"] for r in refusals)


def test_maintenance_needs_the_scope_the_key_is_bound_to(env: Env) -> None:
    reader = Ed25519PrivateKey.generate()
    env.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(reader.public_key()),
                                                       tenants=[TENANT], maintenance_scopes=["read"]))
    history = admin_pb2.HistoryRequest(tenant=TENANT, workspace=WORKSPACE)
    assert env.admin("History", history, md=_host_md(env, reader))["records"] == []
    rid = env.record("a record the reader must not be able to forget")
    tombstone = admin_pb2.TransitionRequest(tenant=TENANT, workspace=WORKSPACE, operation="tombstone", target=rid,
                                            event_id="evt_reader_tombstone_1", reason_ref="r:x")
    assert _refused(lambda: env.admin("Transition", tombstone, md=_host_md(env, reader))) == "UNAUTHORIZED"
    # Re-binding (same key, new binding) takes effect at once; with no maintenance scope it reads nothing.
    env.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(reader.public_key()),
                                                       tenants=[TENANT]))
    assert _refused(lambda: env.admin("History", history, md=_host_md(env, reader))) == "UNAUTHORIZED"
    assert env.get(rid, md=_agent_md(env, reader, TENANT))["record"]["record_id"] == rid


def test_a_binding_must_name_what_it_serves(env: Env) -> None:
    pem = public_pem(Ed25519PrivateKey.generate().public_key())
    for request in (admin_pb2.HostKeyRequest(public_key_pem=pem),
                    admin_pb2.HostKeyRequest(public_key_pem=pem, tenants=[TENANT], all_tenants=True),
                    admin_pb2.HostKeyRequest(public_key_pem=pem, tenants=[TENANT], maintenance_scopes=["root"]),
                    admin_pb2.HostKeyRequest(public_key_pem=pem, tenants=[""]),
                    # The operator's own key is not narrowed: it serves every tenant.
                    admin_pb2.HostKeyRequest(public_key_pem=public_pem(env.key.public_key()), tenants=[TENANT])):
        assert _refused(lambda request=request: env.admin("TrustHostKey", request)) == "INVALID_SCHEMA"
    assert {k["id"] for k in env.admin("ListHostKeys", admin_pb2.ScopeRequest(), scopes=("read",))["host_keys"]} \
        == {key_id(env.key.public_key())}


def test_bindings_persist_and_a_key_stored_without_one_serves_nothing(tmp_path: Path, stores: EngineStores) -> None:
    data = tmp_path / "core"
    env = Env(stores, data, SystemClock())  # type: ignore[arg-type]
    env.activate()
    bound, unbound = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    env.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(bound.public_key()),
                                                       tenants=[TENANT]))
    with env.core.store.write() as tx:  # as migration 13 leaves a key trusted before bindings existed
        tx.add_trusted_host_key(key_id(unbound.public_key()), public_pem(unbound.public_key()), 1)
    env.stop()
    env = Env(stores, data, SystemClock())  # type: ignore[arg-type]
    try:
        rid = env.record("bindings survive a restart")
        assert env.get(rid, md=_agent_md(env, bound, TENANT))["record"]["record_id"] == rid
        assert _refused(lambda: env.get(rid, md=_agent_md(env, unbound, TENANT))) == "UNAUTHORIZED"
        listed = {k["id"]: k for k in env.admin("ListHostKeys", admin_pb2.ScopeRequest(), scopes=("read",))["host_keys"]}
        assert listed[key_id(bound.public_key())]["tenants"] == [TENANT]
        assert listed[key_id(unbound.public_key())] | {"added_at": None} == {
            "id": key_id(unbound.public_key()), "local": False, "all_tenants": False, "tenants": [],
            "maintenance_scopes": [], "stored": True, "added_at": None}
        assert listed[key_id(env.key.public_key())]["local"] is True
    finally:
        env.stop()


def test_a_key_named_at_serve_time_is_the_operators_own(tmp_path: Path, stores: EngineStores) -> None:
    operator = Ed25519PrivateKey.generate()
    running = stores.start_core(tmp_path / "core", extra_trusted_pems=[public_pem(operator.public_key())], semantic=False)
    try:
        channel = grpc.insecure_channel(running.address)
        clock = SystemClock()
        ctx = make_context(operator, call=ADMIN_CALL, tenant="any-tenant", workspace="w", principal="host:op", now_ms=clock.now_ms(),
                           host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False)
        from engram_core.api import admin_pb2_grpc

        stub = admin_pb2_grpc.AdminServiceStub(channel)
        out = json.loads(stub.Activate(admin_pb2.ActivateRequest(tenant="initech", workspace="w"),
                                       metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=30).json)
        assert out["activated"] is True
        channel.close()
    finally:
        running.stop()


def test_cli_binds_lists_and_refuses_an_unbound_trust(live: Env, tmp_path: Path) -> None:
    env, globex, _ = _two_tenants(live)
    pub = tmp_path / "initech.pub"
    initech = Ed25519PrivateKey.generate()
    pub.write_bytes(initech.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    base = [ENGRAM, "admin", "--core", env.running.address, "--host-key", str(env.running.host_key_path)]

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *argv], capture_output=True, text=True, timeout=60)

    refused = run("trust-host-key", "--public-key", str(pub))
    assert refused.returncode == 2 and "--tenant" in refused.stderr
    done = run("trust-host-key", "--public-key", str(pub), "--tenant", "initech", "--tenant", OTHER,
               "--maintenance-scope", "read")
    assert done.returncode == 0, done.stderr
    assert f"trusted for tenants {OTHER}, initech; maintenance scopes: read" in done.stdout
    listed = run("list-host-keys")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert f"tenants {OTHER}, initech; maintenance scopes: read" in lines[key_id(initech.public_key())]
    assert f"tenants {OTHER}; maintenance scopes: maintain" in lines[key_id(globex.public_key())]
    assert "every tenant, every maintenance scope" in lines[key_id(env.key.public_key())]
    as_json = json.loads(run("--json", "list-host-keys").stdout)
    assert {k["id"] for k in as_json["host_keys"]} == {key_id(k.public_key()) for k in (initech, globex, env.key)}


def test_doctor_says_the_key_serves_other_tenants(live: Env, tmp_path: Path) -> None:
    """A host TOML whose key the core trusts for globex only, bound to acme: doctor names the
    binding, not a scope that is not active."""
    from engram_core.trust.hostkeys import create_private_key_file

    live.activate(OTHER, WORKSPACE)
    key_path = tmp_path / "globex-host.key"
    globex = create_private_key_file(key_path)
    live.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=public_pem(globex.public_key()),
                                                        tenants=[OTHER]))
    config = tmp_path / "host.toml"

    def doctor(tenant: str) -> subprocess.CompletedProcess:
        config.write_text(f'[core]\naddress = "{live.running.address}"\n\n[host]\nsigning_key = "{key_path}"\n'
                          f'memory_enabled = true\n\n[binding]\ntenant = "{tenant}"\nworkspace = "{WORKSPACE}"\n'
                          f'principal = "user:ana"\nagent_id = "a"\nsession = "s"\npurpose_ref = "{PURPOSE}"\n')
        return subprocess.run([ENGRAM, "doctor", "--host-config", str(config)], capture_output=True, text=True,
                              timeout=60)

    refused = doctor(TENANT)
    assert refused.returncode == 1
    assert f"for other tenants, not {TENANT}" in refused.stdout and f"--tenant {TENANT}" in refused.stdout
    assert "the scope is not active" not in refused.stdout
    assert doctor(OTHER).returncode == 0


def test_migration_13_leaves_a_key_trusted_before_it_serving_nothing(tmp_path: Path) -> None:
    """A store at migration 12 with a trusted host key: after migration 13 the key is still trusted
    and serves nothing until it is bound (fail closed)."""
    import duckdb

    from engram_core.crypto.keyvault import FileKeyVault
    from engram_core.store.duckdb import open_duckdb_store
    from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS

    old = Ed25519PrivateKey.generate()
    con = duckdb.connect(str(tmp_path / "engram.duckdb"))
    con.execute(LEDGER_DDL)
    # SQL only: migration 10's step dates the key destructions recorded before it, and there are none.
    for m in MIGRATIONS[:12]:
        con.execute(m.sql)
        con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, ?)", [m.version, m.name, m.checksum, 0])
    con.execute("INSERT INTO trusted_host_keys VALUES (?, ?, ?)",
                [key_id(old.public_key()), public_pem(old.public_key()), 1])
    con.execute("CHECKPOINT")
    con.close()
    store = open_duckdb_store(tmp_path, keys=FileKeyVault(tmp_path))
    try:
        assert [row["version"] for row in store.migration_ledger()][-1] == 13
        with store.read() as tx:
            (row,) = tx.host_key_rows()
        assert (row.key_id, row.tenants, row.all_tenants, row.maintenance_scopes) == \
            (key_id(old.public_key()), (), False, ())
    finally:
        store.close()
