"""Helpers for core tests: an agent-side gRPC client bound to a signed host context,
capture arguments, scope activation. (Named uniquely: pytest imports test helpers by basename.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, host_pb2, host_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.errors import Code
from engram_core.contract.operation import operation_digest
from engram_core.contract.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    FORGET_TOOL,
    GET_TOOL,
    SEARCH_TOOL,
    WITHDRAW_TOOL,
)
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.server import RunningCore
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import (
    ADMIN_CALL,
    CONFIRMATION_METADATA_KEY,
    CONTEXT_METADATA_KEY,
    HOST_CALL,
    TOOLS_LIST_CALL,
    make_context,
    make_grant,
)
from engram_core.trust.hostkeys import load_private_key_file

PURPOSE = "purpose:engineering-notes"

_REQUESTS = {
    "search": (memory_pb2.SearchRequest, "Search"),
    "get": (memory_pb2.GetRequest, "Get"),
    "capture": (memory_pb2.CaptureRequest, "Capture"),
    "request_admission": (memory_pb2.RequestAdmissionRequest, "RequestAdmission"),
    "withdraw": (memory_pb2.WithdrawRequest, "Withdraw"),
    "forget": (memory_pb2.ForgetRequest, "Forget"),
}
_TOOL = {
    "search": SEARCH_TOOL, "get": GET_TOOL, "capture": CAPTURE_TOOL,
    "request_admission": ADMISSION_TOOL, "withdraw": WITHDRAW_TOOL,
    "forget": FORGET_TOOL,
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Failed(Exception):
    def __init__(self, code: Code, err: grpc.RpcError) -> None:
        super().__init__(code.value)
        self.code = code
        self.err = err


class Client:
    """An agent-side gRPC client bound to one host context (as the MCP adapter is)."""

    def __init__(self, core: RunningCore, *, tenant: str = "acme", workspace: str = "alpha",
                 principal: str = "user:ana", purpose_ref: str = PURPOSE, memory_enabled: bool = True,
                 key_path: Path | None = None) -> None:
        self.core = core
        self.key = load_private_key_file(key_path or core.host_key_path)
        self.tenant, self.workspace, self.principal = tenant, workspace, principal
        self.purpose_ref = purpose_ref
        self.memory_enabled = memory_enabled
        self.channel = grpc.insecure_channel(core.address)
        self.memory = memory_pb2_grpc.MemoryServiceStub(self.channel)
        self.host = host_pb2_grpc.HostServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)

    def context(self, op: str | None = None, **overrides: Any) -> bytes:
        """A signed context for ``op`` (a tool's short name: "search", ...), for a host call
        (``host_principal=True``: signed for "host"), or for the tool listing (neither)."""
        call = _TOOL[op] if op else HOST_CALL if overrides.get("host_principal") else TOOLS_LIST_CALL
        fields = dict(call=call, tenant=self.tenant, workspace=self.workspace, principal=self.principal,
                      agent_id="agent-7", session="s-1", purpose_ref=self.purpose_ref, now_ms=now_ms(),
                      memory_enabled=self.memory_enabled)
        fields.update(overrides)
        return make_context(self.key, **fields)

    def grant(self, op: str, args: dict[str, Any], **overrides: Any) -> bytes:
        tool = _TOOL[op]
        target = args.get("record_id") or args.get("candidate_id") or ""
        fields = dict(tenant=self.tenant, workspace=self.workspace, principal=self.principal, tool=tool, target=target,
                      operation_digest=operation_digest(tool=tool, tenant=self.tenant, workspace=self.workspace,
                                                        principal=self.principal, arguments=args),
                      approved_at_ms=now_ms())
        fields.update(overrides)
        return make_grant(self.key, **fields)

    def call(self, op: str, args: dict[str, Any], *, grant: bytes | None | bool = None,
             context: bytes | None | bool = True, timeout: float = 10) -> dict[str, Any]:
        cls, method = _REQUESTS[op]
        metadata = []
        if context is True:
            metadata.append((CONTEXT_METADATA_KEY, self.context(op)))
        elif context:
            metadata.append((CONTEXT_METADATA_KEY, context))
        if grant is True:
            grant = self.grant(op, args)
        if grant:
            metadata.append((CONFIRMATION_METADATA_KEY, grant))
        request = value_to_message(args, cls())
        try:
            return message_to_value(getattr(self.memory, method)(request, metadata=metadata, timeout=timeout))
        except grpc.RpcError as err:
            raise Failed(code_from_rpc_error(err), err) from None

    def fails(self, op: str, args: dict[str, Any], **kw: Any) -> Code:
        try:
            self.call(op, args, **kw)
        except Failed as f:
            return f.code
        raise AssertionError(f"{op} unexpectedly succeeded")

    def tools(self) -> list[str]:
        return list(self.host.ListCapabilities(host_pb2.ListCapabilitiesRequest(),
                                               metadata=[(CONTEXT_METADATA_KEY, self.context())]).tools)

    # convenience ------------------------------------------------------------------
    def capture(self, text: str = "We chose DuckDB as the store because it is embedded.", *, key: str | None = None,
                **payload_overrides: Any) -> dict[str, Any]:
        return self.call("capture", capture_args(text, key=key, purpose_ref=self.purpose_ref, **payload_overrides))

    def admit(self, candidate_id: str, key: str | None = None) -> dict[str, Any]:
        return self.call("request_admission", {"candidate_id": candidate_id,
                                               "idempotency_key": key or f"adm-{candidate_id}"[:200]})

    def remember(self, text: str, **kw: Any) -> str:
        cap = self.capture(text, **kw)
        out = self.admit(cap["candidate_id"])
        assert out["outcome"]["status"] == "accepted", out
        return out["outcome"]["record_id"]

    def search(self, query: str, **kw: Any) -> dict[str, Any]:
        return self.call("search", {"query": query, "purpose_ref": self.purpose_ref, **kw})

    def get(self, record_id: str) -> dict[str, Any]:
        return self.call("get", {"record_id": record_id, "purpose_ref": self.purpose_ref})


_counter = iter(range(10**9))


def capture_args(text: str, *, key: str | None = None, purpose_ref: str = PURPOSE, t: int | None = None,
                 **payload_overrides: Any) -> dict[str, Any]:
    t = now_ms() - 60_000 if t is None else t
    payload = {
        "schema_version": 2, "purpose_ref": purpose_ref, "valid_time": {"t": t},
        "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["cit1"]}],
        "primary_component_id": "c1",
        "primary_event": {"at": t, "type_ref": "event:decision", "citation_id": "cit1"},
        "citations": [{"citation_id": "cit1", "source_ref": "doc:adr-7",
                       "locator": {"scheme": "path", "value": "docs/adr/7.md"}, "content_digest": "sha256:" + "a" * 64}],
    }
    payload.update(payload_overrides)
    return {
        "idempotency_key": key or f"cap-key-{next(_counter):08d}-{now_ms()}",
        "payload": payload,
        "evidence": {"evidence_ref": "ev:1", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]},
    }


def activate(core: RunningCore, tenant: str = "acme", workspace: str = "alpha", tools: list[str] | None = None) -> None:
    key = load_private_key_file(core.host_key_path)
    ctx = make_context(key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=now_ms(),
                       host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False)
    with grpc.insecure_channel(core.address) as ch:
        admin_pb2_grpc.AdminServiceStub(ch).Activate(
            admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace, tools=tools or []),
            metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)
