"""`engram serve`: the core gRPC service on a data directory."""

from __future__ import annotations

import argparse
import re

_DURATION = re.compile(r"^(0|[0-9]+(ms|s|m|h|d))$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """``12h``, ``30m``, ``7d``, ``90s``, ``250ms`` or ``0``, in milliseconds."""
    found = _DURATION.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 15m, 12h, 7d, or 0)")
    if text.strip() == "0":
        return 0
    number = int(text.strip()[: -len(found.group(2))])
    return number * _UNIT_MS[found.group(2)]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the core gRPC service")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--data", help="data directory of the embedded DuckDB store (database, keys, host.key)")
    where.add_argument("--store", metavar="URL",
                       help="a PostgreSQL store several cores share: postgresql://USER@HOST:PORT/DB, a libpq "
                            "key=value string or a service name; the password only from PGPASSFILE or the libpq "
                            "environment, never in URL (refused); needs --key-dir")
    p.add_argument("--key-dir", metavar="DIR",
                   help="with --store: the directory of the KEK ring and the other secrets (host.key, index.key, "
                        "page.key, ...), the same files on every core of the store")
    p.add_argument("--index-max-records", type=int, default=0, metavar="N",
                   help="with --store: each scope's search index is loaded on first use; keep at most N records "
                        "indexed, evicting the least recently used scopes (default 0: no budget)")
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (default: %(default)s)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--policies", default=None,
                       help="policy bundle directory or bundle archive (.tar.gz) (default: bundled policies/)")
    group.add_argument("--opa-url", default=None, help="ask an OPA server over its REST Data API instead")
    group.add_argument("--bundle-url", default=None, metavar="URL",
                       help="pull the bundle archive from an OPA-compatible bundle server (HTTP GET with ETag, "
                            "polled; every replica pointed at it converges on its revision)")
    bundles = p.add_argument_group("policy bundles and decision logs (docs/policies.md)")
    bundles.add_argument("--bundle-verification-key", default=None, metavar="PEM_FILE",
                         help="refuse bundles whose .signatures.json does not verify with this public key "
                              "(unsigned or tampered bundles are refused at start and at every reload)")
    bundles.add_argument("--bundle-allow-rollback", default=None, metavar="REVISION",
                         help="with --bundle-verification-key: allow activating this one revision once even "
                              "though it was signed before the bundle accepted last (signed bundles are "
                              "otherwise never rolled back; logged and recorded)")
    bundles.add_argument("--bundle-poll-min-seconds", type=float, default=10.0, metavar="S",
                         help="with --bundle-url: wait at least S seconds between polls (default: %(default)s)")
    bundles.add_argument("--bundle-poll-max-seconds", type=float, default=20.0, metavar="S",
                         help="with --bundle-url: and at most S (random in between; also the backoff cap) "
                              "(default: %(default)s)")
    bundles.add_argument("--bundle-bearer-token-file", default=None, metavar="FILE",
                         help="with --bundle-url: send Authorization: Bearer <the file's content>")
    bundles.add_argument("--decision-log", default=None, metavar="SINK",
                         help="log every policy decision, masked by the bundle's engram.log.mask: file:PATH, "
                              "an http(s):// decision-log service (OPA's upload format), or a .toml file with a "
                              "[decision_log] section (off by default)")
    p.add_argument("--trust-host-key", action="append", default=[], metavar="PEM_FILE",
                   help="also trust this host public key as the operator's own, like DIR/host.key: every tenant "
                        "and maintenance scope (repeatable; trust a tenant's host with `engram admin "
                        "trust-host-key --tenant T` instead)")
    p.add_argument("--audit-device", action="append", default=[], metavar="SPEC",
                   help="also stream every audit row here before the call answers, outside the data directory: "
                        "file:/path[?fsync=1] or unix:/socket (repeatable; a call fails closed when no device "
                        "accepts its row)")
    keys = p.add_argument_group("KEK generations (docs/admin.md, \"Keys\")")
    keys.add_argument("--key-rotation-interval", default="24h", type=duration_ms, metavar="DURATION",
                      help="make a new KEK generation active this often, re-wrapping every live data key "
                           "(e.g. 12h, 7d; 0: only on `engram admin rotate-keys`; default: %(default)s)")
    keys.add_argument("--key-retention", default="24h", type=duration_ms, metavar="DURATION",
                      help="keep a generation, unwrapping only, this long after it stopped being active, then "
                           "retire it: backups and key copies made under it restore until then, and a "
                           "forgotten key's destruction completes then (default: %(default)s)")
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
        from engram_core.cli.serve_main import serve_main

        return serve_main(args)

    p.set_defaults(func=run)
