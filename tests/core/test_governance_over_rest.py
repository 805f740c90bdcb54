"""Reconciliation and quotas through the REST policy backend (an OPA-REST-compatible server over
the same bundle): the new decision shapes travel over OPA's Data API as they do embedded (issue 18)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engram_core.app.composition import default_policies_dir
from engram_core.contract.errors import Code
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate, capture_args, now_ms
from tests.support.governance_support import Host
from tests.support.opa_rest_server import OpaRestTestServer


def test_reconciliation_and_rate_limits_over_the_rest_backend(stores: EngineStores, tmp_path: Path) -> None:
    bundle = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["tenants"]["*"].update(consented_families=["family:queue"],
                                                    quotas={"principal": {"minute": {"captures": 3}}})
    (bundle / "data.json").write_text(json.dumps(data))
    with OpaRestTestServer(bundle) as server:
        core = stores.start_core(tmp_path / "data", opa_url=server.url, semantic=False)
        try:
            activate(core)
            c, host = Client(core), Host(core)
            family = {"family_refs": ["family:queue"]}
            old = c.admit(c.call("capture", capture_args("Jobs go through RabbitMQ.", t=now_ms() - 60_000,
                                                         reconciliation=family))["candidate_id"])["outcome"]
            new = c.admit(c.call("capture", capture_args("Jobs go through NATS now.", t=now_ms() - 1_000,
                                                         reconciliation=family))["candidate_id"])["outcome"]
            assert host.state(old["record_id"]) == "historical"
            assert host.history(old["record_id"])["records"][0]["successor_id"] == new["record_id"]
            c.capture("Third capture of this minute.")
            assert c.fails("capture", capture_args("Fourth capture of this minute.")) == Code.RATE_LIMITED
            assert Client(core, principal="user:bo").capture("Another principal.")["status"] == "committed_pending"
        finally:
            core.stop()
