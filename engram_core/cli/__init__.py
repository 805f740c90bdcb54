"""The `engram` console script: one module per command group (init, serve,
mcp, doctor, admin, policy). Command groups import their machinery lazily so that `engram policy
test` does not start gRPC and `engram serve` does not load the MCP SDK."""

from __future__ import annotations

import argparse
import os
import signal
import sys


def _admin(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("admin", help="host maintenance through AdminService")
    p.add_argument("--core", default="127.0.0.1:50051", help="core address HOST:PORT (default: %(default)s)")
    p.add_argument("--host-key", default="", help="host signing key (PEM); every command but migrate-store needs it")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    from engram_core.cli.admin import register
    from engram_core.cli.channel import add_tls_flags

    add_tls_flags(p)
    register(p)


def _policy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("policy", help="policy bundle tooling")
    from engram_core.cli.policy import register

    register(p)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: what `--help` prints at every level, and what the docs' synopses
    are checked against (tests/admin/test_docs_match_code.py)."""
    from engram_core.cli import console, doctor, init, mcp, serve

    parser = argparse.ArgumentParser(prog="engram", description="Engram: governed long-term memory for agents")
    sub = parser.add_subparsers(dest="command", required=True)
    init.register(sub)
    serve.register(sub)
    mcp.register(sub)
    doctor.register(sub)
    console.register(sub)
    _admin(sub)
    _policy(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that left shows here, not as an error at interpreter exit
        return code
    except BrokenPipeError:
        # `engram init | head`: the reader stopped reading, which is its right, not our failure.
        # Point stdout at /dev/null so the interpreter's own final flush stays quiet too, and
        # exit as a process killed by SIGPIPE would (what `set -o pipefail` expects).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except ModuleNotFoundError as exc:
        if exc.name != "opa_bindings":
            raise
        from engram_core.policy import OPA_BINDINGS_HINT

        print(f"engram: {OPA_BINDINGS_HINT}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
