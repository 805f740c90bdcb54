"""A bundle reload between a decision and its commit is POLICY_STALE; the retry re-decides (SPEC §5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from engram_core.app.composition import default_policies_dir
from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import ADMISSION
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate


class ReloadAfterAdmissionDecision(EmbeddedPolicyEngine):
    """The real embedded engine; once armed, it publishes a new revision right after an admission decision."""

    armed = False

    def decide(self, path: str, input: Any, *, timeout_s: float | None = None):
        decision = super().decide(path, input, timeout_s=timeout_s)
        if path == ADMISSION and self.armed:
            self.armed = False
            manifest = self._bundle_dir / ".manifest"
            manifest.write_text(json.dumps({"revision": "engram-policies-stale-2", "roots": ["engram"]}))
            self.reload()
        return decision


def test_reload_between_decision_and_commit_is_policy_stale(stores: EngineStores, tmp_path: Path) -> None:
    bundle = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    engine = ReloadAfterAdmissionDecision(bundle)
    engine.reload()
    running = stores.start_core(tmp_path / "data", policy=engine)
    try:
        activate(running)
        c = Client(running)
        cap = c.capture("Stale policy: decided under revision one, committed under two.")
        engine.armed = True
        args = {"candidate_id": cap["candidate_id"], "idempotency_key": "stale-admission-01"}
        assert c.fails("request_admission", args) == Code.POLICY_STALE
        with running.core.store.read() as tx:
            assert tx.candidate(Scope("acme", "alpha"), cap["candidate_id"]).state == "pending"
        retry = c.call("request_admission", args)
        assert retry["outcome"]["status"] == "accepted" and retry["replayed"] is False
    finally:
        running.stop()
