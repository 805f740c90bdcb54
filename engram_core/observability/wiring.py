"""Where the core is fitted with its observers: the port wrappers, the store hooks, the
scrape-time levels, and the gRPC server interceptors (OpenTelemetry's, when tracing is on,
outside ours so that the core's spans are children of the call's)."""

from __future__ import annotations

from typing import Any

from engram_core.observability import tracing
from engram_core.observability.interceptor import ObservingInterceptor
from engram_core.observability.metrics import CoreMetrics
from engram_core.observability.ports import ObservedEmbedder, ObservedPolicyEngine, observe_store


def observe_core(core: Any, memory: Any, metrics: CoreMetrics | None) -> None:
    core.policy = ObservedPolicyEngine(core.policy, metrics)
    if core.embedder is not None:
        core.embedder = ObservedEmbedder(core.embedder, metrics)
    observe_store(core.store, metrics)
    if metrics is not None:
        metrics.watch(core, getattr(memory, "pins", None))


def server_interceptors(metrics: CoreMetrics | None) -> list[Any]:
    interceptors: list[Any] = []
    if tracing.enabled():
        from opentelemetry.instrumentation.grpc import server_interceptor

        interceptors.append(server_interceptor(tracer_provider=tracing.provider()))
    interceptors.append(ObservingInterceptor(metrics))
    return interceptors
