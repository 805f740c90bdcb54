"""The gRPC server's interceptors: OpenTelemetry's, when tracing is on, outside ours so that the
core's spans are children of the call's. (The ports' observers are fitted by the composition
root: ``engram_core.app.observed_ports``.)"""

from __future__ import annotations

from typing import Any

from engram_core.observability import tracing
from engram_core.observability.interceptor import ObservingInterceptor
from engram_core.observability.metrics import CoreMetrics


def server_interceptors(metrics: CoreMetrics | None) -> list[Any]:
    interceptors: list[Any] = []
    if tracing.enabled():
        from opentelemetry.instrumentation.grpc import server_interceptor

        interceptors.append(server_interceptor(tracer_provider=tracing.provider()))
    interceptors.append(ObservingInterceptor(metrics))
    return interceptors
