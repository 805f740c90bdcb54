"""The one place every Engram RPC is observed: a gRPC server interceptor that opens the call's
observation, and when the call ends writes its log line, counts it and times it.

Identity comes from the verified host context (``calls.note_context``, called where the core
binds it), the outcome from the one status mapping (``calls.note_error``), reason codes from
the policy decisions the call took and from the error. Health and reflection are not observed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from engram_core.observability import calls, tracing
from engram_core.observability.logs import log_call, log_event
from engram_core.observability.metrics import CoreMetrics

_SERVICES = {"engram.v1.MemoryService": "memory", "engram.v1.HostService": "host",
             "engram.v1.AdminService": "admin"}
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")

# Maintenance operations that are operational events of their own: event name and the
# (non-content) fields of their JSON result worth a line. Policy reloads are logged by the
# policy wrapper, which also sees SIGHUP reloads.
_EVENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin.rotate_keys": ("key_rotation", ("active_kek", "rewrapped", "retired_keks")),
    "admin.restore": ("restore", ("records_restored", "scopes")),
    "admin.migrate": ("migration", ("applied",)),
    "admin.revoke": ("revocation", ("authorization_epoch",)),
}


def operation_name(method: str) -> str | None:
    """``/engram.v1.MemoryService/Search`` -> ``memory.search``; None for other services."""
    _, _, rest = method.partition("/")
    service, _, name = rest.partition("/")
    prefix = _SERVICES.get(service)
    return f"{prefix}.{_CAMEL.sub('_', name).lower()}" if prefix and name else None


class _Call:
    """What a unary call answered, for the admin events its log line may name."""

    response: Any = None


class ObservingInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: CoreMetrics | None = None) -> None:
        self._metrics = metrics
        self._names: dict[str, str | None] = {}

    def intercept_service(self, continuation: Callable, handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return None
        op = self._names.get(method)
        if op is None and method not in self._names:
            op = self._names.setdefault(method, operation_name(method))
        if op is None:
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(op, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(op, handler.unary_stream))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._unary(op, handler.stream_unary))
        return handler._replace(stream_stream=self._streaming(op, handler.stream_stream))

    def _unary(self, op: str, behavior: Callable) -> Callable:
        def observed(request: Any, context: grpc.ServicerContext) -> Any:
            with self._observed(op, context) as call:
                call.response = behavior(request, context)
                return call.response

        return observed

    def _streaming(self, op: str, behavior: Callable) -> Callable:
        def observed(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self._observed(op, context):
                yield from behavior(request, context)

        return observed

    @contextmanager
    def _observed(self, op: str, context: grpc.ServicerContext) -> Iterator[_Call]:
        """One call's observation, the same for unary and streaming calls: opened, failed with
        the status the servicer set when the call raises (a streaming call's cancellation too),
        and finished whichever way it ends."""
        obs, token = calls.begin(op)
        call = _Call()
        try:
            yield call
        except BaseException:
            _failed(obs, context)
            raise
        finally:
            calls.end(token)
            self._finish(obs, call.response)

    def _finish(self, obs: calls.CallObservation, response: Any) -> None:
        seconds = obs.seconds()
        # On the call's server span (OpenTelemetry's interceptor runs outside this one).
        tracing.set_attributes(**{"engram.operation": obs.operation, "engram.outcome": obs.outcome,
                                  "engram.audit_id": obs.audit_id})
        log_call(obs, seconds)
        if self._metrics is not None:
            self._metrics.observe_call(obs, seconds)
        event = _EVENTS.get(obs.operation)
        if event is not None and not obs.code:
            _log_admin_event(obs, *event, response)


def _grpc_code(context: grpc.ServicerContext) -> str:
    """A failure that did not come through the contract mapping (a bug, or gRPC itself)."""
    try:
        code = context.code()
    except Exception:
        code = None
    return code.name if isinstance(code, grpc.StatusCode) else "INTERNAL"


def _log_admin_event(obs: calls.CallObservation, name: str, keys: tuple[str, ...], response: Any) -> None:
    fields: dict[str, Any] = {"principal": obs.principal, "audit_id": obs.audit_id}
    try:
        value = json.loads(response.json) if response is not None else {}
    except (AttributeError, ValueError):
        value = {}
    for k in keys:
        if k in value and isinstance(value[k], int | str | list):
            fields[k] = value[k]
    log_event(name, logging.INFO, **fields)


def _failed(obs: calls.CallObservation, context: grpc.ServicerContext) -> None:
    """A call that raised: its status is the one the servicer set, unless one is known already."""
    if not obs.code:
        obs.code = _grpc_code(context)
