"""An agent-side gRPC client bound to a signed host context (what the MCP adapter does)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.operation import operation_digest
from engram_core.contract.tools import ADMISSION_TOOL, CAPTURE_TOOL, FORGET_TOOL, GET_TOOL, SEARCH_TOOL
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.trust.hostctx import (
    CONFIRMATION_METADATA_KEY,
    CONTEXT_METADATA_KEY,
    make_context,
    make_grant,
)
from engram_core.trust.hostkeys import load_private_key_file
from tools.bench.corpus import PURPOSE

_RPC = {
    "search": (memory_pb2.SearchRequest, "Search", SEARCH_TOOL),
    "get": (memory_pb2.GetRequest, "Get", GET_TOOL),
    "capture": (memory_pb2.CaptureRequest, "Capture", CAPTURE_TOOL),
    "request_admission": (memory_pb2.RequestAdmissionRequest, "RequestAdmission", ADMISSION_TOOL),
    "forget": (memory_pb2.ForgetRequest, "Forget", FORGET_TOOL),
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class GrpcAgent:
    def __init__(self, address: str, key_path: Path, *, tenant: str, workspace: str,
                 principal: str = "agent:bench", agent_id: str = "bench-agent", session: str = "bench") -> None:
        self.key = load_private_key_file(key_path)
        self.tenant, self.workspace, self.principal = tenant, workspace, principal
        self.agent_id, self.session = agent_id, session
        self.channel = grpc.insecure_channel(address)
        self.memory = memory_pb2_grpc.MemoryServiceStub(self.channel)

    def context(self, call: str) -> bytes:
        # One signed context per call, as the adapter does (each call its own audit id).
        return make_context(self.key, call=call, tenant=self.tenant, workspace=self.workspace, principal=self.principal,
                            agent_id=self.agent_id, session=self.session, purpose_ref=PURPOSE, now_ms=now_ms(),
                            memory_enabled=True)

    def call(self, op: str, args: dict[str, Any], *, confirm: bool = False, timeout: float = 30) -> dict[str, Any]:
        cls, method, tool = _RPC[op]
        metadata = [(CONTEXT_METADATA_KEY, self.context(tool))]
        if confirm:
            target = args.get("record_id") or args.get("candidate_id") or ""
            metadata.append((CONFIRMATION_METADATA_KEY, make_grant(
                self.key, tenant=self.tenant, workspace=self.workspace, principal=self.principal, tool=tool,
                target=target, operation_digest=operation_digest(tool=tool, tenant=self.tenant,
                                                                 workspace=self.workspace, principal=self.principal,
                                                                 arguments=args),
                approved_at_ms=now_ms())))
        reply = getattr(self.memory, method)(value_to_message(args, cls()), metadata=metadata, timeout=timeout)
        return message_to_value(reply)

    def close(self) -> None:
        self.channel.close()


def activate(address: str, key_path: Path, tenant: str, workspace: str) -> None:
    key = load_private_key_file(key_path)
    ctx = make_context(key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=now_ms(),
                       host_principal=True, maintenance_scopes=("read", "maintain"), memory_enabled=False)
    with grpc.insecure_channel(address) as ch:
        admin_pb2_grpc.AdminServiceStub(ch).Activate(
            admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace),
            metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=30)
