"""gRPC client of the core for the adapter (SPEC §1–2).

Every call carries the signed host context in binary metadata, the
confirmation grant when there is one, and the configured deadline. Awaiting a
``grpc.aio`` call inside the MCP request task means an MCP cancellation
cancels the RPC. Failures come back as :class:`EngramError` with the contract
code the core put in its ``ErrorInfo``.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message

from engram_core.api import host_pb2, host_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    FORGET_TOOL,
    GET_TOOL,
    SEARCH_TOOL,
    WITHDRAW_TOOL,
)
from engram_core.observability import tracing
from engram_core.rpc.convert import message_of, message_to_value
from engram_core.rpc.status import error_from_rpc_error
from engram_core.rpc.tls import ClientTls, aio_channel
from engram_core.trust.hostctx import CONFIRMATION_METADATA_KEY, CONTEXT_METADATA_KEY

# tool -> (MemoryService method, request message)
_TOOL_RPC: dict[str, tuple[str, type[Message]]] = {
    SEARCH_TOOL: ("Search", memory_pb2.SearchRequest),
    GET_TOOL: ("Get", memory_pb2.GetRequest),
    CAPTURE_TOOL: ("Capture", memory_pb2.CaptureRequest),
    ADMISSION_TOOL: ("RequestAdmission", memory_pb2.RequestAdmissionRequest),
    WITHDRAW_TOOL: ("Withdraw", memory_pb2.WithdrawRequest),
    FORGET_TOOL: ("Forget", memory_pb2.ForgetRequest),
}


def _metadata(context: bytes, grant: bytes | None) -> tuple[tuple[str, bytes], ...]:
    entries = [(CONTEXT_METADATA_KEY, context)]
    if grant is not None:
        entries.append((CONFIRMATION_METADATA_KEY, grant))
    return tuple(entries)


def _error(err: grpc.RpcError, detail: str) -> EngramError:
    try:
        return error_from_rpc_error(err, detail)
    except Exception:  # a malformed status detail is still a failure, never a success
        return EngramError(Code.STORE_UNAVAILABLE, detail)


def _has_status_details(err: grpc.RpcError) -> bool:
    """True when the call carried a rich status (the core answered), as opposed to a channel
    that never reached one."""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    return any(key == "grpc-status-details-bin" for key, _ in (trailing or ()))


class CoreClient:
    """Async MemoryService + HostService client bound to one core address."""

    def __init__(self, address: str, *, deadline_ms: int, tls: ClientTls | None = None) -> None:
        self._address = address
        self._tls = tls
        self._timeout = deadline_ms / 1000
        self._channel: grpc.aio.Channel | None = None
        self._stub_pair: tuple[memory_pb2_grpc.MemoryServiceStub, host_pb2_grpc.HostServiceStub] | None = None

    def _stubs(self) -> tuple[memory_pb2_grpc.MemoryServiceStub, host_pb2_grpc.HostServiceStub]:
        # Created lazily inside the running event loop that will use it, once: a stub builds a
        # callable per method of its service (12 in all), which cost ~0.1 ms on every call.
        if self._stub_pair is None:
            # With tracing on, the interceptors send the tool call's trace context to the core.
            self._channel = aio_channel(self._address, self._tls, interceptors=tracing.client_interceptors() or None)
            self._stub_pair = (memory_pb2_grpc.MemoryServiceStub(self._channel),
                               host_pb2_grpc.HostServiceStub(self._channel))
        return self._stub_pair

    def _error(self, err: grpc.RpcError, detail: str) -> EngramError:
        """The contract error of a failed call; when no core answered at all (the channel could
        not connect, so no status came back), the detail says so and where, for the one log line
        an operator reads."""
        error = _error(err, detail)
        code = err.code() if hasattr(err, "code") else None
        if code == grpc.StatusCode.UNAVAILABLE and error.code is Code.STORE_UNAVAILABLE and error.reason_class is None \
                and not _has_status_details(err):
            return EngramError(error.code, f"{detail}: no core answers at {self._address}")
        return error

    async def _call(self, stub: Any, method: str, request: Message, context: bytes, grant: bytes | None = None,
                    timeout: float | None = None) -> Any:
        """One RPC under the signed context (and grant) and the deadline; a failure is the contract
        error, detailed "<method> failed"."""
        try:
            return await getattr(stub, method)(request, metadata=_metadata(context, grant),
                                               timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise self._error(err, f"{method} failed") from None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub_pair = None

    async def granted_tools(self, context: bytes) -> tuple[list[str], list[str]]:
        """The tools the policy grants this binding (drives tools/list), and those of them
        the policy gates behind a human confirmation."""
        _, host = self._stubs()
        reply = await self._call(host, "ListCapabilities", host_pb2.ListCapabilitiesRequest(), context)
        return list(reply.tools), list(reply.confirmation_required)

    async def authorization_epoch(self, host_context: bytes) -> int:
        """The bound scope's current authorization epoch (asked with a host-principal context)."""
        _, host = self._stubs()
        reply = await self._call(host, "AuthorizationEpoch", host_pb2.AuthorizationEpochRequest(), host_context)
        return int(reply.authorization_epoch)

    async def invoke(
        self, tool: str, arguments: dict[str, Any], *, context: bytes, grant: bytes | None = None
    ) -> dict[str, Any]:
        """Send one validated tool call; returns the contract value of the reply."""
        method, request_type = _TOOL_RPC[tool]
        memory, _ = self._stubs()
        try:
            request = message_of(arguments, request_type)  # validated: the closed schema fixed every type
        except Exception:
            # Validated arguments always convert; anything else is our schema drifting.
            raise EngramError(Code.INVALID_SCHEMA, "arguments do not convert") from None
        return message_to_value(await self._call(memory, method, request, context, grant))

    async def check_gated(self, tool: str, arguments: dict[str, Any], *, context: bytes) -> str:
        """Before a human is asked to confirm a withdraw or forget: "ready" when the target
        exists in the scope and the transition is possible, "replay" when the idempotency key
        already holds this operation's outcome; else the refusal the tool itself would give
        (NOT_FOUND, ALREADY_TERMINAL, ILLEGAL_TRANSITION, DIGEST_CONFLICT, ...)."""
        _, host = self._stubs()
        request = host_pb2.CheckGatedRequest(
            tool=tool, target=str(arguments.get("record_id") or arguments.get("candidate_id") or ""),
            idempotency_key=arguments["idempotency_key"], reason_ref=arguments["reason_ref"])
        return (await self._call(host, "CheckGated", request, context)).status

    async def record_refusal(self, *, context: bytes, operation: str, error: EngramError, target: str = "") -> None:
        """Have the core write the audit row of a refusal the adapter decided (same context,
        same audit id as the call)."""
        _, host = self._stubs()
        request = host_pb2.RecordRefusalRequest(
            operation=operation, code=error.code.value, reason_class=error.reason_class or "",
            reason_codes=list(error.reasons), pointer=error.pointer, target=target)
        await self._call(host, "RecordRefusal", request, context)

    async def park_confirmation(self, *, context: bytes, tool: str, target: str, reason_ref: str,
                                operation_digest: str, ttl_ms: int) -> tuple[str, int]:
        """Park a withdraw or forget for a person to confirm in the console (issue 61):
        (its single-use id, when it expires)."""
        _, host = self._stubs()
        request = host_pb2.ParkConfirmationRequest(tool=tool, target=target, reason_ref=reason_ref,
                                                   operation_digest=operation_digest, ttl_ms=ttl_ms)
        reply = await self._call(host, "ParkConfirmation", request, context)
        return reply.confirmation_id, int(reply.expires_at_ms)

    async def claim_confirmation(self, *, context: bytes, confirmation_id: str, tool: str, target: str,
                                 operation_digest: str, wait_ms: int) -> str:
        """The person's decision, waiting up to ``wait_ms`` for it: "approved" (claimed, once),
        "denied", "expired" or "pending"."""
        _, host = self._stubs()
        request = host_pb2.ClaimConfirmationRequest(confirmation_id=confirmation_id, tool=tool, target=target,
                                                    operation_digest=operation_digest, wait_ms=wait_ms)
        # The long poll's wait is on top of the deadline.
        reply = await self._call(host, "ClaimConfirmation", request, context, timeout=self._timeout + wait_ms / 1000)
        return reply.status
