"""The one mapping between EngramError and gRPC status (SPEC §3).

Codes travel as ``google.rpc.Status`` with an ``ErrorInfo`` detail
(``reason`` = the contract code, ``domain`` = ``engram``, ``metadata["class"]`` = the
refusal's reason class when it has one) and the constant message of that code and class
(``engram_core.contract.errors.REFUSALS``), mapped to the nearest gRPC status code.
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from engram_core.contract.errors import Code, EngramError, known_class
from engram_core.observability.calls import note_error

DOMAIN = "engram"

_GRPC_CODE: dict[Code, int] = {
    Code.INVALID_SCHEMA: code_pb2.INVALID_ARGUMENT,
    Code.INVALID_DIGEST: code_pb2.INVALID_ARGUMENT,
    Code.UNAUTHORIZED: code_pb2.PERMISSION_DENIED,
    Code.AUTHORIZATION_EXPIRED: code_pb2.PERMISSION_DENIED,
    Code.AUTHORIZATION_REVOKED: code_pb2.PERMISSION_DENIED,
    Code.NOT_FOUND: code_pb2.NOT_FOUND,
    Code.DIGEST_CONFLICT: code_pb2.ALREADY_EXISTS,
    Code.ILLEGAL_TRANSITION: code_pb2.FAILED_PRECONDITION,
    Code.ALREADY_TERMINAL: code_pb2.FAILED_PRECONDITION,
    Code.GATE_FAILED: code_pb2.FAILED_PRECONDITION,
    Code.STALE_PAGE: code_pb2.FAILED_PRECONDITION,
    Code.RESULT_TOO_LARGE: code_pb2.OUT_OF_RANGE,
    Code.PROJECTION_OVERSIZED: code_pb2.OUT_OF_RANGE,
    Code.MUTATION_OUTCOME_UNKNOWN: code_pb2.UNAVAILABLE,
    Code.RATE_LIMITED: code_pb2.RESOURCE_EXHAUSTED,
    Code.DEADLINE_EXCEEDED: code_pb2.DEADLINE_EXCEEDED,
    Code.CANCELLED: code_pb2.CANCELLED,
    Code.STORE_UNAVAILABLE: code_pb2.UNAVAILABLE,
    Code.FENCE_LOST: code_pb2.UNAVAILABLE,
    Code.CURSOR_GAP: code_pb2.UNAVAILABLE,
    Code.POLICY_UNAVAILABLE: code_pb2.UNAVAILABLE,
    Code.POLICY_STALE: code_pb2.ABORTED,
    Code.PROJECTION_STALE: code_pb2.UNAVAILABLE,
    Code.RANKING_UNAVAILABLE: code_pb2.UNAVAILABLE,
    Code.CAPABILITY_UNAVAILABLE: code_pb2.UNIMPLEMENTED,
    Code.JOURNAL_CORRUPT: code_pb2.DATA_LOSS,
    Code.BLOB_MISSING: code_pb2.DATA_LOSS,
    Code.REGISTRY_VERSION_UNAVAILABLE: code_pb2.FAILED_PRECONDITION,
    Code.BACKUP_INVALID: code_pb2.INVALID_ARGUMENT,
    Code.RESTORE_REFUSED: code_pb2.FAILED_PRECONDITION,
    Code.MIGRATION_LEDGER_INVALID: code_pb2.FAILED_PRECONDITION,
    Code.TRUSTED_CONTEXT_UNAVAILABLE: code_pb2.UNAUTHENTICATED,
}


# Codes only the maintenance API (host principals) can receive, whose reason an operator needs
# to act on (which key did not verify, which chain broke where). Their detail travels in
# ErrorInfo.metadata["detail"]; it names keys by id and positions, never content or secrets.
OPERATOR_DETAIL_CODES = frozenset({Code.BACKUP_INVALID, Code.RESTORE_REFUSED})

CLASS_KEY = "class"  # ErrorInfo.metadata key of the refusal's reason class
# ErrorInfo.metadata entry on the refusal of a gated call without any confirmation.
CONFIRMATION_METADATA = ("confirmation", "required")


def to_status(error: EngramError) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=error.code.value, domain=DOMAIN)
    if error.code in OPERATOR_DETAIL_CODES and error.detail:
        info.metadata["detail"] = error.detail
    if error.reason_class:
        info.metadata[CLASS_KEY] = error.reason_class
    if error.confirmation_required:
        info.metadata[CONFIRMATION_METADATA[0]] = CONFIRMATION_METADATA[1]
    detail = any_pb2.Any()
    detail.Pack(info)
    details = [detail]
    retry_after_ms = getattr(error, "retry_after_ms", None)  # RATE_LIMITED: the policy's retry-after
    if retry_after_ms is not None:
        retry = any_pb2.Any()
        retry.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=retry_after_ms // 1000, nanos=(retry_after_ms % 1000) * 1_000_000)))
        details.append(retry)
    status = status_pb2.Status(code=_GRPC_CODE[error.code], message=error.message, details=details)
    return rpc_status.to_status(status)


def abort(context: grpc.ServicerContext, error: EngramError) -> None:
    note_error(error)  # the call's log line and metrics carry the contract code
    context.abort_with_status(to_status(error))


_MESSAGE_TOO_LARGE = "message larger than max"  # gRPC core: "Received/Sent message larger than max (N vs. M)"


def _details(err: grpc.RpcError) -> str:
    try:
        return (err.details() if hasattr(err, "details") else "") or ""
    except Exception:  # a details() that fails says nothing about the size
        return ""


def code_from_rpc_error(err: grpc.RpcError) -> Code:
    """Recover the contract code from a failed call (client side).

    Transport failures without an Engram ErrorInfo map to the nearest
    transient code, so infrastructure failure never looks like success.
    """
    return error_from_rpc_error(err).code


def error_from_rpc_error(err: grpc.RpcError, detail: str = "") -> EngramError:
    """The contract error of a failed call: its code and, when the catalogue knows it for that
    code, its reason class (the wire is not trusted to name a message)."""
    status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    if status is not None:
        for detail_any in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail_any.Is(info.DESCRIPTOR) and detail_any.Unpack(info) and info.domain == DOMAIN:
                try:
                    code = Code(info.reason)
                except ValueError:
                    break
                return EngramError(code, detail, reason_class=known_class(code, info.metadata.get(CLASS_KEY)),
                                   confirmation_required=(info.metadata.get(CONFIRMATION_METADATA[0])
                                                          == CONFIRMATION_METADATA[1]))
    return EngramError(_transport_code(err), detail)


def _transport_code(err: grpc.RpcError) -> Code:
    code = err.code() if hasattr(err, "code") else None
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and _MESSAGE_TOO_LARGE in _details(err):
        # gRPC itself refused a message over MAX_MESSAGE_BYTES (either side) before any handler
        # could answer with an ErrorInfo. The request is beyond the contract's bounds and
        # resending it cannot succeed: INVALID_SCHEMA, not a retriable transport failure.
        return Code.INVALID_SCHEMA
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Code.DEADLINE_EXCEEDED
    if code == grpc.StatusCode.CANCELLED:
        return Code.CANCELLED
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Code.TRUSTED_CONTEXT_UNAVAILABLE
    return Code.STORE_UNAVAILABLE


def operator_detail(err: grpc.RpcError) -> str:
    """The operator-readable reason of a maintenance refusal (OPERATOR_DETAIL_CODES), or ""."""
    status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == DOMAIN:
            return info.metadata.get("detail", "")
    return ""
