"""A real OpenID provider for the OAuth tests, and the person in front of the MCP client.

``start_idp`` runs ``tests/oauth/idp/idp.mjs`` (oidc-provider 8.x on node 20, installed by
``tools/setup`` with ``npm ci``) on a free loopback port, with signing keys made here, two users
and the clients a test names. :class:`Person` is what a human does in the browser, over plain
HTTP: follow the authorization redirect, sign in, consent (optionally refusing some scopes), and
hand the code to the client's callback. ``oauth_client`` is the official SDK client with its
``OAuthClientProvider``: discovery from the 401, PKCE, token, refresh, all the SDK's own.
"""

from __future__ import annotations

import json
import select
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

IDP_DIR = Path(__file__).resolve().parents[1] / "oauth" / "idp"  # node_modules: tools/setup --tests
SCOPES = "engram:read engram:write engram:forget"
PUBLIC_CLIENT = "mcp-client"
SHORT_LIVED_CLIENT = "mcp-client-short"  # its access tokens live SHORT_TTL_S: expiry and refresh
SHORT_TTL_S = 6
INTROSPECTING_CLIENT = "engram-rs"
INTROSPECTION_SECRET = "introspection-secret-for-tests-only-0123456789"
REDIRECT_URI = "http://127.0.0.1:9/oauth/callback"  # never contacted: the Person reads the redirect
PASSWORDS = {"alice": "alice-password-1", "bob": "bob-password-2", "carol": "carol-password-3"}
USERS = {  # the claims the binding policy maps; carol's tenant is one no issuer entry allows
    "alice": {"engram_tenant": "acme", "groups": ["eng"]},
    "bob": {"engram_tenant": "globex", "groups": ["ops"]},
    "carol": {"engram_tenant": "initech", "groups": ["eng"]},
}


@dataclass
class SigningKey:
    private: ec.EllipticCurvePrivateKey
    kid: str

    def private_jwk(self) -> dict[str, Any]:
        return {**json.loads(ECAlgorithm.to_jwk(self.private)), "kid": self.kid, "use": "sig", "alg": "ES256"}

    def sign(self, claims: dict[str, Any], *, headers: dict[str, Any] | None = None) -> str:
        return jwt.encode(claims, self.private, algorithm="ES256", headers={"kid": self.kid, **(headers or {})})


def new_key(kid: str) -> SigningKey:
    return SigningKey(ec.generate_private_key(ec.SECP256R1()), kid)


@dataclass
class Idp:
    issuer: str
    process: subprocess.Popen[bytes]
    key: SigningKey  # the key it signs with
    config_path: Path
    log_path: Path   # its stderr

    def jwks_requests(self) -> int:
        """How often its key set was fetched so far."""
        return self.log_path.read_text(errors="replace").count("jwks served")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def node_ready() -> None:
    """Fail (not skip) with the fix when the provider cannot run: a skipped test proves nothing."""
    if shutil.which("node") is None:
        raise AssertionError("the OAuth tests need node 20 on PATH (they run a real OpenID provider)")
    if not (IDP_DIR / "node_modules" / "oidc-provider").is_dir():
        raise AssertionError(f"oidc-provider is not installed: run tools/setup --tests (npm ci in {IDP_DIR})")


def _public_client(client_id: str, ttl: int) -> dict[str, Any]:
    return {"client_id": client_id, "token_endpoint_auth_method": "none", "application_type": "native",
            "redirect_uris": [REDIRECT_URI], "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"], "access_token_ttl": ttl, "id_token_signed_response_alg": "ES256"}


def start_idp(tmp: Path, *, resources: dict[str, dict[str, str]], keys: list[SigningKey] | None = None,
              port: int | None = None) -> Idp:
    """The provider with the users of ``USERS``, the public clients ``mcp-client`` (10-minute
    tokens) and ``mcp-client-short`` (``SHORT_TTL_S``), both authorization code + PKCE + refresh,
    and the confidential ``engram-rs`` the adapter introspects with; ``resources``: resource
    indicator -> {scope, format}; ``keys``: its key set, the first signing (default: one new key);
    ``port``: listen there (a restart of the same issuer) instead of where the OS says."""
    node_ready()
    keys = keys or [new_key("idp-key-1")]
    key = keys[0]
    config = {
        "jwks": {"keys": [k.private_jwk() for k in keys]},
        **({"port": port} if port is not None else {}),
        "alg": "ES256",
        "clients": [
            _public_client(PUBLIC_CLIENT, 600),
            _public_client(SHORT_LIVED_CLIENT, SHORT_TTL_S),
            {"client_id": INTROSPECTING_CLIENT, "client_secret": INTROSPECTION_SECRET,
             "token_endpoint_auth_method": "client_secret_basic", "grant_types": [], "response_types": [],
             "redirect_uris": [], "id_token_signed_response_alg": "ES256"},
        ],
        "users": {name: {"password": PASSWORDS[name], "claims": claims} for name, claims in USERS.items()},
        "resources": resources,
    }
    config_path = tmp / f"idp-{uuid.uuid4().hex[:8]}.json"
    config_path.write_text(json.dumps(config))
    log_path = config_path.with_suffix(".log")
    with open(log_path, "wb") as log:  # a file, not a pipe: nothing the provider writes can block it
        process = subprocess.Popen(["node", str(IDP_DIR / "idp.mjs"), str(config_path)], cwd=IDP_DIR,
                                   stdout=subprocess.PIPE, stderr=log)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline() if ready else b""
    if not line:
        process.kill()
        raise AssertionError(f"the OpenID provider did not start: {log_path.read_text(errors='replace')}")
    return Idp(issuer=json.loads(line)["issuer"], process=process, key=key, config_path=config_path,
               log_path=log_path)


@dataclass
class Person:
    """A human at the browser: signs in as ``login`` and consents, refusing the scopes in
    ``refuse``. Counts the sign-ins, so a test can tell a refresh from a new authorization."""

    login: str
    refuse: tuple[str, ...] = ()
    sign_ins: int = 0
    _result: AuthorizationCodeResult | None = None
    consented: list[dict[str, list[str]]] = field(default_factory=list)

    async def redirect(self, authorization_url: str) -> None:
        self.sign_ins += 1
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as browser:
            response = await browser.get(authorization_url)
            for _ in range(12):
                location = response.headers.get("location")
                if location is None:
                    raise AssertionError(f"authorization stopped at {response.status_code} {response.url}: {response.text[-900:]}")
                target = urljoin(str(response.url), location)
                if target.startswith(REDIRECT_URI):
                    query = parse_qs(urlsplit(target).query)
                    if "error" in query:
                        raise AssertionError(f"authorization refused: {query}")
                    self._result = AuthorizationCodeResult(code=query["code"][0], state=query.get("state", [None])[0],
                                                           iss=query.get("iss", [None])[0])
                    return
                if "/interaction/" in urlsplit(target).path:
                    response = await self._interact(browser, target)
                else:
                    response = await browser.get(target)
        raise AssertionError("too many redirects")

    async def _interact(self, browser: httpx2.AsyncClient, url: str) -> httpx2.Response:
        details = (await browser.get(url)).json()
        if details["prompt"] == "login":
            return await browser.post(url + "/login", json={"login": self.login, "password": PASSWORDS[self.login]})
        self.consented.append(details["missing_scopes"])
        return await browser.post(url + "/consent", json={"reject": list(self.refuse)})

    async def callback(self) -> AuthorizationCodeResult:
        assert self._result is not None, "the redirect handler produced no code"
        result, self._result = self._result, None
        return result


class MemoryTokens:
    """The SDK's TokenStorage, in memory, pre-registered with the public client."""

    def __init__(self, issuer: str, client_id: str = PUBLIC_CLIENT) -> None:
        self.tokens: OAuthToken | None = None
        self.client = OAuthClientInformationFull(
            client_id=client_id, redirect_uris=[REDIRECT_URI], token_endpoint_auth_method="none",
            grant_types=["authorization_code", "refresh_token"], response_types=["code"], issuer=issuer)
        self.history: list[OAuthToken] = []

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.history.append(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def oauth_client(url: str, idp: Idp, person: Person, *, mode: str = "auto", elicitation: Any = None,
                 client_id: str = PUBLIC_CLIENT, event_hooks: dict[str, list[Any]] | None = None,
                 ) -> tuple[Client, MemoryTokens]:
    """The SDK's ``Client`` over streamable HTTP with the SDK's ``OAuthClientProvider``, and the
    storage it keeps its tokens in."""
    storage = MemoryTokens(idp.issuer, client_id)
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(redirect_uris=[REDIRECT_URI], grant_types=["authorization_code", "refresh_token"],
                                            token_endpoint_auth_method="none", client_name="engram tests"),
        storage=storage,
        redirect_handler=person.redirect,
        callback_handler=person.callback,
    )
    http = httpx2.AsyncClient(auth=provider, timeout=30, event_hooks=event_hooks or {})
    return Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=elicitation), storage


def binding_bundle(directory: Path, issuer: str) -> Path:
    """The bundled policies with ``issuer`` bound: the tenant from the ``engram_tenant`` claim
    (acme or globex), workspace ws-main."""
    bundle = directory / "policies"
    shutil.copytree(Path(__file__).resolve().parents[2] / "policies", bundle)
    data = json.loads((bundle / "data.json").read_text())
    data["engram"]["config"]["binding"]["issuers"] = {issuer: {
        "tenant_claim": "engram_tenant", "tenants": ["acme", "globex"], "workspace": "ws-main",
        "purpose_ref": "purpose:engineering-notes",
    }}
    (bundle / "data.json").write_text(json.dumps(data))
    return bundle
