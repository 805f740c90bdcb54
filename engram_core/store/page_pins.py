"""Search pins (SPEC §5 paging): the snapshot a paged search orders, fixed at its first page.

A cursor names its pin; later pages read it back. Pins live in memory, bounded in number (per
scope and in total) and age: a cursor whose pin is gone (expired, evicted, a restart) is
STALE_PAGE, which the contract allows (the client restarts the search). Where several cores
share one store, the store also keeps each pin in the database (``PinShelf``), so a cursor
from one core pages on another.

A pin is derived from memory content: its lexical statistics are the keyed term hashes of the
query's words with their document frequencies (a frequency of 1 names what one record held), and
its binding holds an unkeyed digest of the query. PostgreSQL keeps every row it ever wrote in its
WAL, its archive and any dump, and ``index.key`` outlives every forget, so a pin must never reach
the database readable. Each pin is sealed (AES-256-GCM, ``crypto/sealing.py``) under a random key
of its own that is stored nowhere: it travels only in the pin's reference, which the cursor the
client holds carries (``PinRef``). The row alone opens with nothing an operator keeps, not the
key directory nor a KEK, so a pin's copies in the WAL or a dump are shreds from the moment they
are written. A reference whose key does not open its pin, or that has none, finds no pin
(STALE_PAGE), as an expired one.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from cryptography.exceptions import InvalidTag

from engram_core.contract.scope import Scope
from engram_core.crypto.sealing import seal, unseal
from engram_core.store.port import LexicalStats, SharedPin

PAGE_PIN_TTL_MS = 15 * 60_000
MAX_PINS_PER_SCOPE = 1_024  # one scope's open cursors; its own least recently used go first
# All scopes together (the memory bound); beyond it the largest scope gives one up. A core's
# default: its composition root may pass another (``start_core(page_pin_capacity=...)``).
MAX_PINS = 4_096
PIN_KEY_BYTES = 32  # AES-256: each pin's own key, carried only in its reference
_SEALED_KIND = "page-pin"


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


class PinStore:
    """In-memory pins kept per scope; not durable by design.

    Eviction never crosses scopes in a tenant's favour: a scope beyond ``per_scope`` loses
    its own least recently used pin, and when all scopes together exceed ``capacity`` the
    scope holding the most pins loses its least recently used one. So one tenant's flood of
    searches cannot turn another tenant's open cursor into STALE_PAGE unless that tenant
    holds at least as many pins itself; memory stays bounded by ``capacity``."""

    def __init__(self, *, now_ms: Callable[[], int], ttl_ms: int = PAGE_PIN_TTL_MS,
                 per_scope: int = MAX_PINS_PER_SCOPE, capacity: int = MAX_PINS, shelf: PinShelf | None = None) -> None:
        """``shelf``: a store several cores share, where each pin is also put and looked up when
        this process does not hold it (a cursor from another core)."""
        self._now_ms = now_ms
        self._shelf = shelf
        self._ttl_ms = ttl_ms
        self._per_scope = per_scope
        self._capacity = capacity
        self._scopes: dict[Scope, OrderedDict[str, Pin]] = {}
        self._scope_of: dict[str, Scope] = {}
        self._keys: dict[str, bytes] = {}  # each pin's key: a reference must carry it here too
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._scope_of)

    def put(self, pin: Pin, *, hold: list[SharedPin] | None = None) -> str:
        """Keep ``pin``; its reference (``PinRef``: its id and its key), for the cursor. Where pins
        are shared, the pin is also put on the shelf, sealed under its key, now, or, with ``hold``,
        appended there for the caller to write with its audit row
        (``Store.append_audit(page_pins=...)``) before it answers: no round trip of its own."""
        ref = PinRef(secrets.token_urlsafe(12), secrets.token_bytes(PIN_KEY_BYTES))
        scope = Scope(pin.binding.tenant, pin.binding.workspace)
        if self._shelf is not None:
            shared = SharedPin(ref.pin_id, scope.tenant, scope.workspace, seal_pin(ref, pin), pin.created_ms + self._ttl_ms)
            if hold is not None:
                hold.append(shared)
            else:
                self._shelf.put_page_pin(shared.pin_id, scope, shared.pin, shared.expires_at_ms)
        with self._lock:
            pins = self._scopes.setdefault(scope, OrderedDict())
            pins[ref.pin_id] = pin
            self._scope_of[ref.pin_id] = scope
            self._keys[ref.pin_id] = ref.key
            if len(pins) > self._per_scope:
                self._evict_oldest(scope)
            while len(self._scope_of) > self._capacity:
                self._evict_oldest(max(self._scopes, key=lambda s: len(self._scopes[s])))
        return ref.token()

    def _evict_oldest(self, scope: Scope) -> None:
        pins = self._scopes[scope]
        pin_id, _ = pins.popitem(last=False)
        del self._scope_of[pin_id], self._keys[pin_id]
        if not pins:
            del self._scopes[scope]

    def get(self, token: str) -> Pin | None:
        """The pin ``token`` (``put``'s answer) names, or None: expired, evicted, unknown, or a
        reference whose key is not the pin's (STALE_PAGE for the caller)."""
        ref = PinRef.parse(token)
        if ref is None:
            return None
        with self._lock:
            scope = self._scope_of.get(ref.pin_id)
        if scope is None:
            if self._shelf is None:
                return None
            raw = self._shelf.page_pin(ref.pin_id, self._now_ms())
            return open_pin(ref, raw) if raw is not None else None
        with self._lock:
            if ref.pin_id not in self._scope_of:
                return None
            if not hmac.compare_digest(self._keys[ref.pin_id], ref.key):
                return None  # the same answer as the shelf's, whose pin this key would not open
            pins = self._scopes[scope]
            pin = pins[ref.pin_id]
            if self._now_ms() - pin.created_ms > self._ttl_ms:
                del pins[ref.pin_id], self._scope_of[ref.pin_id], self._keys[ref.pin_id]
                if not pins:
                    del self._scopes[scope]
                return None
            pins.move_to_end(ref.pin_id)
            return pin


@dataclass(frozen=True)
class PinRef:
    """What names a pin to whoever pages it: its id (the shelf's row) and the key it is sealed
    under. Only the cursor carries the key; no table, file or log of ours holds it."""

    pin_id: str
    key: bytes

    def token(self) -> str:
        return f"{self.pin_id}.{base64.urlsafe_b64encode(self.key).decode().rstrip('=')}"

    @classmethod
    def parse(cls, token: str) -> PinRef | None:
        """The reference ``token`` spells, or None (a cursor of the format before pins were sealed
        carries no key: its pin is as good as gone)."""
        pin_id, dot, key = token.partition(".")
        if not dot or not pin_id:
            return None
        try:
            raw = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
        except (binascii.Error, ValueError):
            return None
        return cls(pin_id, raw) if len(raw) == PIN_KEY_BYTES else None


def seal_pin(ref: PinRef, pin: Pin) -> bytes:
    """``pin`` as the shelf stores it: sealed under its own key, bound to its id (a row moved to
    another id does not open)."""
    return seal(ref.key, pin_to_json(pin), kind=_SEALED_KIND, owner=ref.pin_id)


def open_pin(ref: PinRef, sealed: bytes) -> Pin | None:
    """The pin the shelf's row holds, or None where ``ref``'s key does not open it (another key,
    a row changed or moved)."""
    try:
        return pin_from_json(unseal(ref.key, sealed, kind=_SEALED_KIND, owner=ref.pin_id))
    except (InvalidTag, ValueError):
        return None


def pin_to_json(pin: Pin) -> bytes:
    """A pin's plain encoding (identifiers, cursors, keyed term hashes, the query's digest): what
    ``seal_pin`` seals, never stored as it is."""
    doc = asdict(pin)
    if pin.lexical_stats is not None:
        doc["lexical_stats"] = {"docs": pin.lexical_stats.docs, "avg_len": pin.lexical_stats.avg_len,
                                "df": [[t, n] for t, n in sorted(pin.lexical_stats.df.items())],
                                "weights": [[t, w] for t, w in sorted(pin.lexical_stats.weights.items())]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def pin_from_json(raw: bytes) -> Pin:
    doc = json.loads(raw)
    stats = doc.pop("lexical_stats")
    window = doc.pop("window")
    return Pin(binding=Binding(**doc.pop("binding")),
               lexical_stats=(LexicalStats(stats["docs"], stats["avg_len"], {int(t): int(n) for t, n in stats["df"]},
                                           {int(t): float(w) for t, w in stats.get("weights", ())})
                              if stats is not None else None),
               window=tuple(window) if window is not None else None,  # type: ignore[arg-type]
               ordered=[tuple(o) for o in doc.pop("ordered")],  # type: ignore[misc]
               **doc)


class PinShelf(Protocol):
    """Where pins are kept besides this process's memory (a store several cores share)."""

    def put_page_pin(self, pin_id: str, scope: Scope, pin: bytes, expires_at_ms: int) -> None:
        """Keep ``pin`` (sealed: ``seal_pin``) until ``expires_at_ms``."""

    def page_pin(self, pin_id: str, now_ms: int) -> bytes | None: ...
