"""What every servicer shares: the call's verified context, its refusal audit, its error mapping.

``CallHandler`` is the base of the MemoryService, HostService and AdminService servicers
(``rpc/server.py``, ``rpc/maintenance.py``); ``json_result`` wraps an admin call's document.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from engram_core.api import admin_pb2
from engram_core.contract.canonical import canonical_json
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.tools import GATED_TOOLS, TOOL_NAMES
from engram_core.observability import calls as observed_calls
from engram_core.rpc.status import OPERATOR_DETAIL_CODES, abort
from engram_core.services.core import Core
from engram_core.trust.hostctx import (
    ADMIN_CALL,
    CONTEXT_METADATA_KEY,
    HOST_CALL,
    TOOLS_LIST_CALL,
    BoundContext,
    verify_context,
)

log = logging.getLogger("engram.core")

# A store failure's detail is for the operator's log, never the caller: which kind of failure
# (a driver error's class and SQLSTATE, a lock wait that timed out, a batch rolled back), never
# a database message (those quote row values: engram_core/store/postgres/pool.py ``failure``).
STORE_FAILURE_CODES = frozenset({Code.STORE_UNAVAILABLE, Code.MUTATION_OUTCOME_UNKNOWN})
# What a context must have been signed for (HostContext.call), per kind of call (docs/security.md):
# an acting call accepts only a context signed for it; the calls that act on nothing also accept
# the context of the tool call they serve (one context per request from a fronting host).
TOOL_CALLS = frozenset(TOOL_NAMES)
GATED_CALLS = frozenset(GATED_TOOLS)
LISTING_CALLS = TOOL_CALLS | {TOOLS_LIST_CALL}
HOST_CALLS = frozenset({HOST_CALL})
ADMIN_CALLS = frozenset({ADMIN_CALL})
# What CheckGated and RecordRefusal accept: the context of the tool call they serve (a fronting
# host's one context per request), or one signed for a host call (what the adapter signs for them
# when it signs its own contexts, so that none of its contexts could act as the tool).
GATED_CHECK_CALLS = GATED_CALLS | HOST_CALLS
REFUSAL_RECORD_CALLS = LISTING_CALLS | HOST_CALLS
# Any call at all: what a request that cannot even be decoded is authenticated as before it is
# refused (and its nonce spent, like every other context the core sees).
ANY_CALLS = LISTING_CALLS | HOST_CALLS | ADMIN_CALLS


def _refused_operation(calls: frozenset[str]) -> str:
    """The operation a refusal before the call's own code ran is audited under: the call's, as
    the observing interceptor named it."""
    obs = observed_calls.current()
    if obs is not None and obs.operation:
        return obs.operation
    return next(iter(calls)) if len(calls) == 1 else "host"


def metadata_value(context: grpc.ServicerContext, key: str) -> bytes | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, bytes) else None
    return None


class CallHandler:
    """Shared per-call plumbing of every servicer: verify the context, check the deadline, audit a
    refusal, map errors to gRPC once (``rpc/status.py``)."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def bind(self, context: grpc.ServicerContext, *, calls: frozenset[str],
             serves_tool_call: bool = False) -> BoundContext:
        """The verified context of this call, its nonce spent (claimed): a second presentation,
        to this call or any other, is refused as a replay, so a context seen by any call cannot
        act afterwards (issue 57). ``calls``: what the context must have been signed for.

        One exception, ``serves_tool_call`` (the tool listing and CheckGated, which read nothing
        of a record and change nothing): shown the context of the tool call they serve (signed
        for a tool), they leave its nonce for that tool call to spend. A fronting host sends one
        context per HTTP request, and the adapter shows it to these two before it makes the
        call. Any other context they are shown (``tools/list``, ``host``) is spent here."""
        ctx = verify_context(metadata_value(context, CONTEXT_METADATA_KEY), self.core.trusted,
                             now_ms=self.core.now_ms(), calls=calls)
        observed_calls.note_context(ctx)  # the call's log line and metrics name who called
        if serves_tool_call and ctx.call in TOOL_CALLS:
            return self.core.host_trust.checked(ctx)  # the claim reads the trust version; this call has none
        try:
            return self.core.claim_context(ctx)
        except EngramError as exc:
            if exc.code is Code.RATE_LIMITED:
                # A verified context refused for its key's full lane: audited like any refusal
                # (a flood leaves its trace), and answered with the retriable code.
                raise self.refused(ctx, _refused_operation(calls), exc) from None
            raise

    def refused(self, ctx: BoundContext, operation: str, exc: EngramError, target: str = "") -> EngramError:
        """Audit a refusal after the context was verified (its audit id is then the host's): the
        audit row, like the call's log line, names the operation, scope, audit id and the exact
        reason (class, reason codes, JSON pointer); the caller sees only the constant message.
        Returns the error to answer with: STORE_UNAVAILABLE if the row could not be written,
        so an auditId never points nowhere."""
        # The call's one log line (engram_core.observability) carries the code, reason codes,
        # class and pointer of the error this answers with.
        if exc.audited:
            return exc
        try:
            self.core.audit_refusal(ctx, operation, exc, target)
        except Exception as audit_exc:  # noqa: BLE001 - any failure to write the row
            log.warning("refusal not audited: audit_id=%s %s", ctx.audit_id, type(audit_exc).__name__)
            # A transient failure (FENCE_LOST, STORE_UNAVAILABLE, ...) already tells the caller to
            # retry and changed nothing: keep its code. Anything else must not stand unaudited.
            return exc if exc.retriable else EngramError(Code.STORE_UNAVAILABLE, "refusal audit row not written")
        exc.audited = True
        return exc

    def audited(self, context: grpc.ServicerContext, operation: str, fn: Callable[[BoundContext], Any],
                target: Callable[[], str] = lambda: "", *, calls: frozenset[str],
                serves_tool_call: bool = False) -> Any:
        """``fn`` with the verified context; a refusal after verification is logged and audited.
        ``calls`` and ``serves_tool_call`` as for :meth:`bind`."""
        def go() -> Any:
            ctx = self.bind(context, calls=calls, serves_tool_call=serves_tool_call)
            try:
                return fn(ctx)
            except EngramError as exc:
                try:
                    where = target() if exc.code not in (Code.INVALID_SCHEMA, Code.INVALID_DIGEST) else ""
                except Exception:  # noqa: BLE001 - a target that cannot be read is no target
                    where = ""
                raise self.refused(ctx, operation, exc, where) from None

        return self.run(context, go)

    def run(self, context: grpc.ServicerContext, fn: Callable[[], Any]) -> Any:
        try:
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                raise EngramError(Code.DEADLINE_EXCEEDED, "deadline passed before start")
            return fn()
        except EngramError as exc:
            if exc.code in OPERATOR_DETAIL_CODES or exc.code in STORE_FAILURE_CODES:
                log.warning("call refused: %s: %s", exc.code.value, exc.detail)
            abort(context, exc)  # every call is logged once by engram_core.observability.interceptor
        except grpc.RpcError:
            raise
        except Exception:
            if not context.is_active():
                abort(context, EngramError(Code.CANCELLED, "client went away"))
            log.exception("internal error")
            # Unknown failure inside a call: the mutation may or may not have
            # committed, so the contract's answer is "retry with the same key".
            abort(context, EngramError(Code.MUTATION_OUTCOME_UNKNOWN, "unexpected failure"))


def json_result(value: Any) -> admin_pb2.AdminResult:
    """An admin call's result: its document as canonical JSON."""
    return admin_pb2.AdminResult(json=canonical_json(value).decode())
