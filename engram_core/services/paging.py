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

Pins are kept by the store (``engram_core/store/page_pins.py``), bounded in number and age; a
cursor whose pin is gone is STALE_PAGE, which the contract allows: the client restarts the search. The cursor itself is opaque: canonical JSON and
an HMAC-SHA256 tag (truncated to 128 bits) under ``DIR/page.key``; it binds the
principal, scope, request digest and profile digest, and carries no content.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from engram_core.contract.canonical import canonical_json
from engram_core.contract.errors import Code, EngramError
from engram_core.store.page_pins import MAX_PINS, PAGE_PIN_TTL_MS, Binding, Pin, PinStore

__all__ = ["MAX_PINS", "PAGE_PIN_TTL_MS", "Binding", "CursorCodec", "Pin", "PinStore"]
_TAG_BYTES = 16


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
