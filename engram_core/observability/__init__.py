"""Operability: structured call logs, Prometheus metrics, OpenTelemetry traces.

One module per signal (``logs``, ``metrics``, ``tracing``), fed from two places only: the
gRPC server interceptor (``interceptor``: one observation per call) and thin wrappers around
the ports whose latency operators watch (``ports``: policy decisions, embeddings, commits).
Nothing here ever sees content: observations hold identifiers, codes, reason codes and
durations (docs/operations.md lists every field).
"""
