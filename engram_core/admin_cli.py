"""`engram admin --core HOST:PORT --host-key FILE <command>`: maintenance over AdminService.

Each call is signed with the host key as a host principal holding the
maintenance scopes; the core's policy decides whether that is enough.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc

HOST_PRINCIPAL = "host:operator"


def admin_metadata(host_key_path: str, *, tenant: str = "_host", workspace: str = "_admin",
                   scopes: tuple[str, ...] = ("read", "maintain"), epoch: int = 0) -> list[tuple[str, bytes]]:
    from engram_core.hostctx import CONTEXT_METADATA_KEY, make_context
    from engram_core.hostkeys import load_private_key_file

    key = load_private_key_file(host_key_path)
    ctx = make_context(key, tenant=tenant or "_host", workspace=workspace or "_admin", principal=HOST_PRINCIPAL,
                       agent_id="engram-admin-cli", session="cli", now_ms=time.time_ns() // 1_000_000,
                       host_principal=True, maintenance_scopes=scopes, memory_enabled=False,
                       authorization_epoch=epoch)
    return [(CONTEXT_METADATA_KEY, ctx)]


def _print(args: argparse.Namespace, value: dict[str, Any], human: str) -> None:
    if args.json:
        print(json.dumps(value, sort_keys=True))
    else:
        print(human)


def _activation(args: argparse.Namespace, *, activated: bool) -> int:
    from engram_core.api import admin_pb2, admin_pb2_grpc

    with grpc.insecure_channel(args.core) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        rpc = stub.Activate if activated else stub.Deactivate
        result = rpc(admin_pb2.ActivateRequest(tenant=args.tenant, workspace=args.workspace, tools=args.tool or []),
                     metadata=admin_metadata(args.host_key), timeout=args.timeout)
    value = json.loads(result.json)
    state = "active" if value["activated"] else "inactive"
    _print(args, value, f"{value['tenant']}/{value['workspace']}: memory {state}; tools: {', '.join(value['tools']) or '(none)'}")
    return 0


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=30.0, help="per-call deadline in seconds")
    sub = parser.add_subparsers(dest="admin_command", required=True)
    for name, activated in (("activate", True), ("deactivate", False)):
        p = sub.add_parser(name, help=f"{name} memory (or single tools) for a tenant+workspace")
        p.add_argument("--tenant", required=True)
        p.add_argument("--workspace", required=True)
        p.add_argument("--tool", action="append", help="only this tool (repeatable); default all six")
        p.set_defaults(func=lambda a, act=activated: _run(a, lambda: _activation(a, activated=act)))
    try:
        from engram_core.maintenance_cli import register_more
    except ImportError:
        return
    register_more(sub, _run)


def _run(args: argparse.Namespace, fn) -> int:
    from engram_core.errors import MESSAGES
    from engram_core.rpc.status import code_from_rpc_error

    if not Path(args.host_key).exists():
        print(f"engram admin: host key {args.host_key} not found", file=sys.stderr)
        return 2
    try:
        return fn()
    except grpc.RpcError as err:
        code = code_from_rpc_error(err)
        if args.json:
            print(json.dumps({"ok": False, "code": code.value, "message": MESSAGES[code]}))
        else:
            print(f"engram admin: {code.value}: {MESSAGES[code]}", file=sys.stderr)
        return 1
