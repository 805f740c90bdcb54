"""Token introspection (RFC 7662) for opaque access tokens.

The adapter authenticates to the endpoint with its own client credentials (client_secret_basic,
RFC 7662 §2.1) and accepts an answer only if it is ``active`` and names this resource in ``aud``
(RFC 8707: a token for another resource is not a token for this one). Answers are reused for at
most ``cache_s`` and never past the token's ``exp``: a token revoked at the issuer stops working
here within ``cache_s``. Only the token's SHA-256 digest is kept as the cache key.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx2

from adapters.mcp.oauth.fetch import FETCH_TIMEOUT_S, MAX_DOCUMENT_BYTES
from adapters.mcp.oauth.settings import IntrospectionClient

_CACHE_ENTRIES = 4096


class IntrospectionUnavailable(Exception):
    """The introspection endpoint did not answer usably: the token cannot be checked now."""


class Introspector:
    def __init__(self, http: httpx2.AsyncClient, *, endpoint: Callable[[], Any], client: IntrospectionClient,
                 cache_s: int, clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._endpoint = endpoint  # async () -> URL (configured, or from the issuer's metadata)
        self._client = client
        self._cache_s = cache_s
        self._clock = clock
        self._answers: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()

    async def introspect(self, token: str) -> dict[str, Any] | None:
        """The active token's claims, or None when the issuer says it is not active."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._answers.get(key)
        if cached is not None and cached[0] > now:
            self._answers.move_to_end(key)
            return cached[1]
        answer = await self._ask(token)
        if self._cache_s > 0:
            exp = answer.get("exp") if answer else None
            until = now + self._cache_s
            if isinstance(exp, int) and not isinstance(exp, bool):
                until = min(until, float(exp))
            self._answers[key] = (until, answer)
            while len(self._answers) > _CACHE_ENTRIES:
                self._answers.popitem(last=False)
        return answer

    async def _ask(self, token: str) -> dict[str, Any] | None:
        url = await self._endpoint()
        try:
            response = await self._http.post(
                url, data={"token": token, "token_type_hint": "access_token"},
                auth=httpx2.BasicAuth(self._client.client_id, self._client.secret),
                headers={"Accept": "application/json"}, timeout=FETCH_TIMEOUT_S, follow_redirects=False)
        except httpx2.HTTPError as exc:
            raise IntrospectionUnavailable(f"{url}: {type(exc).__name__}") from None
        if response.status_code != 200 or len(response.content) > MAX_DOCUMENT_BYTES:
            raise IntrospectionUnavailable(f"{url}: HTTP {response.status_code}")
        try:
            document = json.loads(response.content)
        except ValueError:
            raise IntrospectionUnavailable(f"{url}: not JSON") from None
        if not isinstance(document, dict):
            raise IntrospectionUnavailable(f"{url}: not a JSON object")
        return document if document.get("active") is True else None

