"""A scope whose projections an operator dropped answers PROJECTION_STALE, never an empty page,
until they are rebuilt, across a restart too (SPEC §3 "infrastructure failure never looks like an
empty success"; issue 18)."""

from __future__ import annotations

from pathlib import Path

from engram_core.api import admin_pb2
from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client
from tests.support.governance_support import Host, start_with_bundle


def test_invalidated_projections_are_stale_until_rebuilt_even_after_restart(tmp_path: Path, stores: EngineStores) -> None:
    core = start_with_bundle(tmp_path, stores, scopes=(("acme", "alpha"), ("acme", "beta")))
    c, beta, host = Client(core), Client(core, workspace="beta"), Host(core)
    rid = c.remember("Tracing uses OpenTelemetry collectors.")
    beta_id = beta.remember("Beta also uses OpenTelemetry.")
    host.call("InvalidateProjections", admin_pb2.ScopeRequest(tenant="acme", workspace="alpha"))
    assert c.fails("search", {"query": "OpenTelemetry", "purpose_ref": c.purpose_ref}) == Code.PROJECTION_STALE
    assert c.get(rid)["record"]["record_id"] == rid  # get reads no projection
    assert [r["record"]["record_id"] for r in beta.search("OpenTelemetry")["records"]] == [beta_id]
    host.close()
    core.stop()

    core = stores.start_core(tmp_path / "data", policies_dir=tmp_path / "policies", semantic=False)
    try:
        c, host = Client(core), Host(core)
        assert c.fails("search", {"query": "OpenTelemetry", "purpose_ref": c.purpose_ref}) == Code.PROJECTION_STALE
        host.call("RebuildProjections", admin_pb2.ScopeRequest(tenant="acme", workspace="alpha"))
        assert [r["record"]["record_id"] for r in c.search("OpenTelemetry")["records"]] == [rid]
    finally:
        core.stop()
