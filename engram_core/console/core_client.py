"""The console's calls to the core: AdminService over gRPC, each with a host context signed for
that one call in the name of the person acting.

The context names the person as its principal (``local:owner``, or ``oidc:<sub>@<issuer host>``),
so every audit row the core writes for a console action names who did it, not the console. The
core still decides on its own policy whether the console's host key may do the operation: the
console's roles only narrow what a person can ask for, they never widen what the key may do.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, host_pb2, host_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.scope import Scope
from engram_core.contract.tools import GET_TOOL, SEARCH_TOOL
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.rpc.status import error_from_rpc_error
from engram_core.rpc.tls import ClientTls
from engram_core.rpc.tls import channel as tls_channel
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, HOST_CALL, make_context
from engram_core.trust.hostkeys import load_private_key_file

READ = ("read",)
MAINTAIN = ("read", "maintain")
AGENT_ID = "engram-console"


class CoreError(Exception):
    """A refusal or failure of the core, with the contract's error code (``NOT_FOUND``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Actor:
    """Who a call is made for: the principal the core audits, and the console session it came from."""

    principal: str
    session: str


class CoreClient:
    """One channel to the core, shared by every request (gRPC channels are thread-safe)."""

    def __init__(self, address: str, host_key_path: str, tls: ClientTls | None = None, *,
                 timeout_s: float = 30.0) -> None:
        self._key = load_private_key_file(host_key_path)
        self._channel = tls_channel(address, tls)
        self._stub = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._memory_stub = memory_pb2_grpc.MemoryServiceStub(self._channel)
        self._host = host_pb2_grpc.HostServiceStub(self._channel)
        self._epochs: dict[Scope, int] = {}  # each scope's authorization epoch, as last learned
        self._timeout_s = timeout_s

    def close(self) -> None:
        self._channel.close()

    def _metadata(self, actor: Actor, scopes: tuple[str, ...]) -> list[tuple[str, bytes]]:
        ctx = make_context(self._key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal=actor.principal,
                           agent_id=AGENT_ID, session=actor.session, now_ms=time.time_ns() // 1_000_000,
                           host_principal=True, maintenance_scopes=scopes, memory_enabled=False)
        return [(CONTEXT_METADATA_KEY, ctx)]

    def _call(self, actor: Actor, rpc: str, request: Any, scopes: tuple[str, ...]) -> dict[str, Any]:
        try:
            result = getattr(self._stub, rpc)(request, metadata=self._metadata(actor, scopes), timeout=self._timeout_s)
        except grpc.RpcError as err:
            error = error_from_rpc_error(err)
            raise CoreError(error.code.value, error.message) from None
        return json.loads(result.json)

    def _memory(self, actor: Actor, scope: Scope, tool: str, rpc: str, request: Any,
                purpose_ref: str) -> dict[str, Any]:
        """One MemoryService call as the person, under their purpose: the core's authorization,
        redaction (per purpose) and audit apply exactly as to an agent's call. A scope whose
        authorization epoch moved on (`engram admin revoke`) is asked for its epoch once, as the
        MCP adapter does, and the call signed again under it."""
        for attempt in (0, 1):
            ctx = make_context(self._key, call=tool, tenant=scope.tenant, workspace=scope.workspace,
                               principal=actor.principal, agent_id=AGENT_ID, session=actor.session,
                               purpose_ref=purpose_ref, now_ms=time.time_ns() // 1_000_000,
                               authorization_epoch=self._epochs.get(scope, 0))
            try:
                resp = getattr(self._memory_stub, rpc)(request, metadata=[(CONTEXT_METADATA_KEY, ctx)],
                                                       timeout=self._timeout_s)
            except grpc.RpcError as err:
                error = error_from_rpc_error(err)
                if error.code.value == "AUTHORIZATION_REVOKED" and attempt == 0:
                    self._epochs[scope] = self._authorization_epoch(actor, scope)
                    continue
                raise CoreError(error.code.value, error.message) from None
            return message_to_value(resp)
        raise AssertionError("unreachable")

    def search(self, actor: Actor, scope: Scope, purpose_ref: str, query: str,
               page_cursor: str = "") -> dict[str, Any]:
        """A search as the person, under the purpose the console policy gave them."""
        args: dict[str, Any] = {"query": query, "purpose_ref": purpose_ref, "limit": 20}
        if page_cursor:
            args["page_cursor"] = page_cursor
        return self._memory(actor, scope, SEARCH_TOOL, "Search",
                            value_to_message(args, memory_pb2.SearchRequest()), purpose_ref)

    def get(self, actor: Actor, scope: Scope, purpose_ref: str, record_id: str) -> dict[str, Any]:
        """One record as the person reads it under their purpose (NOT_FOUND unless readable now)."""
        request = value_to_message({"record_id": record_id, "purpose_ref": purpose_ref}, memory_pb2.GetRequest())
        return self._memory(actor, scope, GET_TOOL, "Get", request, purpose_ref)

    def journal(self, actor: Actor, scope: Scope, from_cursor: int, to_cursor: int) -> list[dict[str, Any]]:
        """The scope's journal events with cursors in [from_cursor, to_cursor] (to_cursor 0: no bound)."""
        req = admin_pb2.ExportRequest(tenant=scope.tenant, workspace=scope.workspace, what="journal", from_cursor=str(from_cursor),
                                      to_cursor=str(to_cursor) if to_cursor else "")
        return self._call(actor, "Export", req, READ)["items"]

    def _authorization_epoch(self, actor: Actor, scope: Scope) -> int:
        ctx = make_context(self._key, call=HOST_CALL, tenant=scope.tenant, workspace=scope.workspace, principal=actor.principal,
                           agent_id=AGENT_ID, session=actor.session, now_ms=time.time_ns() // 1_000_000,
                           host_principal=True)
        try:
            reply = self._host.AuthorizationEpoch(host_pb2.AuthorizationEpochRequest(),
                                                  metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=self._timeout_s)
        except grpc.RpcError as err:
            error = error_from_rpc_error(err)
            raise CoreError(error.code.value, error.message) from None
        return int(reply.authorization_epoch)

    # -- the calls the pages make ----------------------------------------------------------------
    def adjudication_list(self, actor: Actor, scope: Scope) -> list[dict[str, Any]]:
        req = admin_pb2.ScopeRequest(tenant=scope.tenant, workspace=scope.workspace)
        return self._call(actor, "ListAdjudication", req, READ)["candidates"]

    def inspect(self, actor: Actor, scope: Scope, candidate_id: str) -> dict[str, Any]:
        req = admin_pb2.InspectRequest(tenant=scope.tenant, workspace=scope.workspace, candidate_id=candidate_id)
        return self._call(actor, "InspectCandidate", req, READ)

    def adjudicate(self, actor: Actor, scope: Scope, candidate_id: str, decision: str,
                   reason: str) -> dict[str, Any]:
        """Accept or reject a held candidate; the event id is fresh, so a form sent twice acts once
        at most (the second finds the candidate no longer pending)."""
        req = admin_pb2.AdjudicateRequest(tenant=scope.tenant, workspace=scope.workspace, candidate_id=candidate_id,
                                          decision=decision, reason_ref=reason,
                                          event_id="evt_console_" + secrets.token_hex(12))
        return self._call(actor, "Adjudicate", req, MAINTAIN)["outcome"]

    def audit(self, actor: Actor, scope: Scope, from_seq: int, to_seq: int) -> list[dict[str, Any]]:
        """The scope's audit rows with sequence numbers in [from_seq, to_seq] (to_seq 0: no bound)."""
        req = admin_pb2.ExportRequest(tenant=scope.tenant, workspace=scope.workspace, what="audit", from_cursor=str(from_seq),
                                      to_cursor=str(to_seq) if to_seq else "")
        return self._call(actor, "Export", req, READ)["items"]

    def verify(self, actor: Actor, scope: Scope) -> dict[str, Any]:
        req = admin_pb2.ScopeRequest(tenant=scope.tenant, workspace=scope.workspace, report_only=True)
        return self._call(actor, "Verify", req, READ)

    # -- confirmations in the browser (issue 61): host calls bound to the scope, naming the person --
    def _confirmations(self, actor: Actor, scope: Scope, rpc: str, request: Any,
                       scopes: tuple[str, ...]) -> list[dict[str, Any]]:
        ctx = make_context(self._key, call=HOST_CALL, tenant=scope.tenant, workspace=scope.workspace, principal=actor.principal,
                           agent_id=AGENT_ID, session=actor.session, now_ms=time.time_ns() // 1_000_000,
                           host_principal=True, maintenance_scopes=scopes, memory_enabled=False)
        try:
            reply = getattr(self._host, rpc)(request, metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=self._timeout_s)
        except grpc.RpcError as err:
            error = error_from_rpc_error(err)
            raise CoreError(error.code.value, error.message) from None
        return json.loads(reply.json)["confirmations"]

    def confirmations(self, actor: Actor, scope: Scope, confirmation_id: str = "") -> list[dict[str, Any]]:
        """The scope's pending confirmations, or the one named (NOT_FOUND if it is not this scope's)."""
        return self._confirmations(actor, scope, "ListConfirmations",
                                   host_pb2.ListConfirmationsRequest(confirmation_id=confirmation_id), READ)

    def decide_confirmation(self, actor: Actor, scope: Scope, confirmation_id: str,
                            approve: bool) -> dict[str, Any]:
        """The person's approval or denial, audited by the core under the person's principal."""
        return self._confirmations(actor, scope, "DecideConfirmation", host_pb2.DecideConfirmationRequest(
            confirmation_id=confirmation_id, approve=approve), MAINTAIN)[0]

    def key_status(self, actor: Actor, scope: Scope) -> dict[str, Any]:
        req = admin_pb2.ScopeRequest(tenant=scope.tenant, workspace=scope.workspace)
        return self._call(actor, "KeyStatus", req, READ)
