"""Helpers for the maintenance API tests: a real core over gRPC on tmp_path, its store on the
test's engine leg (``stores``: tests/support/core_engines.py).

Agents capture and admit through MemoryService exactly as the adapter would;
hosts call AdminService with signed host contexts. A settable clock lets the
expiry sweep and ranking be deterministic.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.app.composition import RunningCore
from engram_core.clock import FixedClock
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.core_engines import EngineStores

TENANT, WORKSPACE, PURPOSE = "acme", "main", "purpose:eng"


def capture_args(text: str, now_ms: int, *, key: str | None = None, expires_at: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": now_ms - 1000},
        "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["cit1"]}],
        "primary_component_id": "c1",
        "primary_event": {"at": now_ms, "type_ref": "event:decision", "citation_id": "cit1"},
        "citations": [{"citation_id": "cit1", "source_ref": "doc:adr-7",
                       "locator": {"scheme": "path", "value": "docs/adr/7.md"}, "content_digest": "sha256:" + "a" * 64}],
    }
    if expires_at:
        payload["retention"] = {"expires_at": expires_at}
    return {"idempotency_key": key or ("key-" + secrets.token_hex(8)), "payload": payload,
            "evidence": {"evidence_ref": "ev:1", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]}}


_TOOL_OF_RPC = {"Search": "engram_memory_search", "Get": "engram_memory_get", "Capture": "engram_memory_capture",
                "RequestAdmission": "engram_memory_request_admission", "Withdraw": "engram_memory_withdraw",
                "Forget": "engram_memory_forget"}


class AgentMd:
    """The metadata of an agent's call, its context signed for the call it is sent with."""

    def __init__(self, env: Any, tenant: str, workspace: str, epoch: int) -> None:
        self.env, self.tenant, self.workspace, self.epoch = env, tenant, workspace, epoch

    def for_call(self, call: str) -> list[tuple[str, bytes]]:
        ctx = make_context(self.env.key, call=call, tenant=self.tenant, workspace=self.workspace, principal="user:ana",
                           agent_id="a", session="s", purpose_ref=PURPOSE, now_ms=self.env.clock.now_ms(),
                           authorization_epoch=self.epoch)
        return [(CONTEXT_METADATA_KEY, ctx)]


class Env:
    """One running core and typed helpers for agents and hosts."""

    def __init__(self, stores: EngineStores, data_dir: Path, clock: FixedClock, *,
                 audit_devices: list[str] | None = None, **core_kw: Any) -> None:
        self.stores = stores
        self.data_dir = data_dir
        self.clock = clock
        self.running: RunningCore = stores.start_core(data_dir, clock=clock, audit_devices=audit_devices, **core_kw)
        self.key = load_private_key_file(self.running.host_key_path)
        self.channel = grpc.insecure_channel(self.running.address)
        self.admin_stub = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.memory_stub = memory_pb2_grpc.MemoryServiceStub(self.channel)

    @property
    def core(self):
        return self.running.core

    def stop(self) -> None:
        self.channel.close()
        self.running.stop()

    def restore_key_args(self, key_dir: Path | None = None) -> list[str]:
        """``engram admin restore``'s options naming this core's keys (``key_dir``: a copy of its
        key files instead of its own directory)."""
        return self.stores.restore_key_args(key_dir or self.data_dir, store_of=self.data_dir)

    @property
    def key_store(self) -> str:
        """A restore's ``key_store`` for this core's data keys ("" on DuckDB: its file vault)."""
        return self.stores.key_store(self.data_dir)

    # -- contexts ----------------------------------------------------------------------
    def host_md(self, scopes: tuple[str, ...] = ("read", "maintain"), key=None) -> list[tuple[str, bytes]]:
        ctx = make_context(key or self.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                           agent_id="ops", session="s", now_ms=self.clock.now_ms(), host_principal=True,
                           maintenance_scopes=scopes, memory_enabled=False)
        return [(CONTEXT_METADATA_KEY, ctx)]

    def agent_md(self, *, tenant: str = TENANT, workspace: str = WORKSPACE, epoch: int = 0) -> AgentMd:
        """An agent's context, signed when the call it is for is known (``for_call``)."""
        return AgentMd(self, tenant, workspace, epoch)

    # -- admin -----------------------------------------------------------------------------
    def admin(self, rpc: str, request, *, scopes: tuple[str, ...] = ("read", "maintain"), md=None) -> dict[str, Any]:
        if isinstance(md, AgentMd):
            md = md.for_call(ADMIN_CALL)
        result = getattr(self.admin_stub, rpc)(request, metadata=md or self.host_md(scopes), timeout=30)
        return json.loads(result.json)

    def transition(self, op: str, target: str, *, event_id: str | None = None, **kw: str) -> dict[str, Any]:
        req = admin_pb2.TransitionRequest(tenant=kw.pop("tenant", TENANT), workspace=kw.pop("workspace", WORKSPACE),
                                          operation=op, target=target, event_id=event_id or new_event_id(),
                                          reason_ref=kw.pop("reason_ref", "reason:test"), **kw)
        return self.admin("Transition", req)

    def scope_req(self, **kw: Any) -> admin_pb2.ScopeRequest:
        return admin_pb2.ScopeRequest(tenant=kw.pop("tenant", TENANT), workspace=kw.pop("workspace", WORKSPACE), **kw)

    def activate(self, tenant: str = TENANT, workspace: str = WORKSPACE) -> None:
        self.admin("Activate", admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace))

    # -- agent ---------------------------------------------------------------------------
    def _mem(self, rpc: str, args: dict[str, Any], req_cls, md=None) -> dict[str, Any]:
        md = (md or self.agent_md()).for_call(_TOOL_OF_RPC[rpc])
        resp = getattr(self.memory_stub, rpc)(value_to_message(args, req_cls()), metadata=md, timeout=30)
        return message_to_value(resp)

    def capture(self, text: str, **kw: Any) -> str:
        out = self._mem("Capture", capture_args(text, self.clock.now_ms(), **kw), memory_pb2.CaptureRequest)
        return out["candidate_id"]

    def admit(self, candidate_id: str) -> dict[str, Any]:
        return self._mem("RequestAdmission", {"candidate_id": candidate_id, "idempotency_key": "adm-" + secrets.token_hex(8)},
                         memory_pb2.RequestAdmissionRequest)["outcome"]

    def record(self, text: str, **kw: Any) -> str:
        outcome = self.admit(self.capture(text, **kw))
        assert outcome["status"] == "accepted", outcome
        return outcome["record_id"]

    def get(self, record_id: str, md=None) -> dict[str, Any]:
        return self._mem("Get", {"record_id": record_id, "purpose_ref": PURPOSE}, memory_pb2.GetRequest, md)

    def search(self, query: str, md=None) -> dict[str, Any]:
        return self._mem("Search", {"query": query, "purpose_ref": PURPOSE}, memory_pb2.SearchRequest, md)

    def search_ids(self, query: str) -> list[str]:
        return [r["record"]["record_id"] for r in self.search(query)["records"]]


def signing_public_pem(env: Env, role: str = "backup") -> str:
    """The core's backup (or anchor) public key, as an operator exports it (`engram admin signing-keys`)."""
    return env.admin("SigningKeys", admin_pb2.ScopeRequest(), scopes=("read",))[role]["public_key_pem"]


def new_event_id() -> str:
    return "evt_test_" + secrets.token_hex(10)


def code_of(err: grpc.RpcError) -> str:
    return code_from_rpc_error(err).value


def start_env(stores: EngineStores, data_dir: Path, clock: FixedClock, *, activate: bool = True) -> Env:
    env = Env(stores, data_dir, clock)
    if activate:
        env.activate()
    return env

