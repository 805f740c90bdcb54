"""Who is at the keyboard: sessions, the local token, OpenID Connect sign-in, CSRF tokens.

- Sessions live in this process only (a random id in an HttpOnly, SameSite=Strict cookie, Secure
  under TLS); nothing a browser holds says who it is without the server's table. A restart signs
  everyone out, which is the safe direction.
- The local token (`engram init` writes it beside the host TOML, 0600) signs in the one person of
  a single-person install as ``local:owner``. Its digest is compared in constant time, and the
  file is read at each sign-in, so replacing it takes effect at once.
- OpenID Connect: authorization code with PKCE (S256), a state bound to the browser by a cookie,
  a nonce bound to the ID token; the ID token is verified against the issuer's JWKS (the MCP
  adapter's key-set cache, adapters/mcp/oauth/jwks.py) for issuer, audience, expiry and nonce.
- CSRF: every session holds a token each state-changing form carries; the sign-in form, made
  before there is a session, is a double submit of a cookie and a field. Compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

SESSION_TTL_S = 8 * 3600
PENDING_TTL_S = 600
LOCAL_ISSUER = "local"
LOCAL_SUBJECT = "local:owner"
ID_TOKEN_ALGORITHMS = ("ES256", "ES384", "RS256", "RS384", "RS512", "PS256", "EdDSA")


def same(a: str, b: str) -> bool:
    """Constant-time equality of two secrets (over their digests, so lengths leak nothing)."""
    return hmac.compare_digest(hashlib.sha256(a.encode()).digest(), hashlib.sha256(b.encode()).digest())


@dataclass
class Session:
    sid: str
    subject: str
    issuer: str
    claims: dict[str, Any]
    csrf: str
    expires_at: float

    @property
    def principal(self) -> str:
        """The principal the core audits for this person's actions."""
        if self.issuer == LOCAL_ISSUER:
            return self.subject
        return f"oidc:{self.subject}@{urlsplit(self.issuer).netloc}"

    @property
    def audit_session(self) -> str:
        """The session id as the core's audit sees it: a digest, never the cookie's value."""
        return "console-" + hashlib.sha256(self.sid.encode()).hexdigest()[:16]


class Sessions:
    """The session table (thread-safe: handlers run on a thread pool as well as the event loop)."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, subject: str, issuer: str, claims: dict[str, Any]) -> Session:
        s = Session(secrets.token_urlsafe(32), subject, issuer, claims, secrets.token_urlsafe(32),
                    time.monotonic() + self._ttl_s)
        with self._lock:
            if len(self._by_id) >= 1024:  # drop the expired ones now and then: the table stays small
                now = time.monotonic()
                self._by_id = {k: v for k, v in self._by_id.items() if v.expires_at > now}
            self._by_id[s.sid] = s
        return s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            s = self._by_id.get(sid)
            if s is not None and s.expires_at <= time.monotonic():
                del self._by_id[sid]
                return None
            return s

    def drop(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


def local_token_matches(token_file: Path | None, offered: str) -> bool:
    """Whether ``offered`` is the local token; False when no token file is configured or readable."""
    if token_file is None or not offered:
        return False
    try:
        expected = token_file.read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return bool(expected) and same(expected, offered.strip())


# -- OpenID Connect --------------------------------------------------------------------------
class SignInFailed(Exception):
    """An OpenID sign-in that cannot complete (the message is for the log, not the page)."""


@dataclass
class Pending:
    """One authorization request in flight, keyed by its state."""

    issuer: str
    verifier: str
    nonce: str
    expires_at: float
    next_page: str = ""  # where the person goes once signed in: a checked relative path, kept here, never sent out


@dataclass
class Provider:
    """One configured issuer and what its discovery document published."""

    issuer: str
    client_id: str
    client_secret: str = ""
    scopes: str = "openid profile email"
    authorization_endpoint: str = ""
    token_endpoint: str = ""
    jwks: Any = None  # adapters.mcp.oauth.jwks.JwksCache, made at discovery
    discovered: bool = False
    lock: Any = field(default=None)


class OpenIdSignIn:
    """Authorization code + PKCE against the configured issuers."""

    def __init__(self, providers: list[Provider], redirect_uri: str) -> None:
        self.providers = {p.issuer: p for p in providers}
        self.redirect_uri = redirect_uri
        self._pending: dict[str, Pending] = {}
        self._lock = threading.Lock()

    async def _discover(self, p: Provider) -> None:
        import anyio
        import httpx2

        from adapters.mcp.oauth.fetch import fetch_json
        from adapters.mcp.oauth.jwks import JwksCache

        if p.lock is None:
            p.lock = anyio.Lock()
        async with p.lock:
            if p.discovered:
                return
            url = p.issuer.rstrip("/") + "/.well-known/openid-configuration"
            async with httpx2.AsyncClient() as http:
                doc = await fetch_json(http, url)
            if doc.get("issuer") != p.issuer:
                raise SignInFailed(f"{url} names issuer {doc.get('issuer')!r}, not {p.issuer!r}")
            for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(doc.get(key), str):
                    raise SignInFailed(f"{url} publishes no {key}")
            p.authorization_endpoint, p.token_endpoint = doc["authorization_endpoint"], doc["token_endpoint"]
            jwks_uri = doc["jwks_uri"]

            async def fetch_keys() -> dict[str, Any]:
                async with httpx2.AsyncClient() as http:
                    return await fetch_json(http, jwks_uri)

            p.jwks = JwksCache(fetch_keys, max_age_s=300)
            p.discovered = True

    async def begin(self, issuer: str, next_page: str = "") -> tuple[str, str]:
        """(the authorization URL to send the browser to, the state to bind to it by cookie).
        ``next_page`` (already checked by the caller: a path of this console) is kept with the
        state on the server, so neither the provider nor the browser can change where it leads."""
        p = self.providers.get(issuer)
        if p is None:
            raise SignInFailed("unknown issuer")
        await self._discover(p)
        state, nonce, verifier = (secrets.token_urlsafe(32) for _ in range(3))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        now = time.monotonic()
        with self._lock:
            self._pending = {k: v for k, v in self._pending.items() if v.expires_at > now}
            self._pending[state] = Pending(issuer, verifier, nonce, now + PENDING_TTL_S, next_page)
        query = urlencode({"response_type": "code", "client_id": p.client_id, "redirect_uri": self.redirect_uri,
                           "scope": p.scopes, "state": state, "nonce": nonce, "code_challenge": challenge,
                           "code_challenge_method": "S256"})
        sep = "&" if "?" in p.authorization_endpoint else "?"
        return p.authorization_endpoint + sep + query, state

    async def complete(self, state: str, bound_state: str, code: str) -> tuple[str, str, dict[str, Any], str]:
        """(subject, issuer, verified claims, the page to return to) for the code the provider returned."""
        import httpx2
        import jwt

        from adapters.mcp.oauth.fetch import request_json

        if not state or not bound_state or not same(state, bound_state):
            raise SignInFailed("state does not match this browser's")
        with self._lock:
            pending = self._pending.pop(state, None)
        if pending is None or pending.expires_at <= time.monotonic():
            raise SignInFailed("unknown or expired state")
        p = self.providers[pending.issuer]
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.redirect_uri,
                "client_id": p.client_id, "code_verifier": pending.verifier}
        auth = (p.client_id, p.client_secret) if p.client_secret else None
        async with httpx2.AsyncClient() as http:
            status, doc = await request_json(http, "POST", p.token_endpoint, data=form,
                                             **({"auth": auth} if auth else {}))
        if status != 200 or not isinstance(doc, dict) or not isinstance(doc.get("id_token"), str):
            raise SignInFailed(f"token endpoint answered {status} without an ID token")
        token = doc["id_token"]
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise SignInFailed(f"ID token: {exc}") from None
        alg = header.get("alg")
        if alg not in ID_TOKEN_ALGORITHMS:
            raise SignInFailed(f"ID token algorithm {alg!r} not accepted")
        key = await p.jwks.key(header.get("kid"), alg)
        if key is None:
            raise SignInFailed("ID token signed by a key the issuer does not publish")
        try:
            claims = jwt.decode(token, key=key, algorithms=[alg], audience=p.client_id, issuer=p.issuer,
                                options={"require": ["exp", "iat", "sub", "iss", "aud"]}, leeway=30)
        except jwt.PyJWTError as exc:
            raise SignInFailed(f"ID token: {exc}") from None
        if not isinstance(claims.get("nonce"), str) or not same(claims["nonce"], pending.nonce):
            raise SignInFailed("ID token nonce does not match")
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise SignInFailed("ID token has no subject")
        return claims["sub"], p.issuer, claims, pending.next_page
