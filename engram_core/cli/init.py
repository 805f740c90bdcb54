"""`engram init [DIR]`: a data directory, a host TOML beside it, and the exact next steps.

The first five minutes of a new user: after `engram init` and `engram serve --data DIR`,
an MCP client registered with the printed command can capture and search. The scope the
host TOML binds is written to ``DIR/init.toml``; the first `engram serve` on DIR activates it
(once: a scope the operator later deactivates stays deactivated).

The host TOML also names a bearer token file beside it (``<name>.token``, 0600, made once and
kept): `engram mcp --http` requires that token on every bind, loopback included, because other
users of the machine reach a loopback port too (issue 26). The printed HTTP registrations send it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import secrets
import shlex
import sys
import tomllib
from pathlib import Path

from engram_core.contract.scope import Scope

INIT_FILE = "init.toml"
DEFAULT_CORE = "127.0.0.1:50051"
DEFAULT_DATA_DIR = "engram-data"
DEFAULT_TENANT = "local"
DEFAULT_WORKSPACE = "default"
DEFAULT_PURPOSE = "purpose:default"
DEFAULT_HTTP_LISTEN = "127.0.0.1:8765"  # what the printed `engram mcp --http` line serves on
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def read_first_serve_scope(data_dir: Path) -> Scope | None:
    """The scope `engram serve` activates on its first start on DIR, named by ``DIR/init.toml``;
    None when DIR was not made by `engram init`."""
    path = data_dir / INIT_FILE
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path} is unreadable ({type(exc).__name__})") from None
    table = doc.get("first_serve")
    if not isinstance(table, dict):
        return None
    tenant, workspace = table.get("activate_tenant"), table.get("activate_workspace")
    if not (isinstance(tenant, str) and tenant and isinstance(workspace, str) and workspace):
        raise ValueError(f"{path}: [first_serve] needs activate_tenant and activate_workspace")
    return Scope(tenant, workspace)


def _named(host_config: Path) -> tuple[str | None, Path | None]:
    """The ``[core] address`` and the ``[host] signing_key`` (resolved as the adapter resolves it,
    against the file's directory) an existing host TOML names; None for what it does not name
    or when it is unreadable."""
    try:
        doc = tomllib.loads(host_config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None, None
    core, host = doc.get("core"), doc.get("host")
    address = core.get("address") if isinstance(core, dict) else None
    key = host.get("signing_key") if isinstance(host, dict) else None
    return (address if isinstance(address, str) else None,
            (host_config.parent / Path(key).expanduser()).resolve() if isinstance(key, str) and key else None)


def _kept_config_warning(host_config: Path, *, core: str | None, host_key: Path, data_dir: Path) -> str | None:
    """One line when a kept host TOML would not reach the core serving ``data_dir`` at ``core``:
    another address (tools/serve after a change of ENGRAM_LISTEN) or another data directory's key
    (ENGRAM_DATA changed, the host TOML beside both is the same file). None when it would."""
    named_core, named_key = _named(host_config)
    problems = []
    if core and named_core is not None and named_core != core:
        problems.append(f"names core {named_core}, not {core}; the adapter would call {named_core}")
    if named_key is not None and named_key != host_key.resolve():
        problems.append(f"signs with {named_key}, not {host_key} (the key the core serving {data_dir} trusts "
                        "by itself)")
    if not problems:
        return None
    rewrite = shlex.join([_engram_command(), "init", str(data_dir), "--host-config", str(host_config),
                          "--core", core or named_core or DEFAULT_CORE, "--force"])
    return (f"engram init: {host_config} {'; and it '.join(problems)}. Rewrite it: {rewrite} "
            "(or keep it and write another with --host-config FILE; tools/serve: ENGRAM_HOST_CONFIG=FILE)")


def _quote(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for these characters


def host_toml(*, core: str, signing_key: str, tenant: str, workspace: str, principal: str,
              token_file: str | None = None) -> str:
    return f"""# Engram host configuration for `engram mcp --host-config FILE` (written by `engram init`).
# The adapter binds every tool call to the identity below; the agent never chooses it.
# Relative paths are resolved against this file's directory. See docs/mcp-clients.md.

[core]
address = {_quote(core)}          # the `engram serve` to talk to
deadline_ms = 10000                  # per-call deadline

[host]
signing_key = {_quote(signing_key)}   # Ed25519 key the core trusts (the core's own DIR/host.key)
memory_enabled = true                # host opt-in; false hides every tool
confirmation_timeout_ms = 120000     # how long a human has to answer a confirmation

[binding]
tenant = {_quote(tenant)}
workspace = {_quote(workspace)}
principal = {_quote(principal)}
agent_id = "agent-1"
session = "default"
purpose_ref = {_quote(DEFAULT_PURPOSE)}
""" + ("" if token_file is None else f"""
[http]                               # `engram mcp --http`: every client sends this token
token_file = {_quote(token_file)}     # 0600, only you can read it; never commit or share it
""")


def token_file_beside(host_config: Path) -> Path:
    return host_config.with_name(host_config.stem + ".token")


def ensure_token_file(path: Path) -> tuple[str, bool]:
    """(the bearer token in ``path``, whether it was made now): made once, 0600 from the start
    (never readable by others, not even for a moment), and kept on later runs."""
    if path.exists():
        return path.read_text(encoding="utf-8").strip(), False
    value = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(value + "\n")
    return value, True


def _named_token_file(host_config: Path) -> Path | None:
    """The ``[http] token_file`` an existing host TOML names, or None."""
    try:
        doc = tomllib.loads(host_config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    http = doc.get("http")
    named = http.get("token_file") if isinstance(http, dict) else None
    if not isinstance(named, str):
        return None
    path = Path(named).expanduser()
    return path if path.is_absolute() else host_config.parent / path


def _engram_command() -> str:
    beside = Path(sys.executable).with_name("engram")
    return str(beside.resolve()) if beside.exists() else "engram"


def client_instructions(engram: str, host_config: Path) -> str:
    """Copy-paste registrations of the stdio adapter for the common MCP clients."""
    args = ["mcp", "--host-config", str(host_config)]
    stdio = {"command": engram, "args": args}
    claude = json.dumps({"mcpServers": {"engram": stdio}}, indent=2)
    vscode = json.dumps({"servers": {"engram": {"type": "stdio", **stdio}}}, indent=2)
    indent = lambda text: "\n".join("      " + line for line in text.splitlines())  # noqa: E731
    return "\n".join([
        "    Claude Code:",
        f"      claude mcp add engram -- {shlex.join([engram, *args])}",
        "    Claude Desktop (claude_desktop_config.json) and Cursor (~/.cursor/mcp.json):",
        indent(claude),
        "    VS Code (.vscode/mcp.json):",
        indent(vscode),
        "    Any other stdio client: run",
        f"      {shlex.join([engram, *args])}",
    ])


def http_instructions(engram: str, host_config: Path, token_file: Path | None, token: str | None) -> str:
    """The HTTP adapter and each client's registration of it, with the bearer token it requires."""
    url = f"http://{DEFAULT_HTTP_LISTEN}/mcp"
    serve = shlex.join([engram, "mcp", "--host-config", str(host_config), "--http", DEFAULT_HTTP_LISTEN])
    if token_file is None or token is None:
        return "\n".join([
            f"    Over HTTP instead ({serve}): {host_config} names no [http] token_file, so the",
            "    adapter refuses to serve HTTP; rewrite it with --force to get one (docs/mcp-clients.md §3).",
        ])
    # The token itself is never printed (docs/mcp-clients.md): each registration reads it from the
    # file at the moment it is used, or says which file to paste it from.
    read = f"$(cat {shlex.quote(str(token_file))})"
    cursor = json.dumps({"mcpServers": {"engram": {"url": url,
                                                   "headers": {"Authorization": "Bearer ${env:ENGRAM_MCP_TOKEN}"}}}},
                        indent=2)
    vscode = json.dumps({"servers": {"engram": {"type": "http", "url": url,
                                                "headers": {"Authorization": "Bearer ${input:engram-token}"}}},
                         "inputs": [{"id": "engram-token", "type": "promptString", "password": True,
                                     "description": f"the token in {token_file}"}]}, indent=2)
    desktop = json.dumps({"mcpServers": {"engram": {
        "command": "npx", "args": ["-y", "mcp-remote", url, "--allow-http", "--header", "Authorization:${ENGRAM_AUTH}"],
        "env": {"ENGRAM_AUTH": f"Bearer <the token in {token_file}>"}}}}, indent=2)
    indent = lambda text: "\n".join("      " + line for line in text.splitlines())  # noqa: E731
    return "\n".join([
        "    Or over HTTP, one adapter for several clients on this machine:",
        f"      {serve}",
        f"      Every request needs the token in {token_file} (0600: yours alone; other users of",
        "      this machine reach 127.0.0.1 too, so the adapter refuses anything without it).",
        f"      It is not printed here: read it with  cat {shlex.quote(str(token_file))}",
        "    Claude Code (HTTP):",
        f"      claude mcp add --transport http engram {url} --header \"Authorization: Bearer {read}\"",
        f"    Cursor (~/.cursor/mcp.json, HTTP; start Cursor with ENGRAM_MCP_TOKEN={read} in its environment):",
        indent(cursor),
        "    VS Code (.vscode/mcp.json, HTTP; it asks for the token once and keeps it in its secret storage):",
        indent(vscode),
        "    Claude Desktop (claude_desktop_config.json, HTTP through the mcp-remote bridge; paste the token):",
        indent(desktop),
    ])


def run_init(args: argparse.Namespace) -> int:
    from engram_core.trust.hostkeys import load_or_create_private_key

    data_dir = Path(args.dir).expanduser().resolve()
    host_config = Path(args.host_config).expanduser().resolve() if args.host_config else \
        data_dir.parent / "host.toml"
    if data_dir.exists() and not data_dir.is_dir():
        print(f"engram init: {data_dir} exists and is not a directory", file=sys.stderr)
        return 2
    store = getattr(args, "store", None)
    if store is not None:
        from engram_core.app.engines import store_conninfo

        try:
            store_conninfo(store)  # a password in the URL is refused before anything is written
        except ValueError as exc:
            print(f"engram init: {exc}", file=sys.stderr)
            return 2
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    host_key = data_dir / "host.key"
    load_or_create_private_key(host_key)  # the same key the core creates and trusts on first serve

    init_file = data_dir / INIT_FILE
    scope = read_first_serve_scope(data_dir)
    if store is not None:
        # Cores over a shared store may be running already: a first-serve activation would wait for
        # a restart, so the operator activates the scope now (a step below), and DIR, the shared key
        # directory, gets no init.toml.
        scope = scope or Scope(args.tenant, args.workspace)
    elif scope is None:
        scope = Scope(args.tenant, args.workspace)
        init_file.write_text(
            "# Written by `engram init`: the scope the first `engram serve` on this directory activates.\n"
            "[first_serve]\n"
            f"activate_tenant = {_quote(scope.tenant)}\nactivate_workspace = {_quote(scope.workspace)}\n",
            encoding="utf-8")
        os.chmod(init_file, 0o600)

    core = args.core or DEFAULT_CORE
    token_file: Path | None = token_file_beside(host_config)
    if host_config.exists() and not args.force:
        token_file = _named_token_file(host_config)
        wrote = f"kept the existing {host_config} (--force rewrites it)"
        # Said now rather than found later by doctor (or not at all, by an adapter calling a core
        # that is not this one).
        warning = _kept_config_warning(host_config, core=args.core, host_key=host_key, data_dir=data_dir)
        if warning:
            print(warning, file=sys.stderr)
    else:
        principal = "agent:" + (_NAME.sub("-", getpass.getuser()) or "local")
        try:
            key_ref = str(host_key.relative_to(host_config.parent))
        except ValueError:
            key_ref = str(host_key)
        host_config.parent.mkdir(parents=True, exist_ok=True)
        host_config.write_text(host_toml(core=core, signing_key=key_ref, tenant=scope.tenant,
                                         workspace=scope.workspace, principal=principal,
                                         token_file=token_file.name if token_file else None), encoding="utf-8")
        os.chmod(host_config, 0o600)
        wrote = f"wrote {host_config} (binds {scope.tenant}/{scope.workspace} as {principal})"

    token = ensure_token_file(token_file)[0] if token_file is not None else None
    engram = _engram_command()
    if store is not None:
        steps = [
            f"Start each core:    {shlex.join([engram, 'serve', '--store', store, '--key-dir', str(data_dir), '--listen', core])}"
            "\n     (every core mounts this key directory; the first one creates the KEK ring and secrets in it;"
            "\n     with a role without DDL rights, first: engram admin migrate --store URL as the schema's owner)",
            "Activate the scope: " + shlex.join([engram, "admin", "--core", core, "--host-key", str(host_key),
                                                 "activate", "--tenant", scope.tenant, "--workspace", scope.workspace]),
        ]
    else:
        steps = [] if args.serving else \
            [f"Start the core:     {shlex.join([engram, 'serve', '--data', str(data_dir), '--listen', core])}"]
    steps += [
        f"Check the chain:    {shlex.join([engram, 'doctor', '--host-config', str(host_config)])}"
        + ("   (in another terminal, once the core below says it is listening)" if args.serving else ""),
        "Register the adapter with your MCP client:\n" + client_instructions(engram, host_config)
        + "\n" + http_instructions(engram, host_config, token_file, token),
    ]
    what = (f"key directory {data_dir} (of the PostgreSQL store {store})" if store is not None
            else f"data directory {data_dir}")
    activation = (f"engram init: activate {scope.tenant}/{scope.workspace} with step 2 (cores over a shared store "
                  "may be running already)" if store is not None
                  else f"engram init: the first `engram serve` on it activates {scope.tenant}/{scope.workspace}")
    print("\n".join([
        f"engram init: {what}",
        f"engram init: {wrote}",
        activation,
        "",
        "Next:",
        *(f"  {number}. {step}" for number, step in enumerate(steps, start=1)),
        "  Clients that can ask a human (MCP elicitation) can confirm forget and withdraw; see docs/mcp-clients.md.",
    ]))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="create a data directory and a host config, and print how to connect clients")
    p.add_argument("dir", nargs="?", default=DEFAULT_DATA_DIR, help="data directory (default: %(default)s)")
    p.add_argument("--host-config", default=None,
                   help="where to write the host TOML (default: host.toml beside the data directory)")
    p.add_argument("--core", default=None, help=f"core address the host TOML names (default: {DEFAULT_CORE})")
    p.add_argument("--tenant", default=DEFAULT_TENANT, help="tenant of the first scope (default: %(default)s)")
    p.add_argument("--workspace", default=DEFAULT_WORKSPACE, help="workspace of the first scope (default: %(default)s)")
    p.add_argument("--store", default=None, metavar="URL",
                   help="cores serve a PostgreSQL store (engram serve --store URL --key-dir DIR): DIR is their "
                        "shared key directory; the next steps say how to serve it and activate the scope")
    p.add_argument("--force", action="store_true", help="rewrite an existing host TOML")
    p.add_argument("--serving", action="store_true",
                   help="the caller starts the core next (tools/serve): leave that step out of the next steps")
    p.set_defaults(func=run_init)
