"""The issuer's signing keys (its JWKS): fetched, cached, and followed through rotation.

- A key set is reused for ``max_age_s`` after a successful fetch, then fetched again.
- A token naming a key id the cached set lacks (the issuer rotated) makes one fetch, but at most
  one every ``min_refresh_s`` (``jwks_refresh_cooldown_s``, 30 s by default, as jose's remote key
  sets): tokens with made-up key ids cannot turn the adapter into a flood against the issuer.
  Until the next allowed fetch such a token is refused (an issuer that publishes a key before it
  signs with it, as rotation should, is never caught by this).
- When a fetch fails, the last good set keeps serving for at most ``STALE_LIMIT_S``: a short
  outage of the issuer does not sign everyone out, a long one stops accepting its keys.
- A key the issuer removed is gone at the next fetch: rotation retires keys as well as adding them.
- One fetch at a time: a request that finds the set stale waits on the fetch already under way
  rather than making its own. The fetch is bounded by ``fetch_deadline_s`` of wall clock (and the
  verifier's ``check_deadline_s`` bounds the wait; both in ``[http.oauth]``): a slow issuer yields
  a prompt 503 to the first request and to those waiting behind it, not a hang (issue 57).

Keys are parsed by PyJWT (``PyJWK``); a key is used only for the one algorithm it is bound to
(its ``alg``, or the token's when the JWK names none and its type fits), never for HMAC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from jwt import PyJWK
from jwt.exceptions import PyJWTError

from adapters.mcp.oauth.fetch import FetchFailed

logger = logging.getLogger("engram.mcp.oauth")

DEFAULT_MIN_REFRESH_S = 30.0
STALE_LIMIT_S = 86_400.0
_MAX_KEYS = 64


class KeySetUnavailable(Exception):
    """No key set could be fetched and none is cached: the token cannot be checked now."""


def _signing_keys(document: dict[str, Any]) -> dict[str | None, dict[str, Any]]:
    keys = document.get("keys")
    if not isinstance(keys, list):
        raise FetchFailed("JWKS has no keys list")
    usable: dict[str | None, dict[str, Any]] = {}
    for jwk in keys[:_MAX_KEYS]:
        if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig" or "d" in jwk or "k" in jwk:
            continue  # encryption keys, private or symmetric material: never verification keys
        kid = jwk.get("kid")
        if kid is not None and not isinstance(kid, str):
            continue
        usable[kid] = jwk
    if not usable:
        raise FetchFailed("JWKS holds no signature verification key")
    return usable


class JwksCache:
    """One issuer's key set. ``fetch`` returns the JWKS document (raises FetchFailed)."""

    def __init__(self, fetch: Callable[[], Awaitable[dict[str, Any]]], *, max_age_s: float,
                 min_refresh_s: float = DEFAULT_MIN_REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._max_age_s = max_age_s
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._keys: dict[str | None, dict[str, Any]] = {}
        self._parsed: dict[tuple[str | None, str], PyJWK] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._lock = anyio.Lock()
        self.fetches = 0  # successful fetches, for tests and doctor

    async def key(self, kid: str | None, alg: str) -> PyJWK | None:
        """The verification key ``kid`` names for ``alg``, or None (unknown, or of another algorithm).
        Raises KeySetUnavailable when no key set can be had at all."""
        now = self._clock()
        if self._stale(now) or self._find(kid) is None:
            await self._refresh(force_for_kid=kid)
        jwk = self._find(kid)
        return None if jwk is None else self._parse(jwk, kid, alg)

    def publishes(self, kid: str | None) -> bool:
        """Whether the key set as last fetched still holds ``kid`` (no fetch)."""
        return self._find(kid) is not None

    def _stale(self, now: float) -> bool:
        return self._fetched_at is None or now - self._fetched_at >= self._max_age_s

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        if kid is not None:
            return self._keys.get(kid)
        # A token without a key id is checkable only against an issuer with exactly one key.
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    def _parse(self, jwk: dict[str, Any], kid: str | None, alg: str) -> PyJWK | None:
        memo = self._parsed.get((kid, alg))
        if memo is not None:
            return memo
        if jwk.get("alg") not in (None, alg):
            return None
        try:
            parsed = PyJWK(jwk, algorithm=alg)
        except PyJWTError:
            return None  # a key of another type (an EC key for RS256, say)
        self._parsed[(kid, alg)] = parsed
        return parsed

    async def _refresh(self, *, force_for_kid: str | None) -> None:
        async with self._lock:
            now = self._clock()
            if not self._stale(now) and self._find(force_for_kid) is not None:
                return  # another request fetched while this one waited
            if self._attempted_at is not None and now - self._attempted_at < self._min_refresh_s:
                if self._fetched_at is None or now - self._fetched_at >= STALE_LIMIT_S:
                    raise KeySetUnavailable("the issuer's keys cannot be fetched (tried moments ago)")
                return  # fetched (or tried) moments ago: serve what is cached
            self._attempted_at = now
            try:
                keys = _signing_keys(await self._fetch())
            except FetchFailed as exc:
                logger.warning("jwks fetch failed: %s", exc)
                if self._fetched_at is None or now - self._fetched_at >= STALE_LIMIT_S:
                    raise KeySetUnavailable(str(exc)) from None
                return
            if set(keys) != set(self._keys):
                logger.info("jwks now holds %d key(s): %s", len(keys), ", ".join(sorted(str(k) for k in keys)))
            self._keys, self._parsed, self._fetched_at = keys, {}, now
            self.fetches += 1
