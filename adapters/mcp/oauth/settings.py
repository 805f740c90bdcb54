"""`[http.oauth]` of the host TOML: the adapter as an OAuth 2.1 resource server.

    [http.oauth]
    issuer = "https://idp.example.com/realms/acme"  # the authorization server (token `iss`); required
    resource = "https://memory.example.com/mcp"     # this resource (RFC 8707 audience); default: the served URL
    jwks_uri = "https://..."                        # default: from the issuer's metadata
    algorithms = ["RS256", "ES256"]                 # accepted JWS algorithms (asymmetric only)
    clock_skew_s = 30                               # leeway on exp/nbf/iat, 0..300
    jwks_max_age_s = 300                            # refetch the key set after this long
    jwks_refresh_cooldown_s = 30                    # an unknown key id refetches at most this often
    introspection_endpoint = "https://..."          # RFC 7662 for opaque tokens; default: from metadata
    introspection_client_id = "engram-mcp"          # how the adapter authenticates to it ...
    introspection_secret_env = "ENGRAM_INTROSPECTION_SECRET"  # ... the secret, from this variable
    introspection_cache_s = 30                      # how long an introspection answer is reused, 0..300
    introspection_budget_per_s = 5                  # introspections of not-yet-known tokens a second, 1..1000
    binding_cache_s = 60                            # how long a binding decision is reused, 0..600
    fetch_deadline_s = 5                            # seconds for one request to the issuer (all of it), 0 < s <= 60
    check_deadline_s = 8                            # seconds for one token check, fetch_deadline_s..60
    scopes_supported = ["engram:read", ...]         # published metadata; default: what the policy maps
    policies = "DIR"                                # the bundle deciding engram/binding (default: bundled)
    # opa_url = "http://127.0.0.1:8181"             # or ask an OPA server

Every URL the adapter fetches must be HTTPS, except on loopback (a provider on the same host).
The introspection secret is read from the environment, never from the file.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Asymmetric JWS algorithms only: an HMAC algorithm would let anyone holding the public key (the
# JWKS is public) sign tokens (RFC 8725 §3.1, algorithm confusion), and "none" signs nothing.
SUPPORTED_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")
DEFAULT_CLOCK_SKEW_S = 30
MAX_CLOCK_SKEW_S = 300
DEFAULT_JWKS_MAX_AGE_S = 300
DEFAULT_JWKS_REFRESH_COOLDOWN_S = 30
DEFAULT_INTROSPECTION_CACHE_S = 30
DEFAULT_INTROSPECTION_BUDGET_PER_S = 5
DEFAULT_BINDING_CACHE_S = 60
# A slow issuer is a prompt 503, not a hang (issue 57): one request to it (or the whole of
# discovery) gets fetch_deadline_s, one token check, waits on other callers' fetches included,
# check_deadline_s, well inside a client's ~16 s at the defaults.
DEFAULT_FETCH_DEADLINE_S = 5.0
DEFAULT_CHECK_DEADLINE_S = 8.0
MAX_DEADLINE_S = 60.0

OAUTH_FIELDS = (
    "issuer", "resource", "jwks_uri", "algorithms", "clock_skew_s", "jwks_max_age_s", "jwks_refresh_cooldown_s",
    "introspection_endpoint", "introspection_client_id", "introspection_secret_env", "introspection_cache_s",
    "introspection_budget_per_s", "binding_cache_s", "fetch_deadline_s", "check_deadline_s", "scopes_supported",
    "policies", "opa_url",
)


class OAuthConfigError(Exception):
    """``[http.oauth]`` cannot be used; the message is safe to print (never a secret)."""


@dataclass(frozen=True)
class IntrospectionClient:
    """How the adapter authenticates to the introspection endpoint (client_secret_basic)."""

    client_id: str
    secret: str

    def __repr__(self) -> str:  # the secret never reaches a log line or a traceback
        return f"IntrospectionClient(client_id={self.client_id!r}, secret=<hidden>)"


@dataclass(frozen=True)
class OAuthSettings:
    issuer: str
    resource: str | None = None
    jwks_uri: str | None = None
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S
    jwks_max_age_s: int = DEFAULT_JWKS_MAX_AGE_S
    jwks_refresh_cooldown_s: int = DEFAULT_JWKS_REFRESH_COOLDOWN_S
    introspection_endpoint: str | None = None
    introspection_client: IntrospectionClient | None = None
    introspection_cache_s: int = DEFAULT_INTROSPECTION_CACHE_S
    introspection_budget_per_s: int = DEFAULT_INTROSPECTION_BUDGET_PER_S
    binding_cache_s: int = DEFAULT_BINDING_CACHE_S
    fetch_deadline_s: float = DEFAULT_FETCH_DEADLINE_S
    check_deadline_s: float = DEFAULT_CHECK_DEADLINE_S
    scopes_supported: tuple[str, ...] | None = None
    policies: Path | None = None
    opa_url: str | None = None


def _is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def checked_url(value: Any, key: str) -> str:
    """An absolute http(s) URL; plain http only to a loopback host (OAuth 2.1 §1.5: TLS)."""
    if not isinstance(value, str) or not value:
        raise OAuthConfigError(f"{key} in [http.oauth] must be a URL")
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.fragment:
        raise OAuthConfigError(f"{key} in [http.oauth] must be an absolute https:// URL without a fragment")
    if parts.scheme == "http" and not _is_loopback_host(parts.hostname):
        raise OAuthConfigError(f"{key} in [http.oauth] must use https:// (plain http only on loopback)")
    return value


def _int(table: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OAuthConfigError(f"{key} in [http.oauth] must be an integer in {low}..{high}")
    return value


def _seconds(table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DEADLINE_S:
        raise OAuthConfigError(f"{key} in [http.oauth] must be a number of seconds above 0 and at most "
                               f"{MAX_DEADLINE_S:g}")
    return float(value)


def _string(table: dict[str, Any], key: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise OAuthConfigError(f"{key} in [http.oauth] must be a non-empty string")
    return value


def _strings(table: dict[str, Any], key: str) -> tuple[str, ...] | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise OAuthConfigError(f"{key} in [http.oauth] must be a non-empty list of non-empty strings")
    return tuple(dict.fromkeys(value))


def parse_oauth(table: dict[str, Any], base: Path) -> OAuthSettings:
    """Check ``[http.oauth]``; relative ``policies`` paths resolve against the config's directory."""
    unknown = sorted(set(table) - set(OAUTH_FIELDS))
    if unknown:
        raise OAuthConfigError(f"unknown keys in [http.oauth]: {', '.join(unknown)}")
    if "issuer" not in table:
        raise OAuthConfigError("missing issuer in [http.oauth] (the authorization server's issuer URL)")
    issuer = checked_url(table["issuer"], "issuer")
    urls = {key: checked_url(table[key], key) for key in ("resource", "jwks_uri", "introspection_endpoint")
            if key in table}
    algorithms = _strings(table, "algorithms") or DEFAULT_ALGORITHMS
    refused = [a for a in algorithms if a not in SUPPORTED_ALGORITHMS]
    if refused:
        raise OAuthConfigError(
            f"algorithms in [http.oauth] may name only asymmetric JWS algorithms ({', '.join(SUPPORTED_ALGORITHMS)}); "
            f"refused: {', '.join(refused)}")
    client = _introspection_client(table)
    if "policies" in table and "opa_url" in table:
        raise OAuthConfigError("[http.oauth] takes either policies or opa_url, not both")
    policies = _string(table, "policies")
    opa_url = _string(table, "opa_url")
    fetch_deadline_s = _seconds(table, "fetch_deadline_s", DEFAULT_FETCH_DEADLINE_S)
    check_deadline_s = _seconds(table, "check_deadline_s", DEFAULT_CHECK_DEADLINE_S)
    if check_deadline_s < fetch_deadline_s:
        # A check may have to wait out one whole fetch: a shorter check would cut every slow fetch
        # short, and the fetch deadline would never be the one that ends it.
        raise OAuthConfigError(f"check_deadline_s ({check_deadline_s:g} s) in [http.oauth] must be at least "
                               f"fetch_deadline_s ({fetch_deadline_s:g} s)")
    return OAuthSettings(
        issuer=issuer,
        resource=urls.get("resource"),
        jwks_uri=urls.get("jwks_uri"),
        algorithms=algorithms,
        clock_skew_s=_int(table, "clock_skew_s", DEFAULT_CLOCK_SKEW_S, 0, MAX_CLOCK_SKEW_S),
        jwks_max_age_s=_int(table, "jwks_max_age_s", DEFAULT_JWKS_MAX_AGE_S, 60, 86_400),
        jwks_refresh_cooldown_s=_int(table, "jwks_refresh_cooldown_s", DEFAULT_JWKS_REFRESH_COOLDOWN_S, 1, 3600),
        introspection_endpoint=urls.get("introspection_endpoint"),
        introspection_client=client,
        introspection_cache_s=_int(table, "introspection_cache_s", DEFAULT_INTROSPECTION_CACHE_S, 0, 300),
        introspection_budget_per_s=_int(table, "introspection_budget_per_s", DEFAULT_INTROSPECTION_BUDGET_PER_S,
                                        1, 1000),
        binding_cache_s=_int(table, "binding_cache_s", DEFAULT_BINDING_CACHE_S, 0, 600),
        fetch_deadline_s=fetch_deadline_s,
        check_deadline_s=check_deadline_s,
        scopes_supported=_strings(table, "scopes_supported"),
        policies=(Path(policies).expanduser() if Path(policies).expanduser().is_absolute()
                  else base / Path(policies).expanduser()) if policies else None,
        opa_url=opa_url,
    )


def _introspection_client(table: dict[str, Any]) -> IntrospectionClient | None:
    client_id = _string(table, "introspection_client_id")
    secret_env = _string(table, "introspection_secret_env")
    if client_id is None and secret_env is None:
        if "introspection_endpoint" in table:
            raise OAuthConfigError("introspection_endpoint in [http.oauth] needs introspection_client_id "
                                   "and introspection_secret_env (the adapter authenticates to it)")
        return None
    if client_id is None or secret_env is None:
        raise OAuthConfigError("introspection_client_id and introspection_secret_env in [http.oauth] go together")
    secret = os.environ.get(secret_env, "")
    if not secret:
        # Fail closed: a missing secret must not quietly turn opaque tokens into refusals at run time.
        raise OAuthConfigError(f"environment variable {secret_env} (introspection_secret_env) is empty or unset")
    return IntrospectionClient(client_id=client_id, secret=secret)
