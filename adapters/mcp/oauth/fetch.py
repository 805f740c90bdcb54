"""Fetching what the authorization server publishes: its metadata (RFC 8414 / OpenID discovery)
and its JSON documents, bounded in time and size.

Nothing here follows redirects or accepts a non-JSON answer: a metadata or key-set URL that
answers anything but a JSON object is a fetch failure, never an empty key set.

The issuer is not trusted to be quick or small (issue 57):

- Size: a body is read as a stream and abandoned once past ``MAX_DOCUMENT_BYTES`` (or at once
  when its ``Content-Length`` says it will be), so a 64 MiB key set costs about 1 MiB of memory,
  not 64. httpx2 decompresses in bounded pieces, and the limit counts decompressed bytes.
- Time: httpx's ``timeout`` bounds each phase (connect, each read), not the request: a body
  dripped a byte a second never trips it. Every request here therefore runs under one wall-clock
  deadline for connect, send and the whole body (``fetch_deadline_s`` of ``[http.oauth]``, 5 s by
  default); discovery's candidate URLs share one such deadline between them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx2

from adapters.mcp.oauth.settings import DEFAULT_FETCH_DEADLINE_S, OAuthConfigError, checked_url

FETCH_TIMEOUT_S = 5.0   # httpx's per-phase timeout (connect, each read)
MAX_DOCUMENT_BYTES = 1_048_576


class FetchFailed(Exception):
    """The authorization server did not answer with a usable document (the message names the URL)."""


def deadline_in(seconds: float = DEFAULT_FETCH_DEADLINE_S) -> float:
    """An absolute deadline on anyio's clock, for ``request_json``/``fetch_json``."""
    return anyio.current_time() + seconds


@asynccontextmanager
async def _within(deadline: float, seconds: float, url: str) -> AsyncIterator[None]:
    # fail_after raises TimeoutError only when its own deadline passed: a cancellation from outside
    # (the caller gave up) still propagates as one.
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            yield
    except TimeoutError:
        raise FetchFailed(f"{url}: no complete answer within {seconds:g} s") from None


async def _bounded_body(response: httpx2.Response, url: str) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_DOCUMENT_BYTES:
        raise FetchFailed(f"{url}: document over {MAX_DOCUMENT_BYTES} bytes")  # before reading any of it
    parts: list[bytes] = []
    size = 0
    async for part in response.aiter_bytes():
        size += len(part)
        if size > MAX_DOCUMENT_BYTES:
            raise FetchFailed(f"{url}: document over {MAX_DOCUMENT_BYTES} bytes")
        parts.append(part)
    return b"".join(parts)


async def request_json(http: httpx2.AsyncClient, method: str, url: str, *, deadline_s: float = DEFAULT_FETCH_DEADLINE_S,
                       deadline: float | None = None, **kwargs: Any) -> tuple[int, Any]:
    """(status, parsed JSON body) of one request, within ``deadline`` (an absolute one several
    requests share, ``deadline_s`` long; default: ``deadline_s`` from now) and ``MAX_DOCUMENT_BYTES``.
    The body of an answer other than 200 is not read; its document is None. Raises FetchFailed
    (transport error, deadline, size, not JSON)."""
    async with _within(deadline_in(deadline_s) if deadline is None else deadline, deadline_s, url):
        try:
            async with http.stream(method, url, timeout=FETCH_TIMEOUT_S, follow_redirects=False,
                                   headers={"Accept": "application/json"},
                                   **kwargs) as response:
                if response.status_code != 200:
                    return response.status_code, None
                body = await _bounded_body(response, url)
        except httpx2.HTTPError as exc:
            raise FetchFailed(f"{url}: {type(exc).__name__}") from None
    try:
        return 200, json.loads(body)
    except (ValueError, RecursionError):
        raise FetchFailed(f"{url}: not JSON") from None


async def fetch_json(http: httpx2.AsyncClient, url: str, *, deadline_s: float = DEFAULT_FETCH_DEADLINE_S,
                     deadline: float | None = None) -> dict[str, Any]:
    status, document = await request_json(http, "GET", url, deadline_s=deadline_s, deadline=deadline)
    if status != 200:
        raise FetchFailed(f"{url}: HTTP {status}")
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


async def fetch_issuer_metadata(http: httpx2.AsyncClient, issuer: str, *,
                                deadline_s: float = DEFAULT_FETCH_DEADLINE_S) -> IssuerMetadata:
    """The issuer's metadata; its ``issuer`` must be the configured one exactly (RFC 8414 §3.3,
    so a metadata document cannot redirect the adapter to another issuer's keys). All candidate
    URLs together get one ``deadline_s``."""
    failures = []
    deadline = deadline_in(deadline_s)
    for url in metadata_urls(issuer):
        try:
            document = await fetch_json(http, url, deadline_s=deadline_s, deadline=deadline)
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
