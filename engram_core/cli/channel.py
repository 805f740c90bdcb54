"""How the command line reaches the core: one channel factory and the host-signed
context every `engram admin` call carries."""

from __future__ import annotations

import argparse
import time

import grpc

from engram_core.rpc.tls import ClientTls
from engram_core.rpc.tls import channel as tls_channel

HOST_PRINCIPAL = "host:operator"


def admin_metadata(host_key_path: str, *, tenant: str = "_host", workspace: str = "_admin",
                   scopes: tuple[str, ...] = ("read", "maintain"), epoch: int = 0,
                   call: str = "admin") -> list[tuple[str, bytes]]:
    """A host context for one call: ``call`` "admin" for AdminService, "host" for HostService."""
    from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, make_context
    from engram_core.trust.hostkeys import load_private_key_file

    key = load_private_key_file(host_key_path)
    ctx = make_context(key, call=call, tenant=tenant or "_host", workspace=workspace or "_admin",
                       principal=HOST_PRINCIPAL,
                       agent_id="engram-admin-cli", session="cli", now_ms=time.time_ns() // 1_000_000,
                       host_principal=True, maintenance_scopes=scopes, memory_enabled=False,
                       authorization_epoch=epoch)
    return [(CONTEXT_METADATA_KEY, ctx)]


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    """The client side of the core's TLS (`engram serve --tls-cert/--tls-key/--client-ca`)."""
    group = parser.add_argument_group("TLS to the core")
    group.add_argument("--tls-ca", default=None, metavar="PEM_FILE",
                       help="connect over TLS, trusting the CA that signed the core's certificate")
    group.add_argument("--tls-cert", default=None, metavar="PEM_FILE",
                       help="client certificate, for a core started with --client-ca (mutual TLS)")
    group.add_argument("--tls-key", default=None, metavar="PEM_FILE", help="the private key of --tls-cert")
    group.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="the name the core's certificate carries, if not the --core host")


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """TLS settings from the flags of :func:`add_tls_flags`; ValueError names what is wrong."""
    ca, cert, key, name = (getattr(args, n, None) for n in ("tls_ca", "tls_cert", "tls_key", "tls_server_name"))
    if not ca:
        if cert or key or name:
            raise ValueError("--tls-cert, --tls-key and --tls-server-name need --tls-ca")
        return None
    try:
        return ClientTls.from_files(ca, cert, key, name)
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename} ({exc.strerror})") from None


def core_channel(args: argparse.Namespace) -> grpc.Channel:
    """The channel to the core named by ``--core`` (the one place transport settings live)."""
    return tls_channel(args.core, client_tls(args))
