"""The token verifier's memory of verified JWTs (adapters/mcp/oauth/verifier.py): a session's
token is checked once, and stays accepted only while it has not expired and the key that
verified it is still published. The provider's documents are the fetch function's answers."""

from __future__ import annotations

import json
import time
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

from adapters.mcp.oauth.jwks import JwksCache
from adapters.mcp.oauth.verifier import OAuthTokenVerifier

pytestmark = pytest.mark.anyio
ISSUER, RESOURCE = "https://idp.example.com", "https://memory.example.com/mcp"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _key(kid: str) -> tuple[ec.EllipticCurvePrivateKey, dict]:
    private = ec.generate_private_key(ec.SECP256R1())
    return private, {**json.loads(ECAlgorithm.to_jwk(private.public_key())), "kid": kid, "alg": "ES256"}


def _token(private: ec.EllipticCurvePrivateKey, kid: str, *, exp_in: int = 300, **claims) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": RESOURCE, "sub": "ada", "client_id": "c", "iat": now, "exp": now + exp_in,
            "scope": "engram:read", "jti": uuid.uuid4().hex, **claims}
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, private, algorithm="ES256", headers={"kid": kid})


def _verifier(published: list[dict], clock: Clock) -> tuple[OAuthTokenVerifier, list[int]]:
    fetches = [0]

    async def fetch() -> dict:
        fetches[0] += 1
        return {"keys": list(published)}

    jwks = JwksCache(fetch, max_age_s=300, min_refresh_s=30, clock=clock)
    return OAuthTokenVerifier(issuer=ISSUER, resource=RESOURCE, algorithms=("ES256",), clock_skew_s=5,
                              jwks=jwks, max_age_s=300, clock=clock), fetches


async def test_a_verified_token_is_remembered_and_its_claims_kept() -> None:
    private, jwk = _key("k1")
    verifier, fetches = _verifier([jwk], Clock())
    token = _token(private, "k1", engram_tenant="acme")
    first = await verifier.verify_token(token)
    assert first is not None and first.subject == "ada" and first.scopes == ["engram:read"]
    assert first.claims is not None and first.claims["engram_tenant"] == "acme" and first.resource == RESOURCE
    assert await verifier.verify_token(token) is first and fetches[0] == 1


async def test_a_remembered_token_stops_when_its_key_is_retired() -> None:
    clock = Clock()
    private, jwk = _key("k1")
    published = [jwk]
    verifier, _ = _verifier(published, clock)
    token = _token(private, "k1")
    assert await verifier.verify_token(token) is not None
    published.clear()
    published.append(_key("k2")[1])  # the issuer retired k1
    clock.now += 301                 # the key set is fetched again
    assert await verifier.verify_token(_token(*_key("k3")[:1], "k3")) is None  # any call refreshes the set
    assert await verifier.verify_token(token) is None


async def test_a_remembered_token_stops_at_its_expiry() -> None:
    private, jwk = _key("k1")

    async def fetch() -> dict:
        return {"keys": [jwk]}

    verifier = OAuthTokenVerifier(issuer=ISSUER, resource=RESOURCE, algorithms=("ES256",), clock_skew_s=0,
                                  jwks=JwksCache(fetch, max_age_s=300), max_age_s=300)  # the real clock
    token = _token(private, "k1", exp_in=2)
    assert await verifier.verify_token(token) is not None
    time.sleep(2.2)
    assert await verifier.verify_token(token) is None


async def test_tokens_not_for_this_resource_are_never_remembered() -> None:
    private, jwk = _key("k1")
    verifier, _ = _verifier([jwk], Clock())
    for bad in (_token(private, "k1", aud="https://other.example.com/mcp"), _token(private, "k1", iss="https://x"),
                _token(private, "k1", exp_in=-600)):
        assert await verifier.verify_token(bad) is None
    assert not verifier._verified


async def test_providers_spell_the_client_and_the_scopes_differently() -> None:
    private, jwk = _key("k1")
    verifier, _ = _verifier([jwk], Clock())
    okta = await verifier.verify_token(_token(private, "k1", client_id=None, cid="0oa1okta", scope=None,
                                              scp=["engram:read", "engram:write"]))
    assert okta is not None and okta.client_id == "0oa1okta" and okta.scopes == ["engram:read", "engram:write"]
    keycloak = await verifier.verify_token(_token(private, "k1", client_id=None, azp="vscode",
                                                  scope="openid engram:read"))
    assert keycloak is not None and keycloak.client_id == "vscode" and keycloak.scopes == ["openid", "engram:read"]
