"""Flags shared by `engram serve` and `engram mcp` for logs, metrics and traces
(docs/operations.md)."""

from __future__ import annotations

import argparse

DEFAULT_DRAIN_S = 10.0


def add_observability_flags(p: argparse.ArgumentParser, *, drain: bool = False) -> None:
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="stderr log lines: text, or one JSON object per line (default: %(default)s)")
    p.add_argument("--metrics", default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default)")
    p.add_argument("--metrics-tenant-labels", action="store_true",
                   help="label call metrics with tenant and workspace (off: only the scope class)")
    p.add_argument("--otel", action="store_true",
                   help="export OpenTelemetry traces (also on when OTEL_TRACES_EXPORTER or "
                        "OTEL_EXPORTER_OTLP_ENDPOINT is set); configured by the OTEL_* variables")
    if drain:
        p.add_argument("--drain-seconds", type=float, default=DEFAULT_DRAIN_S, metavar="S",
                       help="on SIGTERM, let calls in flight finish for up to S seconds (default: %(default)s)")
