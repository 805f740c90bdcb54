"""Search page cursors and pinned snapshots (SPEC §5 paging).

The first page pins ``system_as_of`` (the scope cursor), ``valid_as_of`` and the
profile, plus what later pages need to order the *same* snapshot the same way:

- ``offline_lexical_v2``/``v3``: the BM25 statistics of the query terms (document count,
  average field lengths, document frequencies) and the best score the page was
  normalized to. Scores are then a pure function of each record's own postings
  (and, in v3, its eligible neighbours'), so a keyset ``(score, valid_t, record_id)``
  pages exactly, whatever is admitted or forgotten in between (forgotten records just
  vanish; in v3 the records beside one lose what it lent, see docs/search.md).
- ``semantic_v2``/``v3``: the fused, ordered candidate list (bounded by the fusion depth),
  because reciprocal ranks depend on the whole list; later pages slice it.

Pins live in memory, bounded in number (per scope and in total) and age. A cursor whose pin is gone
(expired, evicted, server restarted) is STALE_PAGE, which the contract allows:
the client restarts the search. The cursor itself is opaque: canonical JSON and
an HMAC-SHA256 tag (truncated to 128 bits) under ``DIR/page.key``; it binds the
principal, scope, request digest and profile digest, and carries no content.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engram_core.canonical import canonical_json
from engram_core.errors import Code, EngramError
from engram_core.store.port import LexicalStats

PAGE_PIN_TTL_MS = 15 * 60_000
MAX_PINS_PER_SCOPE = 1_024  # one scope's open cursors; its own least recently used go first
MAX_PINS = 4_096  # all scopes together (the memory bound); beyond it the largest scope gives one up
_TAG_BYTES = 16


@dataclass(frozen=True)
class Binding:
    """What a cursor is bound to; any difference on a later page is STALE_PAGE."""

    principal: str
    tenant: str
    workspace: str
    request_digest: str
    profile_digest: str

    def as_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "tenant": self.tenant, "workspace": self.workspace,
                "request_digest": self.request_digest, "profile_digest": self.profile_digest}


@dataclass
class Pin:
    """The snapshot a paged search orders: fixed at the first page."""

    binding: Binding
    system_as_of: int
    valid_as_of: int
    candidate_count: int
    created_ms: int
    lexical_stats: LexicalStats | None = None
    best_bm25: float | None = None
    window: tuple[int, int] | None = None  # the valid-time window the query named (timeq)
    relevance: float = 1.0  # the reported scores' factor (reading.query_relevance), same on every page
    ordered: list[tuple[str, float, int]] = field(default_factory=list)  # semantic: (record_id, score, valid_t)


Scope = tuple[str, str]  # (tenant, workspace)


class PinStore:
    """In-memory pins kept per scope; not durable by design.

    Eviction never crosses scopes in a tenant's favour: a scope beyond ``per_scope`` loses
    its own least recently used pin, and when all scopes together exceed ``capacity`` the
    scope holding the most pins loses its least recently used one. So one tenant's flood of
    searches cannot turn another tenant's open cursor into STALE_PAGE unless that tenant
    holds at least as many pins itself; memory stays bounded by ``capacity``."""

    def __init__(self, *, now_ms: Callable[[], int], ttl_ms: int = PAGE_PIN_TTL_MS,
                 per_scope: int = MAX_PINS_PER_SCOPE, capacity: int = MAX_PINS) -> None:
        self._now_ms = now_ms
        self._ttl_ms = ttl_ms
        self._per_scope = per_scope
        self._capacity = capacity
        self._scopes: dict[Scope, OrderedDict[str, Pin]] = {}
        self._scope_of: dict[str, Scope] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._scope_of)

    def put(self, pin: Pin) -> str:
        pin_id = secrets.token_urlsafe(12)
        scope = (pin.binding.tenant, pin.binding.workspace)
        with self._lock:
            pins = self._scopes.setdefault(scope, OrderedDict())
            pins[pin_id] = pin
            self._scope_of[pin_id] = scope
            if len(pins) > self._per_scope:
                self._evict_oldest(scope)
            while len(self._scope_of) > self._capacity:
                self._evict_oldest(max(self._scopes, key=lambda s: len(self._scopes[s])))
        return pin_id

    def _evict_oldest(self, scope: Scope) -> None:
        pins = self._scopes[scope]
        pin_id, _ = pins.popitem(last=False)
        del self._scope_of[pin_id]
        if not pins:
            del self._scopes[scope]

    def get(self, pin_id: str) -> Pin | None:
        with self._lock:
            scope = self._scope_of.get(pin_id)
            if scope is None:
                return None
            pins = self._scopes[scope]
            pin = pins[pin_id]
            if self._now_ms() - pin.created_ms > self._ttl_ms:
                del pins[pin_id], self._scope_of[pin_id]
                if not pins:
                    del self._scopes[scope]
                return None
            pins.move_to_end(pin_id)
            return pin


class CursorCodec:
    """Seals and opens page cursors: canonical JSON + truncated HMAC-SHA256, base64url."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._key, b"engram/page-cursor/v1\x00" + body, hashlib.sha256).digest()[:_TAG_BYTES]

    def seal(self, body: dict[str, Any]) -> str:
        raw = canonical_json(body)
        return base64.urlsafe_b64encode(raw + self._tag(raw)).decode().rstrip("=")

    def open(self, token: str) -> dict[str, Any]:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            body, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
            if len(raw) <= _TAG_BYTES or not hmac.compare_digest(self._tag(body), tag):
                raise ValueError("tag")
            value = json.loads(body)
            if not isinstance(value, dict):
                raise ValueError("shape")
            return value
        except Exception:
            raise EngramError(Code.STALE_PAGE, "cursor does not verify") from None
