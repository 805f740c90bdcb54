"""The ASGI application `engram mcp --http` serves, assembled from the SDK's own parts.

    POST/GET/DELETE /mcp      the streamable HTTP transport (Host/Origin checked, always)
                              behind the SDK's bearer authentication when tokens or OAuth are set
    GET /.well-known/oauth-protected-resource[/mcp]   RFC 9728 metadata (OAuth only)

The SDK's ``Server.streamable_http_app`` builds the same pieces from the same ``AuthSettings``,
but publishes as ``scopes_supported`` only the scopes it would *require* of every token, and
offers no place for the scope challenge; so the pieces are put together here, in the order and
with the settings the SDK uses (``AuthSettings.issuer_url``, ``resource_server_url``,
``validate_token_resource``): authentication, then ``RequireAuthMiddleware`` (401
``invalid_token`` with ``resource_metadata=…``), then, with OAuth, :class:`ScopeChallenge` (403
``insufficient_scope`` naming the scope a tool call needs), then the transport.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from pydantic import AnyHttpUrl, ConfigDict, TypeAdapter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.mcp.oauth.caller_binding import CallerBindings, CallerBindingUnavailable
from adapters.mcp.oauth.verifier import AuthorizationServerUnavailable

logger = logging.getLogger("engram.mcp.http")

PRM_ROOT_PATH = "/.well-known/oauth-protected-resource"
# Issuer identifiers compare as exact strings (RFC 8414 §3.3): "https://idp" must not come out
# as "https://idp/" (pydantic's default), or clients refuse the issuer's metadata.
_URL = TypeAdapter(AnyHttpUrl, config=ConfigDict(url_preserve_empty_path=True))


def exact_url(value: str) -> AnyHttpUrl:
    """``value`` as a URL, spelled as given (no trailing slash added to an empty path)."""
    return _URL.validate_python(value)


@dataclass(frozen=True)
class OAuthResource:
    """What the adapter publishes and checks as an OAuth 2.1 resource server: the SDK's
    ``AuthSettings`` (issuer, this resource, tokens checked for it), the scopes it publishes,
    and the binding policy's answers per caller."""

    auth: AuthSettings
    scopes_supported: tuple[str, ...]
    callers: CallerBindings

    @classmethod
    def of(cls, *, issuer: str, resource: str, scopes_supported: tuple[str, ...],
           callers: CallerBindings) -> OAuthResource:
        auth = AuthSettings(issuer_url=exact_url(issuer), resource_server_url=exact_url(resource),
                            required_scopes=None, validate_token_resource=True)
        return cls(auth=auth, scopes_supported=scopes_supported, callers=callers)

    @property
    def resource(self) -> str:
        """This resource's identifier (RFC 8707), the audience its tokens must name."""
        return str(self.auth.resource_server_url)


def _json_response(status: int, body: Mapping[str, Any], headers: list[tuple[bytes, bytes]]) -> list[Message]:
    raw = json.dumps(body).encode()
    return [
        {"type": "http.response.start", "status": status,
         "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *headers]},
        {"type": "http.response.body", "body": raw},
    ]


class AuthorizationServerDown:
    """503 (retriable) when no token can be checked because the issuer cannot be reached: an
    outage must not look like a bad token (401 would send every client into a new sign-in)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except AuthorizationServerUnavailable as exc:
            if started or scope["type"] != "http":
                raise
            logger.warning("authorization server unavailable: %s", exc)
            for message in _json_response(503, {"error": "temporarily_unavailable",
                                                "error_description": "The authorization server cannot be reached."},
                                          [(b"retry-after", b"5")]):
                await send(message)


def challenged_scope(body: bytes, step_up: Mapping[str, str]) -> tuple[str, str] | None:
    """(tool, scope) when ``body`` is a JSON-RPC ``tools/call`` (or a batch holding one) of a
    tool that ``step_up`` says a further scope would open; None otherwise."""
    if b"tools/call" not in body or not any(tool.encode() in body for tool in step_up):
        return None  # the common case, decided without parsing the body
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the transport answers the parse error
    for message in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(message, dict) or message.get("method") != "tools/call":
            continue
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        if isinstance(name, str) and name in step_up:
            return name, step_up[name]
    return None


class ScopeChallenge:
    """403 ``insufficient_scope`` for a tool call the caller's token lacks the scope of (MCP
    authorization, scope challenge; RFC 6750 §3.1). The caller's binding says which tools a
    further scope would open (``step_up``); the challenge names that scope with the token's own,
    so a client re-authorizes for the union (SEP-2350) and keeps what it had. A tool no scope
    opens stays ``-32602 Unknown tool``, answered by the tool handler."""

    def __init__(self, app: ASGIApp, *, callers: CallerBindings, resource_metadata_url: str,
                 max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> None:
        self.app = app
        self._callers = callers
        self._metadata_url = resource_metadata_url
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get("user")
        if scope["type"] != "http" or scope.get("method") != "POST" or not isinstance(user, AuthenticatedUser):
            return await self.app(scope, receive, send)
        try:
            caller = await self._callers.aresolve(user.access_token)
        except CallerBindingUnavailable:
            return await self.app(scope, receive, send)  # the handler refuses (-32603)
        if not caller.step_up:
            return await self.app(scope, receive, send)
        messages, complete = await self._read(receive)
        challenge = challenged_scope(b"".join(m.get("body", b"") for m in messages), caller.step_up) \
            if complete else None
        if challenge is None:
            return await self.app(scope, _replaying(messages, receive), send)
        tool, needed = challenge
        scopes = " ".join(dict.fromkeys([*user.access_token.scopes, needed]))
        logger.info("scope challenge: tool=%s needs scope=%s", tool, needed)
        header = (f'Bearer error="insufficient_scope", scope="{scopes}", '
                  f'resource_metadata="{self._metadata_url}", '
                  f'error_description="{tool} needs scope {needed}"')
        for message in _json_response(403, {"error": "insufficient_scope", "error_description":
                                            f"{tool} needs scope {needed}", "scope": scopes},
                                      [(b"www-authenticate", header.encode())]):
            await send(message)

    async def _read(self, receive: Receive) -> tuple[list[Message], bool]:
        """The request's body messages, up to the transport's own limit (beyond it the transport
        refuses the request; nothing is challenged)."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, False
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return messages, True
            if size > self._max_body:
                return messages, False


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    queued = list(messages)

    async def replay() -> Message:
        return queued.pop(0) if queued else await receive()

    return replay


def build_http_app(
    server: Server[Any],
    *,
    path: str,
    transport_security: TransportSecuritySettings,
    verifier: TokenVerifier | None,
    oauth: OAuthResource | None = None,
) -> Starlette:
    """The app for ``server``: unauthenticated only in header-binding mode on loopback (the
    caller checked that), bearer tokens with ``verifier``, an OAuth resource with ``oauth``."""
    manager = StreamableHTTPSessionManager(app=server, security_settings=transport_security)
    endpoint: ASGIApp = StreamableHTTPASGIApp(manager)
    middleware: list[Middleware] = []
    routes: list[Route] = []
    metadata_url: AnyHttpUrl | None = None
    auth = oauth.auth if oauth is not None else None
    if oauth is not None and auth is not None and auth.resource_server_url is not None:
        metadata_url = build_resource_metadata_url(auth.resource_server_url)
        endpoint = ScopeChallenge(endpoint, callers=oauth.callers, resource_metadata_url=str(metadata_url))
        metadata_routes = create_protected_resource_routes(
            resource_url=auth.resource_server_url,
            authorization_servers=[auth.issuer_url],
            scopes_supported=list(oauth.scopes_supported),
            resource_name="Engram memory",
        )
        routes += metadata_routes
        # RFC 9728 §3.1 puts the metadata at the well-known path followed by the resource's
        # path; clients also try the bare well-known path (MCP authorization, SEP-985).
        if metadata_routes and metadata_routes[0].path != PRM_ROOT_PATH:
            routes.append(Route(PRM_ROOT_PATH, endpoint=metadata_routes[0].endpoint, methods=["GET", "OPTIONS"]))
    if verifier is not None:
        middleware = [
            Middleware(AuthorizationServerDown),
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(
                verifier, resource_server_url=auth.resource_server_url if auth and auth.validate_token_resource
                else None)),
            Middleware(AuthContextMiddleware),
        ]
        endpoint = RequireAuthMiddleware(endpoint, [], metadata_url)
    routes.insert(0, Route(path, endpoint=endpoint))
    return Starlette(routes=routes, middleware=middleware, lifespan=lambda app: manager.run())
