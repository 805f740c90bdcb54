"""How the command line reaches the core: one channel factory and the host-signed
context every `engram admin` call carries."""

from __future__ import annotations

import argparse
import time

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


def core_channel(args: argparse.Namespace) -> grpc.Channel:
    """The channel to the core named by ``--core`` (the one place transport settings live)."""
    return grpc.insecure_channel(args.core)
