"""Helpers for the governance tests: a real core on a copy of the bundled policies with
edits (data.json config, replaced Rego files), and a host maintenance client over gRPC."""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.app.composition import RunningCore, default_policies_dir
from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.core_engines import EngineStores
from tests.support.core_support import activate, now_ms


def start_with_bundle(tmp_path: Path, stores: EngineStores, *, edit: Callable[[dict], None] | None = None,
                      files: dict[str, str | None] | None = None, scopes: tuple[tuple[str, str], ...] = (("acme", "alpha"),),
                      **kw: Any) -> RunningCore:
    """Start a core on a copy of policies/ with ``edit`` applied to data.engram.config and
    ``files`` (bundle-relative path -> Rego text, or None to delete it) written over the copy;
    activate ``scopes``. The core's store is on ``stores``' engine (the test's leg)."""
    bundle = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), bundle)
    data = json.loads((bundle / "data.json").read_text())
    if edit is not None:
        edit(data["engram"]["config"])
    (bundle / "data.json").write_text(json.dumps(data))
    for rel, text in (files or {}).items():
        if text is None:
            (bundle / rel).unlink()
        else:
            (bundle / rel).write_text(text)
    kw.setdefault("semantic", False)  # the lexical channel is enough here, and starts faster
    running = stores.start_core(tmp_path / "data", policies_dir=bundle, **kw)
    for tenant, workspace in scopes:
        activate(running, tenant, workspace)
    return running


def consent(*families: str, retain: bool = False) -> Callable[[dict], None]:
    def edit(cfg: dict) -> None:
        cfg["tenants"]["*"].update(consented_families=list(families), retain_allowed=retain)
    return edit


class Host:
    """A host maintenance principal calling AdminService."""

    def __init__(self, core: RunningCore) -> None:
        self.key = load_private_key_file(core.host_key_path)
        self.channel = grpc.insecure_channel(core.address)
        self.stub = admin_pb2_grpc.AdminServiceStub(self.channel)

    def md(self, call: str = "admin") -> list[tuple[str, bytes]]:
        ctx = make_context(self.key, call=call, tenant="_host", workspace="_admin", principal="host:operator",
                           agent_id="ops",
                           session="s", now_ms=now_ms(), host_principal=True, maintenance_scopes=("read", "maintain"),
                           memory_enabled=False)
        return [(CONTEXT_METADATA_KEY, ctx)]

    def call(self, rpc: str, request: Any) -> dict[str, Any]:
        return json.loads(getattr(self.stub, rpc)(request, metadata=self.md(), timeout=30).json)

    def history(self, record_id: str, tenant: str = "acme", workspace: str = "alpha") -> dict[str, Any]:
        return self.call("History", admin_pb2.HistoryRequest(tenant=tenant, workspace=workspace, record_id=record_id))

    def state(self, record_id: str, tenant: str = "acme", workspace: str = "alpha") -> str:
        return self.history(record_id, tenant, workspace)["records"][0]["state"]

    def transition(self, op: str, target: str, tenant: str = "acme", workspace: str = "alpha",
                   **kw: str) -> dict[str, Any]:
        return self.call("Transition", admin_pb2.TransitionRequest(
            tenant=tenant, workspace=workspace, operation=op, target=target, event_id=new_event_id(),
            reason_ref="reason:test", **kw))

    def adjudicate(self, candidate_id: str, decision: str = "accept") -> dict[str, Any]:
        return self.call("Adjudicate", admin_pb2.AdjudicateRequest(
            tenant="acme", workspace="alpha", candidate_id=candidate_id, decision=decision, reason_ref="reason:host",
            event_id=new_event_id()))

    def close(self) -> None:
        self.channel.close()


def new_event_id() -> str:
    return "evt_test_" + secrets.token_hex(10)
