"""Who may talk to `engram mcp --http`: Host/Origin validation and bearer tokens.

Three attacks shape this module (docs/security.md):

- DNS rebinding: a web page whose name resolves to the adapter's address makes the
  visitor's browser send requests with a foreign ``Host`` and the page's ``Origin``.
  The SDK's transport security refuses both (421 for the Host, 403 for the Origin);
  it is always on here, whatever the bind address (the SDK only turns it on by
  itself for 127.0.0.1, localhost and ::1, so 127.0.0.2 or 0.0.0.0 were open).
- Another host on the network: any bind that is not loopback requires bearer
  tokens or OAuth, checked by the SDK's resource-server auth (``TokenVerifier`` +
  ``RequireAuthMiddleware``: 401 without a valid token). Without them the adapter
  refuses to start.
- Another user of the same machine: loopback is not an identity on a shared host
  (issue 26). A ``[binding]`` served over HTTP needs bearer tokens on every bind,
  loopback included (`engram init` writes one, 0600); only the header binding, whose
  every request carries a context signed by a key the core trusts, runs on loopback
  without them.

Tokens are compared as SHA-256 digests in constant time; the token itself is never
logged or stored.
"""

from __future__ import annotations

import hmac
import ipaddress

from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings

from adapters.mcp.config import ConfigError, HttpSettings, token_digest

_LOOPBACK_NAMES = ("localhost",)
_WILDCARDS = ("0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name other than localhost may resolve anywhere


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def transport_security(host: str, port: int, http: HttpSettings) -> TransportSecuritySettings:
    """Host/Origin validation, always on: the bind address itself (and the local names on a
    loopback or wildcard bind) plus what ``[http]`` allows. Remote clients of a wildcard
    bind are refused (421) until the names they use are listed in ``allowed_hosts``."""
    hosts: list[str] = []
    origins: list[str] = []
    scheme = "https" if http.tls_cert else "http"
    if host not in _WILDCARDS:
        hosts.append(_authority(host, port))
        origins.append(f"{scheme}://{_authority(host, port)}")
    if is_loopback(host) or host in _WILDCARDS:  # a wildcard bind also listens on loopback
        for name in ("127.0.0.1", "localhost", "::1"):
            hosts.append(_authority(name, port))
            origins.append(f"{scheme}://{_authority(name, port)}")
    hosts += [h for h in http.allowed_hosts if h not in hosts]
    origins += [o for o in http.allowed_origins if o not in origins]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


class DigestTokenVerifier:
    """The SDK's ``TokenVerifier`` for static bearer tokens known by their SHA-256 digest."""

    def __init__(self, digests: frozenset[str]) -> None:
        self._digests = tuple(sorted(digests))

    async def verify_token(self, token: str) -> AccessToken | None:
        digest = token_digest(token)
        # Compare against every digest (no early exit) so timing says nothing about which matched.
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(digest, known)
        if not matched:
            return None
        # client_id names the token by a digest prefix: sessions are bound to the token that
        # opened them, and nothing secret reaches a log line.
        return AccessToken(token=token, client_id=f"token-{digest[:12]}", scopes=[])


def check_bind(host: str, http: HttpSettings, *, header_mode: bool) -> None:
    """Refuse to serve HTTP without authentication: bearer tokens (static or OAuth) on every
    bind, except the header binding on loopback (each request carries its signed context)."""
    if http.token_file_problem is not None:
        raise ConfigError(http.token_file_problem)
    if not is_loopback(host) and not http.auth_required:
        raise ConfigError(
            f"--http {host} is reachable from other hosts: configure bearer tokens "
            "(token_file, token_digests_file or token_env in [http]) or [http.oauth], or bind 127.0.0.1"
        )
    if not http.auth_required and not header_mode:
        raise ConfigError(
            "--http needs authentication, on loopback too (other local users reach it): set token_file, "
            "token_digests_file or token_env in [http] (`engram init --force` writes a token file), "
            "or [http.oauth]; docs/mcp-clients.md §3")
    if http.oauth is not None and http.oauth.resource is None and host in _WILDCARDS:
        raise ConfigError(
            f"--http {host} with [http.oauth] needs resource in [http.oauth]: the URL clients use "
            "(e.g. https://memory.example.com/mcp), which tokens must name as their audience")
