"""Derivative rules when a source expires or loses trust, over gRPC (SPEC §5, §6; issue 18).
(Forget is proven through MCP in tests/mcp/test_mcp_derivatives.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_core.api import admin_pb2
from engram_core.contract.scope import Scope
from engram_core.contract.validation import format_instant
from engram_core.rpc.server import RunningCore
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, capture_args, now_ms
from tests.support.governance_support import Host, consent, start_with_bundle


@pytest.fixture
def env(tmp_path: Path, stores: EngineStores) -> Iterator[tuple[RunningCore, Client, Host]]:
    core = start_with_bundle(tmp_path, stores, edit=consent(retain=True), scopes=(("acme", "alpha"), ("globex", "alpha")))
    try:
        yield core, Client(core), Host(core)
    finally:
        core.stop()


def _remember(c: Client, text: str, *, source: str | None = None, **retention: str) -> str:
    args = capture_args(text)
    if source:
        args["payload"]["citations"][0]["source_ref"] = source
    if retention:
        args["payload"]["retention"] = retention
    out = c.admit(c.call("capture", args)["candidate_id"])["outcome"]
    assert out["status"] == "accepted", out
    return out["record_id"]


def test_trust_invalidating_a_source_invalidates_make_ineligible_derivatives(env) -> None:
    core, c, host = env
    source = _remember(c, "The build uses Bazel remote caching.")
    derived = _remember(c, "CI builds take four minutes because of remote caching.", source=source)
    retained_source = _remember(c, "Staging mirrors production weekly.", derivative_rule="retain")
    kept = _remember(c, "Load tests run on staging.", source=retained_source)

    out = host.transition("trust_invalidate", source)["receipt"]
    assert [(d["record_id"], d["to_state"]) for d in out["derivatives"]] == [(derived, "trust_invalid")]
    assert int(out["derivatives"][0]["cursor"]) == int(out["cursor"]) + 1
    assert host.state(derived) == "trust_invalid"
    assert [r["record"]["record_id"] for r in c.search("remote caching")["records"]] == []
    # The source's history shows what it caused.
    assert [e["target"] for e in host.history(source)["events"] if e.get("source") == source] == [derived]

    assert host.transition("trust_invalidate", retained_source)["receipt"]["derivatives"] == []
    assert host.state(kept) == "accepted_current"


def test_expiring_a_source_makes_its_derivatives_ineligible(env) -> None:
    core, c, host = env
    source = _remember(c, "The feature flag service is LaunchDarkly.",
                       expires_at=format_instant(now_ms() + 1500))
    derived = _remember(c, "Flags are evaluated server side via LaunchDarkly.", source=source)
    time.sleep(1.6)
    swept = host.call("ExpireSweep", admin_pb2.ScopeRequest(tenant="acme", workspace="alpha"))
    expired = swept["scopes"][0]["expired"]
    assert [e["record_id"] for e in expired] == [source]
    assert [d["record_id"] for d in expired[0]["derivatives"]] == [derived]
    assert host.state(derived) == "trust_invalid"


def test_a_citation_naming_a_record_of_another_tenant_links_nothing(env) -> None:
    core, c, host = env
    other = Client(core, tenant="globex")
    foreign = _remember(other, "Globex uses Kafka for events.")
    mine = _remember(c, "Acme cites an id it cannot see.", source=foreign)
    with core.core.store.read() as tx:
        assert tx.derivatives(Scope("globex", "alpha"), foreign) == []
        assert tx.derivatives(Scope("acme", "alpha"), foreign) == []
    host.transition("trust_invalidate", foreign, tenant="globex")
    assert host.state(mine) == "accepted_current"


def test_links_written_before_a_restart_still_reach_their_derivatives(tmp_path: Path, stores: EngineStores) -> None:
    """The store answers 'no links' for most records from memory (record_links.py); what it
    knows at open comes from the tables, so a restarted core still finds every derivative."""
    core = start_with_bundle(tmp_path, stores, edit=consent(retain=True))
    try:
        c = Client(core)
        source = _remember(c, "The release train leaves every Tuesday.")
        derived = _remember(c, "Hotfixes wait for the Tuesday release train.", source=source)
        lone = _remember(c, "The changelog is generated from commit messages.")
    finally:
        core.stop()
    (tmp_path / "policies").rename(tmp_path / "policies-first")
    core = start_with_bundle(tmp_path, stores, edit=consent(retain=True))
    try:
        host = Host(core)
        with core.core.store.read() as tx:
            assert [r.record_id for r in tx.derivatives(Scope("acme", "alpha"), source)] == [derived]
            assert tx.derivatives(Scope("acme", "alpha"), lone) == []
        out = host.transition("trust_invalidate", source)["receipt"]
        assert [(d["record_id"], d["to_state"]) for d in out["derivatives"]] == [(derived, "trust_invalid")]
        assert host.state(derived) == "trust_invalid"
    finally:
        core.stop()
