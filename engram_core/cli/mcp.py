"""`engram mcp`: the MCP adapter (stdio by default, streamable HTTP with --http).

The adapter knows a core by its address; for ``[core] embedded = true`` this command starts one
in-process through the composition root and hands it over (``start_embedded_core``), so the
adapter never imports the core's wiring.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def start_embedded_core(data_dir: Path, registry: Any) -> Any:
    """The embedded core of ``engram mcp``: served on a loopback port, its data directory
    owner-only, its metrics on the adapter's registry (``registry`` None: no metrics)."""
    from engram_core.app.composition import start_core
    from engram_core.observability.metrics import CoreMetrics
    from engram_core.store.file_modes import private_umask

    private_umask()  # the embedded core's data directory: owner-only files
    return start_core(data_dir, metrics=CoreMetrics(registry=registry) if registry is not None else None)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="run the MCP adapter (stdio by default)")
    p.add_argument("--host-config", required=True, help="TOML host binding file")
    p.add_argument("--http", default=None, metavar="HOST:PORT", help="serve streamable HTTP instead of stdio")
    from engram_core.cli.observability import add_observability_flags

    add_observability_flags(p)

    def run(args: argparse.Namespace) -> int:
        from adapters.mcp.main import mcp_main

        return mcp_main(args, embedded_core=start_embedded_core)

    p.set_defaults(func=run)
