"""A small agent-side gRPC client for tools (harness, benchmark): signed host context,
capture/admission/search/forget, and host-side activation and supersession."""

from __future__ import annotations

import time
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.clock import Clock
from engram_core.contract.operation import operation_digest
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.server import RunningCore
from engram_core.trust.hostctx import (
    CONFIRMATION_METADATA_KEY,
    CONTEXT_METADATA_KEY,
    make_context,
    make_grant,
)
from engram_core.trust.hostkeys import load_private_key_file

PURPOSE = "purpose:engineering-notes"
RETRIES = 4
TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
DAY_MS = 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_TOOL_OF_METHOD = {"Search": "engram_memory_search", "Get": "engram_memory_get", "Capture": "engram_memory_capture",
                   "RequestAdmission": "engram_memory_request_admission", "Withdraw": "engram_memory_withdraw",
                   "Forget": "engram_memory_forget"}


class Agent:
    """One agent in one host-bound session. ``clock``: where the host reads the time it signs
    contexts with (the core's clock when a harness replays a live capture at past instants)."""

    def __init__(self, core: RunningCore, tenant: str, workspace: str, principal: str = "user:harness", *,
                 session: str = "s-harness", clock: Clock | None = None) -> None:
        self.key = load_private_key_file(core.host_key_path)
        self.tenant, self.workspace, self.principal = tenant, workspace, principal
        self.session = session
        self.now_ms = clock.now_ms if clock is not None else now_ms
        self.channel = grpc.insecure_channel(core.address)
        self.memory = memory_pb2_grpc.MemoryServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def _ctx(self, call: str) -> bytes:
        return make_context(self.key, call=call, tenant=self.tenant, workspace=self.workspace, principal=self.principal,
                            agent_id="agent-harness", session=self.session, purpose_ref=PURPOSE, now_ms=self.now_ms(),
                            memory_enabled=True)

    def _host_ctx(self) -> bytes:
        return make_context(self.key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                            now_ms=self.now_ms(),
                            host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False)

    def call(self, method: str, cls: Any, args: dict[str, Any], grant: bytes | None = None) -> dict[str, Any]:
        """One call, retried as the contract says for a transient failure (a policy decision that
        timed out on a busy machine is POLICY_UNAVAILABLE): mutations with the same idempotency key
        and arguments, under a fresh context."""
        for attempt in range(RETRIES + 1):
            md = [(CONTEXT_METADATA_KEY, self._ctx(_TOOL_OF_METHOD[method]))]
            if grant:
                md.append((CONFIRMATION_METADATA_KEY, grant))
            try:
                return message_to_value(getattr(self.memory, method)(value_to_message(args, cls()), metadata=md,
                                                                     timeout=30))
            except grpc.RpcError as e:
                if attempt == RETRIES or e.code() not in TRANSIENT:  # type: ignore[attr-defined]
                    raise
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def activate(self) -> None:
        self.admin.Activate(admin_pb2.ActivateRequest(tenant=self.tenant, workspace=self.workspace, tools=[]),
                            metadata=[(CONTEXT_METADATA_KEY, self._host_ctx())], timeout=10)

    def remember(self, key: str, text: str, context: str, source_ref: str, *, t: int, kind: str = "decision") -> str:
        payload = {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": t},
            "components": [
                {"component_id": "c1", "kind": kind if kind in ("context", "decision", "evidence") else "decision",
                 "text": text, "citation_ids": ["cit1"]},
                {"component_id": "c2", "kind": "context", "text": context, "citation_ids": ["cit1"]},
            ],
            "primary_component_id": "c1",
            "primary_event": {"at": t, "type_ref": f"event:{kind}", "citation_id": "cit1"},
            "citations": [{"citation_id": "cit1", "source_ref": source_ref,
                           "locator": {"scheme": "ticket", "value": source_ref},
                           "content_digest": "sha256:" + "a" * 64}],
        }
        cap = self.call("Capture", memory_pb2.CaptureRequest, {
            "idempotency_key": f"harness-cap-{key}", "payload": payload,
            "evidence": {"evidence_ref": "ev:harness", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]}})
        out = self.call("RequestAdmission", memory_pb2.RequestAdmissionRequest,
                        {"candidate_id": cap["candidate_id"], "idempotency_key": f"harness-adm-{key}"})
        assert out["outcome"]["status"] == "accepted", out
        return out["outcome"]["record_id"]

    def remember_turn(self, key: str, text: str, source_ref: str, *, t: int) -> str:
        """One conversation turn as one memory: a single ``context`` component, one citation,
        ``valid_time.t`` ``t`` (the session's date for a chat log captured after the fact, the
        turn's own instant for an agent capturing as it goes)."""
        payload = {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": t},
            "components": [{"component_id": "c1", "kind": "context", "text": text, "citation_ids": ["cit1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": t, "type_ref": "event:turn", "citation_id": "cit1"},
            "citations": [{"citation_id": "cit1", "source_ref": source_ref,
                           "locator": {"scheme": "chat", "value": source_ref},
                           "content_digest": "sha256:" + "a" * 64}],
        }
        cap = self.call("Capture", memory_pb2.CaptureRequest, {
            "idempotency_key": f"harness-turn-{key}", "payload": payload,
            "evidence": {"evidence_ref": "ev:harness", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]}})
        out = self.call("RequestAdmission", memory_pb2.RequestAdmissionRequest,
                        {"candidate_id": cap["candidate_id"], "idempotency_key": f"harness-turn-adm-{key}"})
        assert out["outcome"]["status"] == "accepted", out
        return out["outcome"]["record_id"]

    def supersede(self, old: str, new: str) -> None:
        self.admin.Transition(admin_pb2.TransitionRequest(
            tenant=self.tenant, workspace=self.workspace, operation="supersede", target=old, successor=new,
            reason_ref="reason:superseded", event_id=f"harness-supersede-{old[4:30]}"),
            metadata=[(CONTEXT_METADATA_KEY, self._host_ctx())], timeout=10)

    def forget(self, record_id: str) -> None:
        args = {"record_id": record_id, "idempotency_key": f"harness-forget-{record_id[4:30]}",
                "reason_ref": "reason:user-request"}
        tool = "engram_memory_forget"
        grant = make_grant(self.key, tenant=self.tenant, workspace=self.workspace, principal=self.principal, tool=tool,
                           target=record_id, approved_at_ms=self.now_ms(),
                           operation_digest=operation_digest(tool=tool, tenant=self.tenant, workspace=self.workspace,
                                                             principal=self.principal, arguments=args))
        self.call("Forget", memory_pb2.ForgetRequest, args, grant=grant)

    def search(self, query: str, *, semantic: bool = False, limit: int = 10, **extra: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"query": query, "purpose_ref": PURPOSE, "limit": limit, **extra}
        if semantic:
            args["capability_policy"] = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
        return self.call("Search", memory_pb2.SearchRequest, args)
