"""Fetching what the authorization server publishes: its metadata (RFC 8414 / OpenID discovery)
and its JSON documents, bounded in time and size.

Nothing here follows redirects or accepts a non-JSON answer: a metadata or key-set URL that
answers anything but a JSON object is a fetch failure, never an empty key set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from adapters.mcp.oauth.settings import OAuthConfigError, checked_url

FETCH_TIMEOUT_S = 5.0
MAX_DOCUMENT_BYTES = 1_048_576


class FetchFailed(Exception):
    """The authorization server did not answer with a usable document (the message names the URL)."""


async def fetch_json(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    try:
        response = await http.get(url, timeout=FETCH_TIMEOUT_S, follow_redirects=False,
                                  headers={"Accept": "application/json"})
    except httpx2.HTTPError as exc:
        raise FetchFailed(f"{url}: {type(exc).__name__}") from None
    if response.status_code != 200:
        raise FetchFailed(f"{url}: HTTP {response.status_code}")
    if len(response.content) > MAX_DOCUMENT_BYTES:
        raise FetchFailed(f"{url}: document over {MAX_DOCUMENT_BYTES} bytes")
    try:
        document = json.loads(response.content)
    except ValueError:
        raise FetchFailed(f"{url}: not JSON") from None
    if not isinstance(document, dict):
        raise FetchFailed(f"{url}: not a JSON object")
    return document


@dataclass(frozen=True)
class IssuerMetadata:
    issuer: str
    jwks_uri: str | None
    introspection_endpoint: str | None


def metadata_urls(issuer: str) -> list[str]:
    """RFC 8414 §3.1 (the well-known segment inserted before the issuer's path), OpenID Connect
    Discovery 1.0 §4 (appended after it), and RFC 8414's segment appended as Okta's custom
    authorization servers publish it: where providers publish their metadata, in that order."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    urls = [urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-authorization-server" + path, "", "")),
            urlunsplit((parts.scheme, parts.netloc, path + "/.well-known/openid-configuration", "", "")),
            urlunsplit((parts.scheme, parts.netloc, path + "/.well-known/oauth-authorization-server", "", ""))]
    return list(dict.fromkeys(urls))


async def fetch_issuer_metadata(http: httpx2.AsyncClient, issuer: str) -> IssuerMetadata:
    """The issuer's metadata; its ``issuer`` must be the configured one exactly (RFC 8414 §3.3,
    so a metadata document cannot redirect the adapter to another issuer's keys)."""
    failures = []
    for url in metadata_urls(issuer):
        try:
            document = await fetch_json(http, url)
        except FetchFailed as exc:
            failures.append(str(exc))
            continue
        if document.get("issuer") != issuer:
            raise FetchFailed(f"{url}: names issuer {document.get('issuer')!r}, not {issuer!r}")
        try:
            return IssuerMetadata(
                issuer=issuer,
                jwks_uri=_optional_url(document, "jwks_uri"),
                introspection_endpoint=_optional_url(document, "introspection_endpoint"),
            )
        except OAuthConfigError as exc:
            raise FetchFailed(f"{url}: {exc}") from None
    raise FetchFailed("no issuer metadata: " + "; ".join(failures))


def _optional_url(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    return None if value is None else checked_url(value, key)
