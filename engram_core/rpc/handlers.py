"""Registering servicers so that undecodable requests are contract errors, not INTERNAL.

grpcio answers a request its deserializer cannot parse (invalid UTF-8 in a
string field, garbage bytes) with INTERNAL. The contract says client input
never gets INTERNAL: here the deserializer returns a marker instead, and the
handler answers UNAUTHENTICATED (no valid context) or INVALID_SCHEMA, its context spent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from engram_core.contract.errors import Code, EngramError
from engram_core.rpc.call_handler import ANY_CALLS
from engram_core.rpc.status import abort


class _Malformed:
    """Stands in for a request whose bytes did not decode."""


MALFORMED = _Malformed()


def _safe_parser(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception:
            return MALFORMED

    return deserialize


def _guard_unary(servicer: Any, fn: Callable) -> Callable:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        if request is MALFORMED:
            _refuse(servicer, context)
        return fn(request, context)

    return handler


def _guard_stream(servicer: Any, fn: Callable) -> Callable:
    def handler(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        def checked() -> Iterator[Any]:
            for r in requests:
                if r is MALFORMED:
                    raise EngramError(Code.INVALID_SCHEMA, "undecodable stream message")
                yield r

        return fn(checked(), context)

    return handler


def _refuse(servicer: Any, context: grpc.ServicerContext) -> None:
    bind = getattr(servicer, "bind", None)
    try:
        if bind is not None:
            bind(context, calls=ANY_CALLS)  # its nonce is spent: the context cannot act afterwards
    except EngramError as exc:
        abort(context, exc)
    abort(context, EngramError(Code.INVALID_SCHEMA, "undecodable request"))


def add_servicer(server: grpc.Server, servicer: Any, service: ServiceDescriptor) -> None:
    handlers = {}
    for method in service.methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        fn = getattr(servicer, method.name)
        parse = _safe_parser(request_cls.FromString)
        out = response_cls.SerializeToString
        if method.client_streaming and method.server_streaming:
            h = grpc.stream_stream_rpc_method_handler(_guard_stream(servicer, fn), parse, out)
        elif method.client_streaming:
            h = grpc.stream_unary_rpc_method_handler(_guard_stream(servicer, fn), parse, out)
        elif method.server_streaming:
            h = grpc.unary_stream_rpc_method_handler(_guard_unary(servicer, fn), parse, out)
        else:
            h = grpc.unary_unary_rpc_method_handler(_guard_unary(servicer, fn), parse, out)
        handlers[method.name] = h
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
