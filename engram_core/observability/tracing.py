"""OpenTelemetry traces, off by default.

On when ``--otel`` is given or the standard environment asks for it (``OTEL_TRACES_EXPORTER``
other than ``none``, or ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).
The exporter is the SDK's OTLP/gRPC one, configured by the usual ``OTEL_EXPORTER_OTLP_*``
variables, or ``console`` (JSON spans on stderr: stdout is the MCP wire on stdio). The service
name comes from ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` when set, sampling from
``OTEL_TRACES_SAMPLER``: the SDK reads them.

The provider is kept here rather than installed as OpenTelemetry's global one: a test process
runs a core and an adapter with providers of their own, and the global can be set only once.
Span attributes are identifiers, names, counts and codes; never memory text, query text or secrets.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

_provider: Any = None  # opentelemetry.sdk.trace.TracerProvider while tracing is on
_tracer: Any = None
_NULL = contextlib.nullcontext()

F = TypeVar("F", bound=Callable[..., Any])


def wanted(flag: bool = False, env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return flag or bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter_from_env() -> Any:
    name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower() or "otlp"
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stderr)
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r} is not supported (otlp, console or none)")
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    if protocol != "grpc":
        raise ValueError(f"OTLP protocol {protocol!r} is not supported; use grpc")
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def configure(service_name: str, *, exporter: Any = None, batch: bool = True) -> Any:
    """Turn tracing on for this process; returns the tracer provider. ``exporter`` overrides the
    environment's (tests pass an in-memory one, with ``batch=False`` to export on span end)."""
    global _provider, _tracer
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({SERVICE_NAME: service_name}) if not os.environ.get("OTEL_SERVICE_NAME") \
        else Resource.create()
    provider = TracerProvider(resource=resource)
    exporter = exporter if exporter is not None else _exporter_from_env()
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("engram")
    return provider


def shutdown() -> None:
    """Flush and stop exporting (at process exit)."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider, _tracer = None, None


def provider() -> Any:
    return _provider


def enabled() -> bool:
    return _tracer is not None


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one while tracing is on; a shared no-op otherwise."""
    tracer = _tracer
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(name, attributes=attributes or None)


def server_span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span of kind SERVER (the root of a trace begun by an incoming request)."""
    tracer = _tracer
    if tracer is None:
        return _NULL
    from opentelemetry.trace import SpanKind

    return tracer.start_as_current_span(name, kind=SpanKind.SERVER, attributes=attributes or None)


def client_interceptors() -> list[Any]:
    """gRPC aio client interceptors that start a CLIENT span per call and send its context as
    W3C ``traceparent`` metadata; none while tracing is off."""
    if _tracer is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=_provider))


def traced(name: str) -> Callable[[F], F]:
    """Decorator form of ``span`` for a whole function."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if _tracer is None:
                return fn(*args, **kwargs)
            with _tracer.start_as_current_span(name):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def set_attributes(**attributes: Any) -> None:
    """Attributes on the current span (no-op when tracing is off)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(attributes)

