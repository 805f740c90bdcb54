"""Token introspection (RFC 7662) for opaque access tokens.

The adapter authenticates to the endpoint with its own client credentials (client_secret_basic,
RFC 7662 §2.1) and accepts an answer only if it is ``active`` and names this resource in ``aud``
(RFC 8707: a token for another resource is not a token for this one). Answers are reused for at
most ``cache_s`` and never past the token's ``exp``: a token revoked at the issuer stops working
here within ``cache_s``. Only the token's SHA-256 digest is kept as a cache key.

Anyone can send a made-up opaque token, and each would be one authenticated request to the issuer
(issue 57): a flood would have the provider throttle the adapter's client, and then every person
gets 503. So (``IntrospectionBudget``) introspections of tokens the issuer has not already called
active here are limited to ``budget_per_s`` a second on average, in bursts of up to
``BURST_S`` seconds' worth; past that, such a token is not sent to the issuer and the request is
the retriable 503, not a 401: a real person's new token is not declared invalid (a 401 sends
clients into a new sign-in), the client retries after ``Retry-After``. Tokens the issuer called
active (until their ``exp``) are asked about without the budget, so people already signed in keep
working through a flood; an ``inactive`` answer is remembered for ``INACTIVE_CACHE_S``, so a client
repeating a dead token asks once.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx2

from adapters.mcp.oauth.fetch import FetchFailed, request_json
from adapters.mcp.oauth.settings import (
    DEFAULT_FETCH_DEADLINE_S,
    DEFAULT_INTROSPECTION_BUDGET_PER_S,
    IntrospectionClient,
)

_CACHE_ENTRIES = 4096
INACTIVE_CACHE_S = 30.0
BURST_S = 10.0


class IntrospectionUnavailable(Exception):
    """The introspection endpoint did not answer usably: the token cannot be checked now."""


class IntrospectionBudget:
    """A token bucket: ``per_s`` introspections a second on average, at most ``per_s * BURST_S`` at once."""

    def __init__(self, per_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_s = per_s
        self._capacity = max(1.0, per_s * BURST_S)
        self._tokens = self._capacity
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._per_s)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def _remember(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > _CACHE_ENTRIES:
        table.popitem(last=False)


class Introspector:
    def __init__(self, http: httpx2.AsyncClient, *, endpoint: Callable[[], Any], client: IntrospectionClient,
                 cache_s: int, budget: IntrospectionBudget | None = None, deadline_s: float = DEFAULT_FETCH_DEADLINE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._http = http
        self._endpoint = endpoint  # async () -> URL (configured, or from the issuer's metadata)
        self._client = client
        self._cache_s = cache_s
        self._budget = budget or IntrospectionBudget(DEFAULT_INTROSPECTION_BUDGET_PER_S)
        self._deadline_s = deadline_s
        self._clock = clock
        self._answers: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()  # active, until
        self._inactive: OrderedDict[str, float] = OrderedDict()  # digest -> remembered until
        self._known: OrderedDict[str, float] = OrderedDict()     # digest -> exp: asked without the budget
        self.requests = 0  # introspection requests sent, for tests

    async def introspect(self, token: str) -> dict[str, Any] | None:
        """The active token's claims, or None when the issuer says it is not active. Raises
        IntrospectionUnavailable when the issuer cannot be asked (down, or the budget spent)."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._answers.get(key)
        if cached is not None and cached[0] > now:
            self._answers.move_to_end(key)
            return cached[1]
        dead_until = self._inactive.get(key)
        if dead_until is not None and dead_until > now:
            return None
        known_until = self._known.get(key)
        if (known_until is None or known_until <= now) and not self._budget.take():
            raise IntrospectionUnavailable("introspection budget for new tokens spent; not asking the issuer")
        answer = await self._ask(token)
        exp = answer.get("exp") if answer else None
        exp = float(exp) if isinstance(exp, int) and not isinstance(exp, bool) else None
        if answer is None or exp is None or exp <= now:
            # Refused by the verifier anyway (no exp, or passed): nothing to vouch for.
            self._known.pop(key, None)
            self._answers.pop(key, None)
            _remember(self._inactive, key, now + INACTIVE_CACHE_S)
            return answer
        self._inactive.pop(key, None)
        _remember(self._known, key, exp)
        if self._cache_s > 0:
            _remember(self._answers, key, (min(now + self._cache_s, exp), answer))
        return answer

    async def _ask(self, token: str) -> dict[str, Any] | None:
        url = await self._endpoint()
        self.requests += 1
        try:
            status, document = await request_json(
                self._http, "POST", url, data={"token": token, "token_type_hint": "access_token"},
                auth=httpx2.BasicAuth(self._client.client_id, self._client.secret), deadline_s=self._deadline_s)
        except FetchFailed as exc:
            raise IntrospectionUnavailable(str(exc)) from None
        if status != 200:
            raise IntrospectionUnavailable(f"{url}: HTTP {status}")
        if not isinstance(document, dict):
            raise IntrospectionUnavailable(f"{url}: not a JSON object")
        return document if document.get("active") is True else None
