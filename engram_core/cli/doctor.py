"""`engram doctor --host-config FILE`: walk the chain an agent's tool call takes (host
config, core, key trust, opt-in, scope and tools, semantic channel) and say what to fix."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check host config, core, key trust, scope and tools; say what to fix")
    p.add_argument("--host-config", required=True, help="the TOML file `engram mcp` uses")

    def run(args: argparse.Namespace) -> int:
        from adapters.mcp.diagnosis import diagnose

        return diagnose(args.host_config)

    p.set_defaults(func=run)
