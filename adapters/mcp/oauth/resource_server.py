"""Putting the OAuth resource server together from ``[http.oauth]``: the issuer's metadata, its
key set, introspection, the token verifier and the binding policy's answers.

The issuer's metadata is fetched when first needed (not at start-up: the adapter starts while
the provider is down, and then answers 503 until it is back), once, and again only after a
failure, at most every ``RETRY_S``. Its lock is held across the fetch, which is bounded by
``fetch_deadline_s`` for all candidate URLs together: a caller waiting on it waits no longer than
that (and the verifier's own ``check_deadline_s`` bounds every caller regardless).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import httpx2

from adapters.mcp.http_app import OAuthResource
from adapters.mcp.oauth.caller_binding import CallerBindings
from adapters.mcp.oauth.fetch import (
    FetchFailed,
    IssuerMetadata,
    fetch_issuer_metadata,
    fetch_json,
)
from adapters.mcp.oauth.introspection import IntrospectionBudget, Introspector
from adapters.mcp.oauth.jwks import JwksCache
from adapters.mcp.oauth.settings import DEFAULT_FETCH_DEADLINE_S, OAuthSettings
from adapters.mcp.oauth.verifier import OAuthTokenVerifier
from engram_core.policy.port import PolicyEngine

RETRY_S = 30.0


class IssuerDiscovery:
    """The issuer's metadata, fetched once on first use."""

    def __init__(self, http: httpx2.AsyncClient, issuer: str, *, deadline_s: float = DEFAULT_FETCH_DEADLINE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._http = http
        self._issuer = issuer
        self._deadline_s = deadline_s
        self._clock = clock
        self._metadata: IssuerMetadata | None = None
        self._failed_at: float | None = None
        self._failure = ""
        self._lock = anyio.Lock()

    async def metadata(self) -> IssuerMetadata:
        if self._metadata is not None:
            return self._metadata
        async with self._lock:
            if self._metadata is not None:
                return self._metadata
            if self._failed_at is not None and self._clock() - self._failed_at < RETRY_S:
                raise FetchFailed(self._failure)
            try:
                self._metadata = await fetch_issuer_metadata(self._http, self._issuer, deadline_s=self._deadline_s)
            except FetchFailed as exc:
                self._failed_at, self._failure = self._clock(), str(exc)
                raise
            return self._metadata


@dataclass(frozen=True)
class ResourceServer:
    verifier: OAuthTokenVerifier
    resource: OAuthResource
    http: httpx2.AsyncClient


def build_resource_server(settings: OAuthSettings, *, served_url: str, callers: CallerBindings) -> ResourceServer:
    """``served_url``: the adapter's own endpoint URL, the resource when ``resource`` is not set."""
    http = httpx2.AsyncClient()
    discovery = IssuerDiscovery(http, settings.issuer, deadline_s=settings.fetch_deadline_s)

    async def jwks_document() -> dict:
        uri = settings.jwks_uri or (await discovery.metadata()).jwks_uri
        if uri is None:
            raise FetchFailed(f"the metadata of {settings.issuer} names no jwks_uri")
        return await fetch_json(http, uri, deadline_s=settings.fetch_deadline_s)

    async def introspection_endpoint() -> str:
        endpoint = settings.introspection_endpoint or (await discovery.metadata()).introspection_endpoint
        if endpoint is None:
            raise FetchFailed(f"the metadata of {settings.issuer} names no introspection_endpoint")
        return endpoint

    introspector = None
    if settings.introspection_client is not None:
        introspector = Introspector(http, endpoint=introspection_endpoint, client=settings.introspection_client,
                                    cache_s=settings.introspection_cache_s,
                                    budget=IntrospectionBudget(settings.introspection_budget_per_s),
                                    deadline_s=settings.fetch_deadline_s)
    resource = settings.resource or served_url
    verifier = OAuthTokenVerifier(
        issuer=settings.issuer, resource=resource, algorithms=settings.algorithms,
        clock_skew_s=settings.clock_skew_s,
        jwks=JwksCache(jwks_document, max_age_s=settings.jwks_max_age_s,
                       min_refresh_s=settings.jwks_refresh_cooldown_s),
        introspector=introspector, max_age_s=settings.jwks_max_age_s, check_deadline_s=settings.check_deadline_s)
    scopes = settings.scopes_supported or tuple(callers.scopes_supported())
    return ResourceServer(verifier=verifier, http=http, resource=OAuthResource.of(
        issuer=settings.issuer, resource=resource, scopes_supported=tuple(scopes), callers=callers))


def policy_engine(settings: OAuthSettings) -> PolicyEngine:
    """The engine that answers ``engram/binding``: the bundle at ``policies`` (default: the bundled
    one) in-process, or the OPA at ``opa_url``; loaded now, so a broken bundle stops the start."""
    engine: PolicyEngine
    if settings.opa_url:
        from engram_core.policy.opa_rest import OpaRestPolicyEngine

        engine = OpaRestPolicyEngine(settings.opa_url)
    else:
        from engram_core.policy import default_bundle_dir
        from engram_core.policy.embedded import EmbeddedPolicyEngine

        engine = EmbeddedPolicyEngine(settings.policies or default_bundle_dir())
    engine.reload()
    return engine
