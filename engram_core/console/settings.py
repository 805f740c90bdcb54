"""What `engram console` is told: from its flags, or the ``[console]`` table of a TOML file
(flags win). See docs/console.md for every key."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engram_core.console.auth import Provider
from engram_core.contract.scope import Scope


class ConsoleConfigError(ValueError):
    """A setting that cannot work; the message names it."""


@dataclass
class ConsoleSettings:
    core: str = "127.0.0.1:50051"
    host_key: str = ""
    listen: str = "127.0.0.1:8780"
    public_url: str = ""              # how browsers reach the console (the OpenID redirect URI's base)
    tls_cert: str = ""
    tls_key: str = ""
    insecure: bool = False
    token_file: str = ""              # the local token (`engram init` writes <host>.token)
    scopes: list[Scope] = field(default_factory=list)  # the scopes served
    policies: str = ""                # the bundle holding engram/console (default: the bundled one)
    providers: list[Provider] = field(default_factory=list)
    # The Policy page's replay of a candidate bundle ([console.replay], docs/console.md): candidate
    # bundles are the entries of one directory on the console's host, replayed against these logs.
    replay_candidates: str = ""       # a directory: each subdirectory or .tar.gz in it is a candidate
    replay_logs: list[str] = field(default_factory=list)  # the core's decision log file(s)
    replay_pseudonym_key: str = ""    # the core's decision-log.key: names restored, the scope found

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    def base_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        return ("https://" if self.tls else "http://") + self.listen

    def check(self) -> None:
        if not self.host_key:
            raise ConsoleConfigError("--host-key is required (the console's own trusted host key, PEM)")
        if not Path(self.host_key).exists():
            raise ConsoleConfigError(f"host key {self.host_key} not found")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConsoleConfigError("--tls-cert and --tls-key go together")
        if not self.scopes:
            raise ConsoleConfigError("name at least one scope to serve: --scope TENANT/WORKSPACE")
        if not self.token_file and not self.providers:
            raise ConsoleConfigError("nobody could sign in: give --token-file (one person) or --oauth-issuer (a team)")
        if self.token_file and not Path(self.token_file).exists():
            raise ConsoleConfigError(f"token file {self.token_file} not found")
        if self.replay_candidates and not Path(self.replay_candidates).is_dir():
            raise ConsoleConfigError(f"[console.replay] candidates {self.replay_candidates} is not a directory")
        if self.replay_candidates and not (self.replay_logs and self.replay_pseudonym_key):
            raise ConsoleConfigError("[console.replay] needs decision_logs and pseudonym_key besides candidates "
                                     "(the log's names are pseudonyms: without the key no scope can be told apart)")


def parse_scope(text: str) -> Scope:
    tenant, sep, workspace = text.partition("/")
    if not sep or not tenant or not workspace or "/" in workspace:
        raise ConsoleConfigError(f"scope {text!r} is not TENANT/WORKSPACE")
    return Scope(tenant, workspace)


def _str(table: dict[str, Any], key: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise ConsoleConfigError(f"[console] {key} must be a string")
    return value


def from_toml(path: Path) -> ConsoleSettings:
    """The ``[console]`` table of ``path`` (``[[console.oidc]]`` entries for the issuers)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConsoleConfigError(f"{path}: {exc}") from None
    table = doc.get("console", {})
    if not isinstance(table, dict):
        raise ConsoleConfigError(f"{path}: [console] must be a table")
    known = {"core", "host_key", "listen", "public_url", "tls_cert", "tls_key", "insecure", "token_file", "scopes",
             "policies", "oidc", "replay"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConsoleConfigError(f"{path}: unknown [console] key(s): {', '.join(unknown)}")
    s = ConsoleSettings(**{k: _str(table, k) for k in ("core", "host_key", "listen", "public_url", "tls_cert",
                                                          "tls_key", "token_file", "policies") if k in table})
    s.insecure = table.get("insecure") is True
    s.scopes = [parse_scope(str(x)) for x in table.get("scopes", [])]
    replay = table.get("replay", {})
    if not isinstance(replay, dict) or sorted(set(replay) - {"candidates", "decision_logs", "pseudonym_key"}):
        raise ConsoleConfigError(f"{path}: [console.replay] takes candidates, decision_logs and pseudonym_key")
    s.replay_candidates, s.replay_pseudonym_key = _str(replay, "candidates"), _str(replay, "pseudonym_key")
    logs = replay.get("decision_logs", [])
    if not isinstance(logs, list) or not all(isinstance(x, str) for x in logs):
        raise ConsoleConfigError(f"{path}: [console.replay] decision_logs must be a list of paths")
    s.replay_logs = list(logs)
    for entry in table.get("oidc", []):
        s.providers.append(provider(_str(entry, "issuer"), _str(entry, "client_id"),
                                    _str(entry, "client_secret_file"), _str(entry, "scopes")))
    return s


def provider(issuer: str, client_id: str, client_secret_file: str = "", scopes: str = "") -> Provider:
    if not issuer.startswith(("https://", "http://127.0.0.1", "http://localhost", "http://[::1]")):
        raise ConsoleConfigError(f"issuer {issuer!r} must be https (plain http only on loopback)")
    if not client_id:
        raise ConsoleConfigError(f"issuer {issuer}: a client_id is required")
    secret = Path(client_secret_file).read_text(encoding="utf-8").strip() if client_secret_file else ""
    return Provider(issuer=issuer, client_id=client_id, client_secret=secret, scopes=scopes or "openid profile email")
