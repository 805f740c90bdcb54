"""Access tokens checked as the SDK's ``TokenVerifier``: JWTs against the issuer's keys, opaque
tokens by introspection (MCP authorization; RFC 9068, RFC 7662, RFC 8707).

A JWT is accepted only when all of these hold (PyJWT checks the signature and the registered
claims; nothing here parses or verifies a JWS by hand):

- its ``alg`` is one of the configured asymmetric algorithms (never ``none``, never HMAC) and is
  the algorithm of the issuer's key its ``kid`` names;
- the signature verifies under that key, from the issuer's current key set (``jwks.py``);
- ``iss`` is the configured issuer, ``aud`` names this resource (RFC 8707), ``exp`` is present;
- ``exp``, ``nbf`` and ``iat`` hold with ``clock_skew_s`` of leeway; the SDK then refuses the
  token once ``exp`` has passed, to the second, on every later request;
- its ``typ``, if any, is an access token's (``at+jwt``) or the generic ``JWT``: a logout or
  DPoP proof JWT is not an access token. An ID token names the client, not this resource, in
  ``aud``, and is refused by the audience check.

A JWT that verified is remembered (by its SHA-256 digest, at most ``VERIFIED_CACHE_ENTRIES``) until
its ``exp`` and for at most ``max_age_s`` (the key set's own lifetime), and only while the key it
was verified with is still published: a client sends the same token with every call of a
session, and the signature check (PyJWT's, ~0.1-0.5 ms) then runs once per token instead of once
per call; a key the issuer retires stops its tokens at the next key-set fetch. Envoy's JWT filter
keeps the same kind of cache.

A token that is not a JWS goes to introspection when one is configured. A refused token is
``None`` (the SDK answers 401 ``invalid_token``); when the issuer's keys or its introspection
endpoint cannot be reached at all the request fails with :class:`AuthorizationServerUnavailable`
(503), so an outage is not mistaken for a bad token.

A check that needs the issuer ends within ``check_deadline_s`` of wall clock (``[http.oauth]``,
8 s by default), whatever the issuer does (issue 57): each fetch has its own deadline
(``fetch.py``), but a check may wait for another caller's fetch (the key set's and the metadata's
locks) and then make its own, and a client gives up after ~16 s. Past the deadline the request is
the retriable 503, never a hang.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
import jwt
from mcp.server.auth.provider import AccessToken

from adapters.mcp.oauth.fetch import FetchFailed
from adapters.mcp.oauth.introspection import IntrospectionUnavailable, Introspector
from adapters.mcp.oauth.jwks import JwksCache, KeySetUnavailable
from adapters.mcp.oauth.settings import DEFAULT_CHECK_DEADLINE_S

logger = logging.getLogger("engram.mcp.oauth")

_JWS_SHAPE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")
_ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt", "jwt", "application/jwt"})
MAX_TOKEN_CHARS = 16_384
VERIFIED_CACHE_ENTRIES = 4096


class AuthorizationServerUnavailable(Exception):
    """The issuer's keys or introspection endpoint cannot be reached: no token can be checked."""


def _scopes(claims: dict[str, Any]) -> list[str]:
    """RFC 9068/8693 ``scope`` (space-separated), or the ``scp`` list some providers send."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return [s for s in scope.split(" ") if s]
    scp = claims.get("scp")
    if isinstance(scp, str):
        return [s for s in scp.split(" ") if s]
    if isinstance(scp, list):
        return [s for s in scp if isinstance(s, str) and s]
    return []


def _client_id(claims: dict[str, Any]) -> str:
    # RFC 9068's client_id; OpenID's authorized party (Keycloak, Auth0, Entra ID v2); Okta's cid;
    # Entra ID v1's appid.
    for name in ("client_id", "azp", "cid", "appid"):
        value = claims.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def _audiences(claims: dict[str, Any]) -> list[str]:
    aud = claims.get("aud")
    if isinstance(aud, str):
        return [aud]
    return [a for a in aud if isinstance(a, str)] if isinstance(aud, list) else []


def _int_claim(claims: dict[str, Any], name: str) -> int | None:
    value = claims.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class OAuthTokenVerifier:
    """The SDK's ``TokenVerifier`` for one issuer and one resource."""

    def __init__(self, *, issuer: str, resource: str, algorithms: tuple[str, ...], clock_skew_s: int,
                 jwks: JwksCache, introspector: Introspector | None = None, max_age_s: float = 300.0,
                 check_deadline_s: float = DEFAULT_CHECK_DEADLINE_S, clock: Callable[[], float] = time.time) -> None:
        self._issuer = issuer
        self._resource = resource
        # RFC 8707 resources compare as given; a trailing slash is the one spelling difference forgiven.
        self._audiences = sorted({resource, resource.rstrip("/"), resource.rstrip("/") + "/"})
        self._algorithms = algorithms
        self._skew = clock_skew_s
        self._jwks = jwks
        self._introspector = introspector
        self._clock = clock
        self._max_age_s = max_age_s
        self._check_deadline_s = check_deadline_s
        # token digest -> (the verified token, the key id that verified it, remembered until)
        self._verified: OrderedDict[str, tuple[AccessToken, str | None, float]] = OrderedDict()

    async def verify_token(self, token: str) -> AccessToken | None:
        if not token or len(token) > MAX_TOKEN_CHARS:
            return self._refused("size")
        is_jws = _JWS_SHAPE.fullmatch(token) is not None
        if not is_jws and self._introspector is None:
            return self._refused("not_a_jwt")
        with anyio.move_on_after(self._check_deadline_s):
            return await (self._verify_jwt(token) if is_jws else self._verify_introspected(token))
        raise AuthorizationServerUnavailable(f"the issuer did not answer within {self._check_deadline_s:g} s")

    def _refused(self, reason: str) -> None:
        logger.info("access token refused: reason=%s", reason)  # never the token, never its claims
        return None

    async def _verify_jwt(self, token: str) -> AccessToken | None:
        digest = hashlib.sha256(token.encode()).digest()
        hit = self._verified.get(digest)
        if hit is not None:
            verified, kid, until = hit
            if self._clock() < until and self._jwks.publishes(kid):
                self._verified.move_to_end(digest)
                return verified
            del self._verified[digest]
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            return self._refused("header")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            return self._refused("algorithm")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in _ACCESS_TOKEN_TYPES):
            return self._refused("type")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            return self._refused("key_id")
        try:
            key = await self._jwks.key(kid, alg)
        except KeySetUnavailable as exc:
            raise AuthorizationServerUnavailable(str(exc)) from None
        if key is None:
            return self._refused("unknown_key")
        try:
            claims = jwt.decode(
                token, key=key, algorithms=[alg], audience=self._audiences, issuer=self._issuer,
                leeway=self._skew, options={"require": ["exp", "iss", "aud"], "verify_signature": True})
        except jwt.InvalidTokenError as exc:
            return self._refused(type(exc).__name__)
        verified = self._access_token(token, claims)
        now, nbf = self._clock(), _int_claim(claims, "nbf")
        if verified.expires_at is not None and (nbf is None or nbf <= now):  # not one let in by the skew
            self._verified[digest] = (verified, kid, min(float(verified.expires_at), now + self._max_age_s))
            while len(self._verified) > VERIFIED_CACHE_ENTRIES:
                self._verified.popitem(last=False)
        return verified

    async def _verify_introspected(self, token: str) -> AccessToken | None:
        assert self._introspector is not None
        try:
            claims = await self._introspector.introspect(token)
        except (IntrospectionUnavailable, FetchFailed) as exc:
            raise AuthorizationServerUnavailable(str(exc)) from None
        if claims is None:
            return self._refused("inactive")
        now = self._clock()
        exp, nbf = _int_claim(claims, "exp"), _int_claim(claims, "nbf")
        if claims.get("iss", self._issuer) != self._issuer:
            return self._refused("issuer")
        if not set(_audiences(claims)) & set(self._audiences):
            return self._refused("audience")
        if exp is None or exp <= now:
            return self._refused("expired")
        if nbf is not None and nbf > now + self._skew:
            return self._refused("not_yet_valid")
        return self._access_token(token, {**claims, "iss": self._issuer})

    def _access_token(self, token: str, claims: dict[str, Any]) -> AccessToken:
        subject = claims.get("sub")
        return AccessToken(
            token=token,
            client_id=_client_id(claims),
            scopes=_scopes(claims),
            expires_at=_int_claim(claims, "exp"),
            resource=self._resource,
            subject=subject if isinstance(subject, str) and subject else None,
            claims=claims,
        )
