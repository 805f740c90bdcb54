"""`engram console`: the web console (docs/console.md), a host service of its own.

It reaches the core like `engram admin` does (gRPC, its own trusted host key, the same TLS flags
to the core) and serves its pages on loopback by default; a reachable address needs TLS or an
explicit --insecure, as `engram serve` requires.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("console", help="the web console: review queue, audit, keys (docs/console.md)")
    p.add_argument("--config", default=None, metavar="TOML", help="read the [console] table of this file (flags win)")
    p.add_argument("--core", default=None, help="core address HOST:PORT (default: 127.0.0.1:50051)")
    p.add_argument("--host-key", default=None, metavar="PEM", help="the console's own trusted host signing key")
    p.add_argument("--listen", default=None, metavar="HOST:PORT", help="where to serve pages (default: 127.0.0.1:8780)")
    p.add_argument("--public-url", default=None, metavar="URL",
                   help="how browsers reach the console, if not http(s)://LISTEN (the OpenID redirect URI's base)")
    p.add_argument("--scope", action="append", default=None, metavar="TENANT/WORKSPACE",
                   help="a tenant/workspace to serve (repeatable; at least one)")
    p.add_argument("--token-file", default=None, metavar="FILE",
                   help="the local token `engram init` wrote (host.token): sign-in for a single-person install")
    p.add_argument("--oauth-issuer", action="append", default=None, metavar="URL",
                   help="an OpenID issuer people sign in with (repeatable; with --oauth-client-id)")
    p.add_argument("--oauth-client-id", default=None, help="the console's client id at the issuers")
    p.add_argument("--oauth-client-secret-file", default=None, metavar="FILE",
                   help="its client secret, for a confidential client (a public client uses PKCE alone)")
    p.add_argument("--policies", default=None, metavar="DIR", help="the bundle holding engram/console (default: the bundled one)")
    p.add_argument("--insecure", action="store_true", help="serve plaintext on a reachable --listen anyway")
    tls = p.add_argument_group("TLS for the console's pages (as `engram serve` takes them)")
    tls.add_argument("--tls-cert", default=None, metavar="PEM_FILE", help="the pages' certificate (chain)")
    tls.add_argument("--tls-key", default=None, metavar="PEM_FILE", help="its private key")
    core = p.add_argument_group("TLS to the core (what `engram admin` calls --tls-ca, --tls-cert, ...)")
    core.add_argument("--core-tls-ca", default=None, metavar="PEM_FILE", help="trust this CA for the core's certificate")
    core.add_argument("--core-tls-cert", default=None, metavar="PEM_FILE", help="client certificate (mutual TLS)")
    core.add_argument("--core-tls-key", default=None, metavar="PEM_FILE", help="the private key of --core-tls-cert")
    core.add_argument("--core-tls-server-name", default=None, metavar="NAME", help="the name in the core's certificate")
    p.set_defaults(func=run)


def settings_of(args: argparse.Namespace):
    from engram_core.console.settings import ConsoleSettings, from_toml, parse_scope, provider

    s = from_toml(Path(args.config)) if args.config else ConsoleSettings()
    for flag, attr in (("core", "core"), ("host_key", "host_key"), ("listen", "listen"), ("public_url", "public_url"),
                       ("token_file", "token_file"), ("policies", "policies"), ("tls_cert", "tls_cert"),
                       ("tls_key", "tls_key")):
        value = getattr(args, flag)
        if value is not None:
            setattr(s, attr, value)
    s.insecure = s.insecure or args.insecure
    if args.scope:
        s.scopes = [parse_scope(x) for x in args.scope]
    if args.oauth_issuer:
        s.providers = [provider(i, args.oauth_client_id or "", args.oauth_client_secret_file or "")
                       for i in args.oauth_issuer]
    return s


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from engram_core.cli.channel import client_tls
    from engram_core.console.app import build_app
    from engram_core.console.core_client import CoreClient
    from engram_core.console.roles import RoleOracle
    from engram_core.console.settings import ConsoleConfigError
    from engram_core.policy import default_bundle_dir
    from engram_core.rpc.tls import is_loopback_listen

    try:
        s = settings_of(args)
        s.check()
        core_tls = client_tls(argparse.Namespace(
            tls_ca=args.core_tls_ca, tls_cert=args.core_tls_cert, tls_key=args.core_tls_key,
            tls_server_name=args.core_tls_server_name))
    except (ConsoleConfigError, ValueError, OSError) as exc:
        print(f"engram console: {exc}", file=sys.stderr)
        return 2
    if not s.tls and not s.insecure and not is_loopback_listen(s.listen):
        print(f"engram console: --listen {s.listen} is reachable from other hosts: give --tls-cert and "
              "--tls-key, or --insecure to serve plaintext anyway", file=sys.stderr)
        return 2
    host, _, port = s.listen.rpartition(":")
    core = CoreClient(s.core, s.host_key, core_tls)
    roles = RoleOracle(Path(s.policies) if s.policies else default_bundle_dir())
    app = build_app(s, core, roles)
    print(f"engram console: serving {', '.join(str(scope) for scope in s.scopes)} at {s.base_url()}/", file=sys.stderr)
    try:
        uvicorn.run(app, host=host.strip("[]"), port=int(port), log_level="warning",
                    ssl_certfile=s.tls_cert or None, ssl_keyfile=s.tls_key or None, server_header=False)
    finally:
        core.close()
        roles.close()
    return 0
