"""Helpers for search tests: an agent-side gRPC client bound to a signed host context
(signed at the core's clock, so tests can move time), capture arguments, activation.
(Named uniquely: pytest imports test helpers by basename.)

Each memory ``Client.remember`` captures is captured in a host-bound session of its own unless
the test names one (``session=``): records of one session captured close together are search
neighbours (profile v4, docs/search.md "Neighbours"), and a test about packets or paging should
not get its notes' neighbours in its answers without asking for them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.clock import Clock, SystemClock
from engram_core.contract.errors import Code
from engram_core.contract.operation import operation_digest
from engram_core.contract.tools import FORGET_TOOL
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.server import RunningCore
from engram_core.rpc.status import code_from_rpc_error
from engram_core.trust.hostctx import (
    CONFIRMATION_METADATA_KEY,
    CONTEXT_METADATA_KEY,
    make_context,
    make_grant,
)
from engram_core.trust.hostkeys import load_private_key_file

PURPOSE = "purpose:engineering-notes"
SEMANTIC = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}

_REQUESTS = {
    "search": (memory_pb2.SearchRequest, "Search"),
    "get": (memory_pb2.GetRequest, "Get"),
    "capture": (memory_pb2.CaptureRequest, "Capture"),
    "request_admission": (memory_pb2.RequestAdmissionRequest, "RequestAdmission"),
    "forget": (memory_pb2.ForgetRequest, "Forget"),
}
_TOOL = {op: "engram_memory_" + op for op in _REQUESTS}


class Failed(Exception):
    def __init__(self, code: Code) -> None:
        super().__init__(code.value)
        self.code = code


_counter = iter(range(10**9))


class Client:
    """An agent-side client bound to one host context, as the MCP adapter is."""

    def __init__(self, core: RunningCore, *, tenant: str = "acme", workspace: str = "alpha",
                 principal: str = "user:ana", purpose_ref: str = PURPOSE, clock: Clock | None = None,
                 key_path: Path | None = None) -> None:
        self.core = core
        self.clock = clock or SystemClock()
        self.key = load_private_key_file(key_path or core.host_key_path)
        self.tenant, self.workspace, self.principal, self.purpose_ref = tenant, workspace, principal, purpose_ref
        self.channel = grpc.insecure_channel(core.address)
        self.memory = memory_pb2_grpc.MemoryServiceStub(self.channel)

    def context(self, op: str, session: str = "s-1") -> bytes:
        return make_context(self.key, call=_TOOL[op], tenant=self.tenant, workspace=self.workspace,
                            principal=self.principal,
                            agent_id="agent-7", session=session, purpose_ref=self.purpose_ref,
                            now_ms=self.clock.now_ms(), memory_enabled=True)

    def call(self, op: str, args: dict[str, Any], *, grant: bytes | None = None,
             session: str = "s-1") -> dict[str, Any]:
        cls, method = _REQUESTS[op]
        metadata = [(CONTEXT_METADATA_KEY, self.context(op, session))]
        if grant:
            metadata.append((CONFIRMATION_METADATA_KEY, grant))
        try:
            return message_to_value(getattr(self.memory, method)(value_to_message(args, cls()), metadata=metadata,
                                                                  timeout=30))
        except grpc.RpcError as err:
            raise Failed(code_from_rpc_error(err)) from None

    def fails(self, op: str, args: dict[str, Any]) -> Code:
        try:
            self.call(op, args)
        except Failed as f:
            return f.code
        raise AssertionError(f"{op} unexpectedly succeeded")

    def remember(self, text: str, *, session: str | None = None, **payload: Any) -> str:
        """Capture and admit one memory; in ``session``, else in a session of its own (see above)."""
        cap = self.call("capture", capture_args(text, purpose_ref=self.purpose_ref, t=payload.pop("t", None),
                                                now=self.clock.now_ms(), **payload),
                        session=session or f"s-own-{next(_counter)}")
        out = self.call("request_admission", {"candidate_id": cap["candidate_id"],
                                              "idempotency_key": f"adm-{cap['candidate_id']}"[:200]})
        assert out["outcome"]["status"] == "accepted", out
        return out["outcome"]["record_id"]

    def capture_only(self, text: str) -> dict[str, Any]:
        return self.call("capture", capture_args(text, purpose_ref=self.purpose_ref, now=self.clock.now_ms()))

    def forget(self, record_id: str) -> dict[str, Any]:
        args = {"record_id": record_id, "idempotency_key": f"forget-{record_id[4:40]}", "reason_ref": "reason:test"}
        tool = FORGET_TOOL
        grant = make_grant(self.key, tenant=self.tenant, workspace=self.workspace, principal=self.principal,
                           tool=tool, target=record_id, approved_at_ms=self.clock.now_ms(),
                           operation_digest=operation_digest(tool=tool, tenant=self.tenant, workspace=self.workspace,
                                                             principal=self.principal, arguments=args))
        return self.call("forget", args, grant=grant)

    def search_args(self, query: str, **kw: Any) -> dict[str, Any]:
        return {"query": query, "purpose_ref": self.purpose_ref, **kw}

    def search(self, query: str, **kw: Any) -> dict[str, Any]:
        return self.call("search", self.search_args(query, **kw))

    def get(self, record_id: str) -> dict[str, Any]:
        return self.call("get", {"record_id": record_id, "purpose_ref": self.purpose_ref})

    def ids(self, query: str, **kw: Any) -> list[str]:
        return [p["record"]["record_id"] for p in self.search(query, **kw)["records"]]

    def all_pages(self, query: str, **kw: Any) -> list[str]:
        seen: list[str] = []
        page = self.search(query, **kw)
        while True:
            seen += [p["record"]["record_id"] for p in page["records"]]
            if "next_page_cursor" not in page:
                return seen
            page = self.search(query, page_cursor=page["next_page_cursor"], **kw)


def capture_args(text: str, *, purpose_ref: str = PURPOSE, t: int | None = None, now: int | None = None,
                 **payload_overrides: Any) -> dict[str, Any]:
    now = time.time_ns() // 1_000_000 if now is None else now
    t = now - 60_000 if t is None else t
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
        "idempotency_key": f"search-cap-{next(_counter):08d}-{now}",
        "payload": payload,
        "evidence": {"evidence_ref": "ev:1", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]},
    }


def activate(core: RunningCore, tenant: str = "acme", workspace: str = "alpha", *, clock: Clock | None = None) -> None:
    key = load_private_key_file(core.host_key_path)
    ctx = make_context(key, call="admin", tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=(clock or SystemClock()).now_ms(), host_principal=True,
                       maintenance_scopes=("read", "maintain"), memory_enabled=False)
    with grpc.insecure_channel(core.address) as ch:
        admin_pb2_grpc.AdminServiceStub(ch).Activate(
            admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace, tools=[]),
            metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=10)
