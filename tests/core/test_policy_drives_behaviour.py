"""Changing only policies/ changes service behaviour, with no Python change (issue 4 item 8)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engram_core.app.composition import RunningCore, default_policies_dir
from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate, capture_args, now_ms

Edit = Callable[[dict], None]


@pytest.fixture
def core_with(stores: EngineStores, tmp_path: Path) -> Iterator[Callable[[Edit], RunningCore]]:
    started: list[RunningCore] = []

    def start(edit: Edit) -> RunningCore:
        bundle = tmp_path / "policies"
        shutil.copytree(default_policies_dir(), bundle)
        data = json.loads((bundle / "data.json").read_text())
        edit(data["engram"]["config"])
        (bundle / "data.json").write_text(json.dumps(data))
        running = stores.start_core(tmp_path / "data", policies_dir=bundle)
        started.append(running)
        activate(running)
        return running

    yield start
    for r in started:
        r.stop()


def _tenant(cfg: dict) -> dict:
    return cfg["tenants"]["*"]


def test_tightening_admission_sends_candidates_to_adjudication(core_with) -> None:
    core = core_with(lambda c: _tenant(c).update(adjudication_trust_classes=["asserted"]))
    c = Client(core)
    cap = c.capture("Policy-driven: asserted candidates need a human look.")
    assert c.admit(cap["candidate_id"])["outcome"]["status"] == "pending_adjudication"


def test_changing_the_tool_grant_changes_the_tool_list(core_with) -> None:
    core = core_with(lambda c: c.update(agent_tools=["engram_memory_get", "engram_memory_search"]))
    c = Client(core)
    assert sorted(c.tools()) == ["engram_memory_get", "engram_memory_search"]
    assert c.fails("capture", capture_args("Not granted any more.")) == Code.UNAUTHORIZED


def test_lowering_the_expiry_cap_refuses_longer_expiry(core_with) -> None:
    from engram_core.contract.validation import format_instant

    core = core_with(lambda c: _tenant(c).update(expiry_cap_ms=60_000))
    c = Client(core)
    two_minutes = format_instant(now_ms() + 120_000)
    assert c.fails("capture", capture_args("Expiry cap.", retention={"expires_at": two_minutes})) == Code.UNAUTHORIZED
    thirty_s = format_instant(now_ms() + 30_000)
    assert c.call("capture", capture_args("Expiry cap ok.", retention={"expires_at": thirty_s}))["status"] == \
        "committed_pending"


def test_allowing_retain_and_families_by_data(core_with) -> None:
    core = core_with(lambda c: _tenant(c).update(retain_allowed=True, consented_families=["family:adr"]))
    c = Client(core)
    args = capture_args("Retained, in a consented family.", retention={"derivative_rule": "retain"},
                        reconciliation={"family_refs": ["family:adr"]})
    assert c.call("capture", args)["status"] == "committed_pending"


def test_requiring_confirmation_for_capture(core_with) -> None:
    core = core_with(lambda c: _tenant(c).update(confirmation_required_tools=["engram_memory_capture"]))
    c = Client(core)
    args = capture_args("Capture needs a human approval here.")
    assert c.fails("capture", args) == Code.TRUSTED_CONTEXT_UNAVAILABLE
    assert c.call("capture", args, grant=True)["status"] == "committed_pending"


def test_policy_reload_changes_behaviour_and_receipts_carry_revision(core_with, tmp_path: Path) -> None:
    core = core_with(lambda c: None)
    c = Client(core)
    cap = c.capture("Reload: first admission under revision one.")
    assert c.admit(cap["candidate_id"])["outcome"]["status"] == "accepted"
    bundle = tmp_path / "policies"
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["tenants"]["*"]["adjudication_trust_classes"] = ["asserted"]
    (bundle / "data.json").write_text(json.dumps(data))
    (bundle / ".manifest").write_text(json.dumps({"revision": "engram-policies-test-2", "roots": ["engram"]}))
    assert core.core.policy.reload() == "engram-policies-test-2"
    cap2 = c.capture("Reload: second admission under revision two.")
    assert c.admit(cap2["candidate_id"])["outcome"]["status"] == "pending_adjudication"
    with core.core.store.read() as tx:
        rows = tx.audit_rows(None, 0, None)
    revisions = {d["revision"] for r in rows for d in r["decisions"]}
    assert {"engram-policies-1", "engram-policies-test-2"} <= revisions


def test_broken_bundle_fails_closed_and_health_not_serving(stores: EngineStores, tmp_path: Path) -> None:
    bundle = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    (bundle / "engram" / "authz" / "authz.rego").write_text("package engram.authz\n\nthis is not rego\n")
    running = stores.start_core(tmp_path / "data", policies_dir=bundle)
    try:
        from engram_core.api import host_pb2

        c = Client(running)
        assert c.host.Health(host_pb2.HealthRequest()).status == "NOT_SERVING"
        assert c.fails("search", {"query": "x", "purpose_ref": c.purpose_ref}) == Code.POLICY_UNAVAILABLE
    finally:
        running.stop()
