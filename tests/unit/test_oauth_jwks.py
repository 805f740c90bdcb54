"""The issuer's key set over time (adapters/mcp/oauth/jwks.py): cached, refetched when stale or
when a token names a key it lacks (at most once a cooldown), rotated keys retired, a failing
issuer served from the last good set for a bounded time. The fetch is the one input: a function
returning the documents a provider would publish; the clock is injected."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from adapters.mcp.oauth.fetch import FetchFailed
from adapters.mcp.oauth.jwks import STALE_LIMIT_S, JwksCache, KeySetUnavailable

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _ec(kid: str, **extra) -> dict:
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    return {**json.loads(ECAlgorithm.to_jwk(public)), "kid": kid, **extra}


class Provider:
    """What the issuer publishes at its jwks_uri, and how often it was asked."""

    def __init__(self, *keys: dict) -> None:
        self.keys = list(keys)
        self.down = False
        self.fetches = 0

    async def __call__(self) -> dict:
        self.fetches += 1
        if self.down:
            raise FetchFailed("jwks: HTTP 503")
        return {"keys": self.keys}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_fresh_set_is_reused_and_a_stale_one_refetched() -> None:
    provider, clock = Provider(_ec("a")), Clock()
    cache = JwksCache(provider, max_age_s=300, min_refresh_s=30, clock=clock)
    assert (await cache.key("a", "ES256")) is not None
    clock.now += 299
    assert (await cache.key("a", "ES256")) is not None and provider.fetches == 1
    clock.now += 2
    assert (await cache.key("a", "ES256")) is not None and provider.fetches == 2


async def test_an_unknown_key_id_refetches_once_a_cooldown() -> None:
    provider, clock = Provider(_ec("a")), Clock()
    cache = JwksCache(provider, max_age_s=300, min_refresh_s=30, clock=clock)
    await cache.key("a", "ES256")
    provider.keys.append(_ec("b"))  # rotation: the issuer publishes b
    assert await cache.key("b", "ES256") is None  # fetched moments ago: not asked again yet
    for kid in ("x", "y", "z"):
        assert await cache.key(kid, "ES256") is None
    assert provider.fetches == 1
    clock.now += 30
    assert await cache.key("b", "ES256") is not None and provider.fetches == 2


async def test_a_retired_key_is_gone_at_the_next_fetch() -> None:
    provider, clock = Provider(_ec("old"), _ec("new")), Clock()
    cache = JwksCache(provider, max_age_s=300, min_refresh_s=30, clock=clock)
    assert await cache.key("old", "ES256") is not None
    provider.keys = [k for k in provider.keys if k["kid"] == "new"]
    clock.now += 300
    assert await cache.key("old", "ES256") is None and provider.fetches == 2


async def test_a_failing_issuer_is_served_from_the_last_set_for_a_bounded_time() -> None:
    provider, clock = Provider(_ec("a")), Clock()
    cache = JwksCache(provider, max_age_s=300, min_refresh_s=30, clock=clock)
    await cache.key("a", "ES256")
    provider.down = True
    clock.now += 3600
    assert await cache.key("a", "ES256") is not None  # stale, but the issuer is down: still trusted
    clock.now += STALE_LIMIT_S
    with pytest.raises(KeySetUnavailable):
        await cache.key("a", "ES256")
    attempts = provider.fetches
    with pytest.raises(KeySetUnavailable):  # and the issuer is not hammered meanwhile
        await cache.key("a", "ES256")
    assert provider.fetches == attempts


async def test_no_set_at_all_is_unavailable_not_an_empty_set() -> None:
    provider = Provider()
    provider.down = True
    cache = JwksCache(provider, max_age_s=300, clock=Clock())
    with pytest.raises(KeySetUnavailable):
        await cache.key("a", "ES256")


async def test_keys_serve_only_their_own_algorithm() -> None:
    rsa_public = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    rsa_jwk = {**json.loads(RSAAlgorithm.to_jwk(rsa_public)), "kid": "r"}
    provider = Provider(_ec("e", alg="ES256"), rsa_jwk, _ec("enc", use="enc"),
                        {"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"})
    cache = JwksCache(provider, max_age_s=300, clock=Clock())
    assert await cache.key("e", "ES256") is not None
    assert await cache.key("e", "ES384") is None       # the JWK names its alg: only that one
    assert await cache.key("r", "RS256") is not None and await cache.key("r", "PS256") is not None
    assert await cache.key("r", "ES256") is None       # an RSA key is no EC key
    assert await cache.key("enc", "ES256") is None     # an encryption key verifies nothing
    assert await cache.key("hmac", "HS256") is None    # a symmetric key is never a verification key


async def test_a_token_without_a_key_id_needs_an_issuer_with_one_key() -> None:
    one = JwksCache(Provider(_ec("a")), max_age_s=300, clock=Clock())
    assert await one.key(None, "ES256") is not None
    two = JwksCache(Provider(_ec("a"), _ec("b")), max_age_s=300, clock=Clock())
    assert await two.key(None, "ES256") is None
