"""`engram mcp`: the MCP adapter (stdio by default, streamable HTTP with --http)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="run the MCP adapter (stdio by default)")
    p.add_argument("--host-config", required=True, help="TOML host binding file")
    p.add_argument("--http", default=None, metavar="HOST:PORT", help="serve streamable HTTP instead of stdio")
    from engram_core.cli.observability import add_observability_flags

    add_observability_flags(p)

    def run(args: argparse.Namespace) -> int:
        from adapters.mcp.main import mcp_main

        return mcp_main(args)

    p.set_defaults(func=run)
