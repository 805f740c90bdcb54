"""`engram serve`: the core gRPC service on a data directory."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the core gRPC service")
    p.add_argument("--data", required=True, help="data directory (database, store key, host.key)")
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (default: %(default)s)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--policies", default=None, help="policy bundle directory (default: bundled policies/)")
    group.add_argument("--opa-url", default=None, help="ask an OPA server over its REST Data API instead")
    p.add_argument("--trust-host-key", action="append", default=[], metavar="PEM_FILE",
                   help="also trust this host public key as the operator's own, like DIR/host.key: every tenant "
                        "and maintenance scope (repeatable; trust a tenant's host with `engram admin "
                        "trust-host-key --tenant T` instead)")
    p.add_argument("--audit-device", action="append", default=[], metavar="SPEC",
                   help="also stream every audit row here before the call answers, outside the data directory: "
                        "file:/path[?fsync=1] or unix:/socket (repeatable; a call fails closed when no device "
                        "accepts its row)")
    tls = p.add_argument_group("transport security (docs/security.md)")
    tls.add_argument("--tls-cert", default=None, metavar="PEM_FILE", help="serve TLS with this certificate chain")
    tls.add_argument("--tls-key", default=None, metavar="PEM_FILE", help="the private key of --tls-cert")
    tls.add_argument("--client-ca", default=None, metavar="PEM_FILE",
                     help="mutual TLS: accept only clients with a certificate signed by this CA")
    tls.add_argument("--insecure", action="store_true",
                     help="serve plaintext on an address other hosts can reach (refused without this)")
    from engram_core.cli.observability import add_observability_flags

    add_observability_flags(p, drain=True)

    def run(args: argparse.Namespace) -> int:
        from engram_core.rpc.serve import serve_main

        return serve_main(args)

    p.set_defaults(func=run)
