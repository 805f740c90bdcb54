"""Applying the decision-log mask (what ``data.engram.log.mask(event)`` answered) to an event.

The operations are OPA's (``system.log.mask``): a JSON pointer string erases that field;
``{"op": "remove", "path"}`` erases too; ``{"op": "upsert", "path", "value"}`` sets it. Engram
adds ``{"op": "pseudonymize", "path"}``: every string at or under the path becomes a keyed
pseudonym (``masked:`` + 16 hex of HMAC-SHA256), the same string always the same pseudonym
under one key, so decisions stay comparable (the same tenant, the same principal) and replay
can restore the names its candidate bundle knows (``replay.py``) while the log never holds
them. Pointers start with ``/input`` or ``/result``; a ``*`` segment stands for every element
of an array or member of an object (OPA has none; ``/result/reasons/*/message``); a pointer
that leads nowhere is ignored, as in OPA. The policy decides what is masked; this module
only carries it out, and refuses (MaskError) anything that is not one of these operations, in
which case the event is not written at all.

The event is never mutated: containers on a masked path are copied, the rest shared.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from engram_core.crypto.secret_files import load_or_create_secret

PSEUDONYM_PREFIX = "masked:"
_DOCUMENTS = ("input", "result")
KEY_FILE = "decision-log.key"


class MaskError(Exception):
    """The mask's answer is not a set of operations this module can apply."""


class Pseudonymizer:
    """Keyed pseudonyms of strings. The key stays with the operator (``DIR/decision-log.key``
    by default); without it a pseudonym cannot be confirmed by guessing the name."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a pseudonym key needs at least 16 bytes")
        self._key = key
        self._cache: dict[str, str] = {}
        self.key_id = hashlib.sha256(b"engram/decision-log-key/v1\x00" + key).hexdigest()[:16]

    def __call__(self, value: str) -> str:
        # The same few names (a tenant, its principals) come back in every event: remembered.
        known = self._cache.get(value)
        if known is None:
            mac = hmac.digest(self._key, value.encode("utf-8", "surrogatepass"), "sha256")
            known = PSEUDONYM_PREFIX + mac[:8].hex()
            if len(self._cache) >= 65536:
                self._cache.clear()
            self._cache[value] = known
        return known

    @classmethod
    def from_file(cls, path: Path, *, create: bool = False) -> Pseudonymizer:
        """Read the key file; with ``create``, make it (32 random bytes, mode 0600) if absent."""
        path = Path(path)
        if create:
            return cls(load_or_create_secret(path))
        return cls(path.read_bytes())


def parse_pointer(pointer: Any) -> list[str]:
    """A mask pointer's segments (``~1`` is ``/``, ``~0`` is ``~``); MaskError if not ours."""
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        raise MaskError(f"not a JSON pointer: {pointer!r}")
    return list(_segments(pointer))


@functools.lru_cache(maxsize=4096)
def _segments(pointer: str) -> tuple[str, ...]:
    segments = tuple(s.replace("~1", "/").replace("~0", "~") for s in pointer[1:].split("/"))
    if segments[0] not in _DOCUMENTS or len(segments) > 64:
        raise MaskError(f"mask pointers start with /input or /result: {pointer!r}")
    return segments


Operations = list[tuple[str, str, list[str], Any]]


_ABSENT = object()  # a field that is not there (or is to be deleted)


class Plan:
    """Parsed operations as a tree of pointer segments, so one walk of the event applies them
    all (a path mask's answer is planned once and applied to every event of its path)."""

    __slots__ = ("children", "ops", "creates", "kinds")

    def __init__(self) -> None:
        self.children: dict[str, Plan] = {}
        self.ops: list[tuple[str, str, Any]] = []  # (kind, pointer, value) at this node
        self.creates = False  # an upsert at or under this node (missing parents are made)
        self.kinds: dict[str, str] = {}  # (the root's) pointer -> kind, for erased/masked

    @classmethod
    def of(cls, operations: Operations) -> Plan:
        root = cls()
        for kind, pointer, segments, value in operations:
            node = root
            for segment in segments:
                if kind == "upsert":
                    node.creates = True
                node = node.children.setdefault(segment, cls())
            if kind == "upsert":
                node.creates = True
            node.ops.append((kind, pointer, value))
            root.kinds[pointer] = kind
        return root

    def apply(self, value: Any, pseudonym: Callable[[str], str], hits: set[str]) -> Any:
        out = value
        if self.children and isinstance(value, dict):
            copy = None
            for segment, child in self.children.items():
                keys = list(value) if segment == "*" else [segment]
                for key in keys:
                    if key in value:
                        new = child.apply(value[key], pseudonym, hits)
                    elif child.creates and segment != "*":
                        new = child.apply(_ABSENT, pseudonym, hits)
                    else:
                        continue
                    if new is not value.get(key, _ABSENT):
                        copy = dict(value) if copy is None else copy
                        if new is _ABSENT:
                            copy.pop(key, None)
                        else:
                            copy[key] = new
            out = copy if copy is not None else value
        elif self.children and isinstance(value, list):
            copy_list = None
            for segment, child in self.children.items():
                indices = range(len(value)) if segment == "*" else (
                    [int(segment)] if segment.isdigit() and int(segment) < len(value) else [])
                for i in indices:
                    new = child.apply(value[i], pseudonym, hits)
                    if new is not value[i]:
                        copy_list = list(value) if copy_list is None else copy_list
                        copy_list[i] = new
            out = [v for v in copy_list if v is not _ABSENT] if copy_list is not None else value
        elif self.children and value is _ABSENT and self.creates:
            out = self.apply({}, pseudonym, hits)
        for kind, pointer, op_value in self.ops:
            if kind == "upsert":
                out = op_value
            elif out is _ABSENT:
                continue
            elif kind == "remove":
                out = _ABSENT
            else:
                out = pseudonymize_all(out, pseudonym)
            hits.add(pointer)
        return out


def parse_operations(ops: Any) -> Plan:
    """The mask's answer checked and planned (MaskError when it is not mask operations)."""
    return Plan.of(_operations(ops))


def _operations(ops: Any) -> Operations:
    if not isinstance(ops, list):  # a Rego set arrives as a JSON array
        raise MaskError("the mask answered something other than a set of operations")
    out = []
    for op in ops:
        if isinstance(op, str):
            out.append(("remove", op, parse_pointer(op), None))
        elif isinstance(op, dict) and op.get("op") in ("remove", "upsert", "pseudonymize"):
            if op["op"] == "upsert" and "value" not in op:
                raise MaskError(f"upsert without a value: {op!r}")
            extra = set(op) - {"op", "path", "value"}
            if extra:
                raise MaskError(f"unknown keys in mask operation: {sorted(extra)}")
            out.append((op["op"], op.get("path"), parse_pointer(op.get("path")), op.get("value")))
        else:
            raise MaskError(f"not a mask operation: {op!r}")
    return out


def pseudonymize_all(value: Any, pseudonym: Callable[[str], str]) -> Any:
    """Every non-empty string in ``value`` (object keys stay) replaced by its pseudonym (an
    empty string names nobody, and policies tell it apart: an incomplete context)."""
    if isinstance(value, str):
        return pseudonym(value) if value else value
    if isinstance(value, list):
        return [pseudonymize_all(v, pseudonym) for v in value]
    if isinstance(value, dict):
        return {k: pseudonymize_all(v, pseudonym) for k, v in value.items()}
    return value


def apply_mask(event: dict[str, Any], ops: Any, pseudonym: Callable[[str], str]) -> dict[str, Any]:
    """The event masked by ``ops``, with OPA's ``erased`` and ``masked`` lists (pointers that
    matched). Raises MaskError for an answer that is not a set of mask operations."""
    return apply_plan(event, parse_operations(ops), pseudonym)


def apply_plan(event: dict[str, Any], plan: Plan, pseudonym: Callable[[str], str]) -> dict[str, Any]:
    """``apply_mask`` with the operations planned beforehand (``parse_operations``)."""
    hits: set[str] = set()
    documents = {doc: event.get(doc, _ABSENT) for doc in _DOCUMENTS if doc in plan.children}
    masked_event = dict(event)
    for doc, value in documents.items():
        new = plan.children[doc].apply(value, pseudonym, hits)
        if new is _ABSENT:
            masked_event.pop(doc, None)
        else:
            masked_event[doc] = new
    erased = sorted(p for p in hits if plan.kinds[p] == "remove")
    masked = sorted(p for p in hits if plan.kinds[p] != "remove")
    if erased:
        masked_event["erased"] = erased
    if masked:
        masked_event["masked"] = masked
    return masked_event


def erase_all(event: dict[str, Any], documents: Iterable[str] = _DOCUMENTS) -> dict[str, Any]:
    """The event without ``input`` and ``result`` (when no mask could be asked, nothing that
    could be content is written)."""
    out = {k: v for k, v in event.items() if k not in documents}
    gone = [f"/{d}" for d in documents if d in event]
    if gone:
        out["erased"] = gone
    return out
