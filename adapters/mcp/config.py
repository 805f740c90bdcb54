"""The host configuration file of `engram mcp --host-config FILE` (SPEC §14).

TOML with these sections (names are a public interface):

    [core]     address = "HOST:PORT"  |  embedded = true + data_dir = "DIR"
               deadline_ms = 10000               # per-call gRPC deadline (SPEC §2)
    [host]     signing_key = "PATH"              # Ed25519 PEM the core trusts
               memory_enabled = false            # host opt-in, default off
               confirmation_timeout_ms = 120000  # how long a human has to answer
               console_url = "https://console.example.com"  # `engram console`, for clients that
                                                 # can only open a URL to confirm (issue 61)
    [binding]  tenant, workspace, principal, agent_id, session, purpose_ref
    [http]     allowed_hosts = ["mcp.example.com:*"]   # Host values accepted besides the bind address
               allowed_origins = ["https://app.example.com"]  # browser Origins accepted
               token_digests_file = "PATH"       # bearer tokens: one sha256 hex digest a line
               token_env = "ENGRAM_MCP_TOKENS"   # or/and: tokens in an environment variable
               token_file = "PATH"               # or/and: one token in a file only its owner reads (engram init)
               tls_cert, tls_key = "PATH"        # serve HTTPS (PEM certificate chain and key)
    [http.oauth]  issuer, resource, ...          # OAuth 2.1 resource server (adapters/mcp/oauth/settings.py)
    [core]     tls_ca, tls_cert, tls_key, tls_server_name   # gRPC over TLS (mTLS with cert+key)

Over HTTP a file without ``[binding]`` binds each request from the
``X-Engram-Host-Context`` header instead (see ``adapters.mcp.host_context``), or, with
``[http.oauth]``, from the caller's access token as the binding policy decides.
Anything unreadable fails at startup with a :class:`ConfigError` whose message
names the problem but never prints key material.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from adapters.mcp.oauth.settings import OAuthConfigError, OAuthSettings, parse_oauth
from engram_core.rpc.tls import ClientTls
from engram_core.trust.hostkeys import load_private_key_file

DEFAULT_DEADLINE_MS = 10_000
DEFAULT_CONFIRMATION_TIMEOUT_MS = 120_000
_MAX_DEADLINE_MS = 300_000

BINDING_FIELDS = ("tenant", "workspace", "principal", "agent_id", "session", "purpose_ref")
HTTP_FIELDS = ("allowed_hosts", "allowed_origins", "token_digests_file", "token_env", "token_file", "tls_cert",
               "tls_key", "oauth")
MIN_TOKEN_CHARS = 16  # a bearer token shorter than this is guessable; refuse it at startup
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class ConfigError(Exception):
    """The host configuration cannot be used; the message is safe to print."""


@dataclass(frozen=True)
class AgentBinding:
    """The host-bound identity of one agent (SPEC §2): the scope, principal, session and purpose
    its calls are bound to, from a ``[binding]`` section, a context header or the binding policy.
    Never taken from arguments."""

    tenant: str
    workspace: str
    principal: str
    agent_id: str = ""
    session: str = ""
    purpose_ref: str = ""

    @property
    def complete(self) -> bool:
        """A context with an empty tenant, workspace or principal is refused (SPEC §2)."""
        return bool(self.tenant and self.workspace and self.principal)


@dataclass(frozen=True)
class HttpSettings:
    """What `engram mcp --http` accepts: Host/Origin values, and who authenticates how.

    Static tokens are held only as SHA-256 digests (from a digest file, or hashed at load
    from the environment or a token file), so no log line ever holds one. ``oauth``: the
    adapter is an OAuth 2.1 resource server instead (access tokens from an issuer)."""

    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    token_digests: frozenset[str] = field(default_factory=frozenset)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    token_file: Path | None = None
    token_file_problem: str | None = None  # why token_file is unusable (refused by --http, not by stdio)
    oauth: OAuthSettings | None = None

    @property
    def auth_required(self) -> bool:
        """Every HTTP request must carry a bearer token (static or OAuth)."""
        return bool(self.token_digests) or self.oauth is not None


@dataclass(frozen=True)
class HostConfig:
    """Everything the adapter needs to bind and forward calls."""

    core_address: str | None
    embedded_data_dir: Path | None
    deadline_ms: int
    signing_key: Ed25519PrivateKey | None
    signing_key_path: Path | None
    memory_enabled: bool
    confirmation_timeout_ms: int
    binding: AgentBinding | None  # None: bind per request from the HTTP header
    http: HttpSettings = HttpSettings()
    core_tls: ClientTls | None = None  # [core] tls_*: reach the core over TLS
    console_url: str = ""  # [host] console_url: where URL-mode elicitation sends a person to confirm


def _table(doc: dict[str, Any], name: str, *, required: bool) -> dict[str, Any]:
    value = doc.get(name)
    if value is None:
        if required:
            raise ConfigError(f"missing [{name}] section")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def _string(table: dict[str, Any], section: str, key: str, *, default: str | None = None) -> str:
    value = table.get(key, default)
    if value is None:
        raise ConfigError(f"missing {key} in [{section}]")
    if not isinstance(value, str):
        raise ConfigError(f"{key} in [{section}] must be a string")
    return value


def _int(table: dict[str, Any], section: str, key: str, default: int, *, low: int, high: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{key} in [{section}] must be an integer in {low}..{high}")
    return value


def _bool(table: dict[str, Any], section: str, key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{key} in [{section}] must be true or false")
    return value


def _resolve(base: Path, raw: str) -> Path:
    path = Path(raw).expanduser()
    return path if path.is_absolute() else (base / path)


def load_host_config(path: Path | str) -> HostConfig:
    """Read and check the TOML host configuration, or raise :class:`ConfigError`."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"host config not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"host config unreadable: {path} ({type(exc).__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"host config is not valid TOML: {path} ({exc})") from None
    base = path.parent

    core = _table(doc, "core", required=True)
    embedded = _bool(core, "core", "embedded", False)
    address: str | None = None
    data_dir: Path | None = None
    if embedded:
        data_dir = _resolve(base, _string(core, "core", "data_dir"))
        if "address" in core:
            raise ConfigError("[core] takes either address or embedded = true, not both")
    else:
        address = _string(core, "core", "address")
        if ":" not in address:
            raise ConfigError("address in [core] must be HOST:PORT")
    deadline_ms = _int(core, "core", "deadline_ms", DEFAULT_DEADLINE_MS, low=1, high=_MAX_DEADLINE_MS)
    core_tls = _core_tls(core, base)
    if core_tls is not None and embedded:
        raise ConfigError("[core] tls_* settings apply to a core address, not to embedded = true")

    host = _table(doc, "host", required=True)
    memory_enabled = _bool(host, "host", "memory_enabled", False)
    confirmation_timeout_ms = _int(
        host, "host", "confirmation_timeout_ms", DEFAULT_CONFIRMATION_TIMEOUT_MS, low=1_000, high=300_000
    )
    console_url = _string(host, "host", "console_url", default="").rstrip("/")
    if console_url and not re.fullmatch(r"https://[^/?#\s]+(/[^?#\s]*)?|http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?"
                                        r"(/[^?#\s]*)?", console_url):
        raise ConfigError("console_url in [host] must be an https URL (plain http only on loopback), "
                          "without query or fragment")
    key_path: Path | None
    if "signing_key" in host:
        key_path = _resolve(base, _string(host, "host", "signing_key"))
    elif embedded:
        # The embedded core creates DIR/host.key on first run and trusts it.
        key_path = None
    else:
        raise ConfigError("missing signing_key in [host]")
    key = _load_key(key_path) if key_path is not None else None

    binding: AgentBinding | None = None
    if "binding" in doc:
        table = _table(doc, "binding", required=True)
        unknown = sorted(set(table) - set(BINDING_FIELDS))
        if unknown:
            raise ConfigError(f"unknown keys in [binding]: {', '.join(unknown)}")
        binding = AgentBinding(**{name: _string(table, "binding", name, default="") for name in BINDING_FIELDS})

    http = _http_settings(_table(doc, "http", required=False), base)
    if http.oauth is not None and binding is not None:
        raise ConfigError("[http.oauth] binds each caller as the binding policy decides: remove [binding]")
    if http.oauth is not None and (http.token_digests or http.token_file is not None):
        raise ConfigError("[http.oauth] and static bearer tokens (token_digests_file, token_env, token_file) "
                          "exclude each other: choose one")
    return HostConfig(
        core_address=address,
        embedded_data_dir=data_dir,
        deadline_ms=deadline_ms,
        signing_key=key,
        signing_key_path=key_path,
        memory_enabled=memory_enabled,
        confirmation_timeout_ms=confirmation_timeout_ms,
        binding=binding,
        http=http,
        core_tls=core_tls,
        console_url=console_url,
    )


def _strings(table: dict[str, Any], section: str, key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key} in [{section}] must be a list of non-empty strings")
    return tuple(value)


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"{what} unreadable: {path} ({type(exc).__name__})") from None


def _http_settings(table: dict[str, Any], base: Path) -> HttpSettings:
    unknown = sorted(set(table) - set(HTTP_FIELDS))
    if unknown:
        raise ConfigError(f"unknown keys in [http]: {', '.join(unknown)}")
    digests: set[str] = set()
    if "token_digests_file" in table:
        path = _resolve(base, _string(table, "http", "token_digests_file"))
        text = _read_bytes(path, "token digests file").decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip().lower()
            if not line:
                continue
            if not _SHA256_HEX.fullmatch(line):
                raise ConfigError(f"{path}:{number}: not a sha256 hex digest")
            digests.add(line)
        if not digests:
            raise ConfigError(f"token digests file has no digest: {path}")
    if "token_env" in table:
        name = _string(table, "http", "token_env")
        tokens = os.environ.get(name, "").split()
        if not tokens:
            # Fail closed: a missing variable must not silently turn authentication off.
            raise ConfigError(f"environment variable {name} (token_env in [http]) holds no token")
        if any(len(t) < MIN_TOKEN_CHARS for t in tokens):
            raise ConfigError(f"a token in {name} is shorter than {MIN_TOKEN_CHARS} characters")
        digests.update(token_digest(t) for t in tokens)
    token_file: Path | None = None
    token_file_problem: str | None = None
    if "token_file" in table:
        token_file = _resolve(base, _string(table, "http", "token_file"))
        try:
            digests.add(token_digest(_read_token_file(token_file)))
        except ConfigError as exc:
            # Only `--http` reads the token: a stdio adapter on the same file still starts.
            token_file_problem = str(exc)
    oauth = None
    if "oauth" in table:
        if not isinstance(table["oauth"], dict):
            raise ConfigError("[http.oauth] must be a table")
        try:
            oauth = parse_oauth(table["oauth"], base)
        except OAuthConfigError as exc:
            raise ConfigError(str(exc)) from None
    if ("tls_cert" in table) != ("tls_key" in table):
        raise ConfigError("tls_cert and tls_key in [http] go together")
    tls = {}
    for name in ("tls_cert", "tls_key"):
        if name in table:
            path = _resolve(base, _string(table, "http", name))
            _read_bytes(path, f"{name} in [http]")  # unreadable: fail at startup, not at the first client
            tls[name] = path
    return HttpSettings(
        **tls,
        allowed_hosts=_strings(table, "http", "allowed_hosts"),
        allowed_origins=_strings(table, "http", "allowed_origins"),
        token_digests=frozenset(digests),
        token_file=token_file,
        token_file_problem=token_file_problem,
        oauth=oauth,
    )


def _read_token_file(path: Path) -> str:
    """The one bearer token in ``path``, which only its owner may read (like an ssh key: a
    token other local users can read authenticates them too, docs/security.md)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"token file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"token file unreadable: {path} ({type(exc).__name__})") from None
    if mode & 0o077:
        raise ConfigError(f"token file {path} is readable by other users (mode {mode & 0o777:o}): chmod 600 it")
    text = _read_bytes(path, "token file").decode("utf-8", errors="replace").strip()
    if len(text) < MIN_TOKEN_CHARS or any(c.isspace() for c in text):
        raise ConfigError(f"token file {path} must hold one token of at least {MIN_TOKEN_CHARS} characters")
    return text


def token_digest(token: str) -> str:
    """The SHA-256 hex digest a bearer token is stored and compared as."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _core_tls(core: dict[str, Any], base: Path) -> ClientTls | None:
    names = ("tls_ca", "tls_cert", "tls_key", "tls_server_name")
    if not any(n in core for n in names):
        return None
    if "tls_ca" not in core:
        raise ConfigError("[core] tls_* settings need tls_ca (the CA that signed the core's certificate)")
    if ("tls_cert" in core) != ("tls_key" in core):
        raise ConfigError("[core] tls_cert and tls_key go together")
    def read(name: str, what: str) -> bytes | None:
        return _read_bytes(_resolve(base, _string(core, "core", name)), what) if name in core else None

    return ClientTls(
        ca=read("tls_ca", "core CA certificate") or b"",
        cert=read("tls_cert", "client certificate"),
        key=read("tls_key", "client key"),
        server_name=_string(core, "core", "tls_server_name") if "tls_server_name" in core else None,
    )


def _load_key(path: Path) -> Ed25519PrivateKey:
    try:
        return load_private_key_file(path)
    except FileNotFoundError:
        raise ConfigError(f"signing key not found: {path}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"signing key unusable: {path} ({type(exc).__name__})") from None
