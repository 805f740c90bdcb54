"""What `engram doctor` says about `engram mcp --http`: whether it would start, and who it lets in.

Static tokens: whether a token is configured (an HTTP adapter with a ``[binding]`` refuses to
start without one, on loopback too) and the token file is the owner's alone. OAuth: whether the
issuer publishes its metadata and a key set with keys for the accepted algorithms, whether the
introspection endpoint is known when opaque tokens are expected, and whether the binding policy
binds anyone from that issuer (the default bundle binds nobody).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx2

from adapters.mcp.config import HostConfig
from adapters.mcp.oauth.fetch import FetchFailed, fetch_issuer_metadata, fetch_json
from adapters.mcp.oauth.settings import OAuthSettings

Emit = Callable[[str, str, str], None]  # (level "ok" | "warn" | "FAIL", text, fix)


def http_findings(config: HostConfig, emit: Emit) -> None:
    http = config.http
    if http.oauth is not None:
        _oauth_findings(http.oauth, emit)
    elif http.token_file_problem is not None:
        emit("FAIL", f"`engram mcp --http` refuses to start: {http.token_file_problem}",
             "fix the token file, or `engram init --force` makes a new one (stdio is not affected)")
    elif http.token_digests:
        source = f" (token file {http.token_file})" if http.token_file else ""
        emit("ok", f"`engram mcp --http` requires a bearer token: {len(http.token_digests)} configured{source}", "")
    elif config.binding is None:
        emit("ok", "`engram mcp --http` binds each request from its signed X-Engram-Host-Context "
                   "(loopback only without bearer tokens)", "")
    else:
        emit("warn", "`engram mcp --http` would refuse to start: no bearer token in [http] (other users of "
                     "this machine reach loopback too); stdio is not affected",
             "`engram init --force` writes a token file, or set token_file in [http] (docs/mcp-clients.md §3)")


def _oauth_findings(settings: OAuthSettings, emit: Emit) -> None:
    async def probe() -> None:
        async with httpx2.AsyncClient() as http:
            try:
                metadata = await fetch_issuer_metadata(http, settings.issuer, deadline_s=settings.fetch_deadline_s)
            except FetchFailed as exc:
                emit("FAIL", f"OAuth issuer {settings.issuer} publishes no usable metadata: {exc}",
                     "check issuer in [http.oauth] (it must equal the provider's own `issuer`) and that it is reachable")
                return
            jwks_uri = settings.jwks_uri or metadata.jwks_uri
            if jwks_uri is None:
                emit("FAIL", f"OAuth issuer {settings.issuer} names no jwks_uri", "set jwks_uri in [http.oauth]")
            else:
                try:
                    document = await fetch_json(http, jwks_uri, deadline_s=settings.fetch_deadline_s)
                    keys = [k for k in document.get("keys", []) if isinstance(k, dict) and k.get("use", "sig") == "sig"]
                except FetchFailed as exc:
                    emit("FAIL", f"OAuth key set unavailable: {exc}", "check jwks_uri (or the issuer's metadata)")
                    keys = None
                if keys is not None:
                    algs = sorted({k.get("alg", k.get("kty", "?")) for k in keys})
                    emit("ok" if keys else "FAIL", f"OAuth issuer {settings.issuer}: {len(keys)} signing key(s) "
                         f"({', '.join(algs) or 'none'}); accepted algorithms {', '.join(settings.algorithms)}",
                         "" if keys else "the provider publishes no signature key")
            if settings.introspection_client is not None and not (settings.introspection_endpoint
                                                                  or metadata.introspection_endpoint):
                emit("FAIL", "opaque tokens are expected but the issuer names no introspection_endpoint",
                     "set introspection_endpoint in [http.oauth]")

    anyio.run(probe)
    _binding_policy_findings(settings, emit)


def _binding_policy_findings(settings: OAuthSettings, emit: Emit) -> None:
    from adapters.mcp.oauth.caller_binding import CallerBindings, CallerBindingUnavailable
    from adapters.mcp.oauth.resource_server import policy_engine
    from engram_core.contract.errors import EngramError
    from engram_core.policy.port import BINDING

    try:
        engine = policy_engine(settings)
    except EngramError as exc:
        emit("FAIL", f"the binding policy does not load: {exc.detail}", "engram policy check on the bundle")
        return
    try:
        try:
            scopes = settings.scopes_supported or CallerBindings(engine, cache_s=0).scopes_supported()
        except CallerBindingUnavailable as exc:
            emit("FAIL", f"the binding policy does not answer: {exc}", "engram policy check on the bundle")
            return
        probe = {"issuer": settings.issuer, "subject": "engram-doctor", "client_id": "engram-doctor",
                 "scopes": list(scopes), "audience": settings.resource or "", "claims": {}, "now_ms": 0}
        codes = {r.get("code") for r in engine.decide(BINDING, probe).result.get("reasons", [])}
        if "UNKNOWN_ISSUER" in codes:
            emit("warn", f"the binding policy binds nobody from {settings.issuer}: every caller gets no tools",
                 f"add data.engram.config.binding.issuers[\"{settings.issuer}\"] to the bundle (docs/operations.md)")
        else:
            emit("ok", f"the binding policy (revision {engine.revision()}) has an entry for {settings.issuer}; "
                       f"scopes published: {' '.join(scopes)}", "")
    except EngramError as exc:
        emit("FAIL", f"the binding policy does not answer: {exc.detail}", "engram policy check on the bundle")
    finally:
        engine.close()
