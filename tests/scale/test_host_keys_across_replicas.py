"""Host-key trust changes reach every core (issue 28): two `engram serve --store` processes over
one database. A key trusted, re-bound or untrusted through core A is honoured, re-bound or
refused on core B by the next call B serves after A acknowledged the change, without B
restarting (the store's trust version, engram_core/services/host_trust.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, host_pb2
from engram_core.contract.errors import Code
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import create_private_key_file, key_id, load_private_key_file, public_pem
from tests.support.core_support import PURPOSE, Client, Failed, now_ms
from tests.support.pg_cluster import Database
from tests.support.replicas import Replica, serve_store


def _operator(replica: Replica) -> tuple[Any, bytes]:
    """Replica's AdminService stub and a context of the operator's own key (the key directory's host.key)."""
    client = Client(replica)  # type: ignore[arg-type]
    ctx = make_context(client.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=now_ms(), host_principal=True, maintenance_scopes=("read", "maintain"),
                       memory_enabled=False)
    return client.admin, ctx


def _admin(replica: Replica, method: str, request: Any) -> dict[str, Any]:
    stub, ctx = _operator(replica)
    return json.loads(getattr(stub, method)(request, metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10).json)


def _trust(replica: Replica, key_path: Path, *, tenants: list[str]) -> dict[str, Any]:
    pem = public_pem(load_private_key_file(key_path).public_key())
    return _admin(replica, "TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=pem, tenants=tenants))


def _refusal(client: Client, op: str, args: dict[str, Any]) -> tuple[Code, str]:
    """The code and the message a call is refused with (a refusal must not tell keys apart)."""
    try:
        client.call(op, args)
    except Failed as f:
        return f.code, f.err.details()
    raise AssertionError(f"{op} unexpectedly succeeded")


def _listing_refusal(client: Client) -> tuple[grpc.StatusCode, str]:
    """The tool listing shown a tool call's own context, which it leaves for that call to spend
    (issue 57), so its own read of the trust version decides."""
    try:
        client.host.ListCapabilities(host_pb2.ListCapabilitiesRequest(),
                                     metadata=[(CONTEXT_METADATA_KEY, client.context("search"))], timeout=10)
    except grpc.RpcError as err:
        return err.code(), err.details()
    raise AssertionError("the tool listing unexpectedly succeeded")


def _key_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.key"
    create_private_key_file(path)
    return path


def test_a_key_trusted_on_one_replica_is_honoured_and_once_untrusted_refused_on_the_other(
        replicas: tuple[Replica, Replica], tmp_path: Path) -> None:
    a, b = replicas
    host_key = _key_file(tmp_path, "platform")
    never = Client(b, key_path=_key_file(tmp_path, "stranger"))  # type: ignore[arg-type]
    on_b = Client(b, key_path=host_key)  # type: ignore[arg-type]
    search = {"query": "petrel runbook", "purpose_ref": PURPOSE}
    unknown = _refusal(never, "search", search)
    assert unknown[0] is Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert _refusal(on_b, "search", search) == unknown  # not trusted yet, anywhere
    # Trusted through A: B honours it at once (an unknown key id is looked up, never refused from
    # B's copy), for a call that spends its context and for the listing, which spends none.
    out = _trust(a, host_key, tenants=["acme"])
    assert out["key_id"] == key_id(load_private_key_file(host_key).public_key())
    assert on_b.search("petrel runbook")["records"] == []
    assert on_b.tools()
    rid = Client(a).remember("Trust across replicas: the petrel runbook.")  # type: ignore[arg-type]
    assert [r["record"]["record_id"] for r in on_b.search("petrel runbook")["records"]] == [rid]
    # Untrusted through A: B refuses the key's next context as it refuses one of a key never
    # trusted (same code, same message), whether the call spends its context or not.
    assert _admin(a, "UntrustHostKey", admin_pb2.HostKeyRequest(key_id=out["key_id"]))["removed"] is True
    assert _refusal(on_b, "search", search) == unknown
    assert _refusal(on_b, "get", {"record_id": rid, "purpose_ref": PURPOSE}) == unknown
    assert _listing_refusal(on_b) == _listing_refusal(never)
    assert Client(b).get(rid)["record"]["record_id"] == rid  # the operator's own key is untouched
    # Trusted again through B: A (whose own copy dropped it) honours it again.
    _trust(b, host_key, tenants=["acme"])
    assert Client(a, key_path=host_key).get(rid)["record"]["record_id"] == rid  # type: ignore[arg-type]
    for c in (never, on_b):
        c.channel.close()


def test_a_key_untrusted_on_one_replica_is_refused_on_another_that_loaded_it(
        replicas: tuple[Replica, Replica], pg_database: Database, tmp_path: Path) -> None:
    a, _ = replicas
    host_key = _key_file(tmp_path, "platform")
    out = _trust(a, host_key, tenants=["acme"])
    c = serve_store(pg_database.conninfo, a.key_dir, pg_database.env)  # its copy holds the key from its start
    try:
        on_c = Client(c, key_path=host_key)  # type: ignore[arg-type]
        never = Client(c, key_path=_key_file(tmp_path, "stranger"))  # type: ignore[arg-type]
        rid = Client(a).remember("Untrust across replicas: the gannet rota.")  # type: ignore[arg-type]
        assert on_c.get(rid)["record"]["record_id"] == rid
        assert on_c.tools()
        assert _admin(a, "UntrustHostKey", admin_pb2.HostKeyRequest(key_id=out["key_id"]))["removed"] is True
        get = {"record_id": rid, "purpose_ref": PURPOSE}
        unknown = _refusal(never, "get", get)
        assert unknown[0] is Code.TRUSTED_CONTEXT_UNAVAILABLE
        assert _refusal(on_c, "get", get) == unknown
        assert _listing_refusal(on_c) == _listing_refusal(never)
        for client in (on_c, never):
            client.channel.close()
    finally:
        c.stop()


def test_a_binding_narrowed_on_one_replica_is_refused_on_another_that_loaded_it(
        replicas: tuple[Replica, Replica], pg_database: Database, tmp_path: Path) -> None:
    a, _ = replicas
    host_key = _key_file(tmp_path, "platform")
    _trust(a, host_key, tenants=["acme"])
    c = serve_store(pg_database.conninfo, a.key_dir, pg_database.env)  # its copy: the key bound to acme
    try:
        on_a = Client(a, key_path=host_key)  # type: ignore[arg-type]
        on_c = Client(c, key_path=host_key)  # type: ignore[arg-type]
        rid = on_a.remember("Bindings across replicas: the shearwater rota.")
        assert on_c.get(rid)["record"]["record_id"] == rid
        # Re-bound through A to another tenant: the key no longer serves acme on A, nor on C.
        out = _trust(a, host_key, tenants=["globex"])
        assert out["binding"]["tenants"] == ["globex"]
        get = {"record_id": rid, "purpose_ref": PURPOSE}
        refused_on_a = _refusal(on_a, "get", get)
        assert refused_on_a[0] is not Code.TRUSTED_CONTEXT_UNAVAILABLE  # the key is trusted; its binding refuses
        assert _refusal(on_c, "get", get) == refused_on_a
        assert Client(c).get(rid)["record"]["record_id"] == rid  # type: ignore[arg-type]  # the operator's own key
        for client in (on_a, on_c):
            client.channel.close()
    finally:
        c.stop()
