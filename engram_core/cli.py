"""The `engram` console script (SPEC §14). Subcommands import lazily so that
`engram policy test` does not start gRPC and `engram serve` does not load the
MCP SDK."""

from __future__ import annotations

import argparse
import sys


def _serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the core gRPC service")
    p.add_argument("--data", required=True, help="data directory (database, store key, host.key)")
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (default 127.0.0.1:50051)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--policies", default=None, help="policy bundle directory (default: bundled policies/)")
    group.add_argument("--opa-url", default=None, help="ask an OPA server over its REST Data API instead")
    p.add_argument("--trust-host-key", action="append", default=[], metavar="PEM_FILE",
                   help="also trust this host public key (repeatable)")

    def run(args: argparse.Namespace) -> int:
        from engram_core.rpc.serve import serve_main

        return serve_main(args)

    p.set_defaults(func=run)


def _mcp(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mcp", help="run the MCP adapter (stdio by default)")
    p.add_argument("--host-config", required=True, help="TOML host binding file")
    p.add_argument("--http", default=None, metavar="HOST:PORT", help="serve streamable HTTP instead of stdio")

    def run(args: argparse.Namespace) -> int:
        from adapters.mcp.main import mcp_main

        return mcp_main(args)

    p.set_defaults(func=run)


def _admin(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("admin", help="host maintenance through AdminService")
    p.add_argument("--core", default="127.0.0.1:50051", help="core address HOST:PORT")
    p.add_argument("--host-key", required=True, help="host signing key (PEM)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    from engram_core.admin_cli import register

    register(p)


def _policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="policy bundle tooling")
    from engram_core.policy.cli import register

    register(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engram", description="Engram: governed long-term memory for agents")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve(sub)
    _mcp(sub)
    _admin(sub)
    _policy(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
