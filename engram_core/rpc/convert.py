"""Protobuf messages <-> contract JSON values, with exact field presence.

``json_format`` renders int64 as strings and drops unset presence info in ways
the contract does not want, so this walks descriptors directly: a field is in
the dict exactly when it is present in the message (repeated fields when
non-empty), and integers stay integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, unknown_fields
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

# Repeated fields the contract requires even when empty (SPEC §5 outputs; in the capture
# input, reconciliation.family_refs: proto3 cannot tell an empty list from an absent one, and
# without it a schema-valid `"reconciliation": {"family_refs": []}` became INVALID_SCHEMA).
_ALWAYS_PRESENT_LISTS = frozenset({"records", "redacted_fields", "family_refs"})


@dataclass(frozen=True)
class _Shape:
    """What conversion needs of one message type, read once: descriptor attributes are C calls
    in upb, and a search response reads them thousands of times."""

    by_field: dict[FieldDescriptor, tuple[str, bool, bool]]  # field -> (name, repeated, message-typed)
    by_name: dict[str, tuple[bool, bool, tuple[type, ...] | None]]  # name -> (message-typed, repeated, types)
    empty_lists: tuple[str, ...]  # _ALWAYS_PRESENT_LISTS this type has


_SHAPES: dict[Any, _Shape] = {}


def _shape(descriptor: Any) -> _Shape:
    shape = _SHAPES.get(descriptor)
    if shape is None:
        fields = descriptor.fields
        nested = {f: f.type == FieldDescriptor.TYPE_MESSAGE for f in fields}
        shape = _SHAPES[descriptor] = _Shape(
            by_field={f: (f.name, f.is_repeated, nested[f]) for f in fields},
            by_name={f.name: (nested[f], f.is_repeated, _SCALAR_TYPES.get(f.type)) for f in fields},
            empty_lists=tuple(f.name for f in fields if f.name in _ALWAYS_PRESENT_LISTS and f.is_repeated),
        )
    return shape


def message_to_value(msg: Message) -> dict[str, Any]:
    shape = _shape(msg.DESCRIPTOR)
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        name, repeated, nested = shape.by_field[field]
        if nested:
            out[name] = [message_to_value(v) for v in value] if repeated else message_to_value(value)
        else:
            out[name] = list(value) if repeated else value
    for name in shape.empty_lists:
        if name not in out:
            out[name] = []
    return out


def has_unknown_fields(msg: Message) -> bool:
    """True if the message (or any nested one) carries fields this contract does not know.

    Closed schemas (SPEC §4): a field the core does not know is an extra
    property, not something to drop silently.
    """
    if len(unknown_fields.UnknownFieldSet(msg)):
        return True
    for field, value in msg.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if field.is_repeated else [value]
            if any(has_unknown_fields(v) for v in items):
                return True
    return False


def value_to_message(value: dict[str, Any], message: Message) -> Message:
    """Fill ``message`` from a contract value (unknown keys are an error).

    ``json_format.ParseDict`` is the reference, but it costs a few milliseconds for a search
    response (ten records). Values whose every key names a field and every leaf has exactly
    the field's Python type are filled directly; anything else (JSON-mapping spellings such
    as int64 strings or camelCase names, nulls, wrong types, out-of-range numbers) is left to
    ``ParseDict``, which accepts or rejects it as before.
    """
    try:
        _fill(message, value)
        return message
    except (_Slow, TypeError, ValueError, OverflowError):
        message.Clear()
    return json_format.ParseDict(value, message, ignore_unknown_fields=False)


def message_of(value: dict[str, Any], message_type: type[Message]) -> Message:
    """A message from a value whose types are already the contract's: a response the services
    built (SPEC §5 outputs), or arguments the closed schema validated. By the message's own
    constructor: upb fills nested messages and repeated fields from dicts and lists in C, about
    four times faster than ``value_to_message`` walks a search page. Only for such values: the
    constructor also takes an int for a bool, a string for a list of strings, or bytes for a
    string, which ``value_to_message`` refuses. Anything it does refuse goes to
    ``value_to_message`` (the same message, or the same error); tests/unit/test_convert_fast.py
    checks the two agree over every value the input and output schemas allow."""
    try:
        return message_type(**value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return value_to_message(value, message_type())


class _Slow(Exception):
    """Not a plain value: let ``json_format`` decide."""


_SCALAR_TYPES: dict[int, tuple[type, ...]] = {
    FieldDescriptor.TYPE_STRING: (str,),
    FieldDescriptor.TYPE_BOOL: (bool,),
    FieldDescriptor.TYPE_DOUBLE: (float, int),
    FieldDescriptor.TYPE_FLOAT: (float, int),
    **{t: (int,) for t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_UINT64,
                           FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SINT32)},
}


def _fill(message: Message, value: Any) -> None:
    if type(value) is not dict:
        raise _Slow
    fields = _shape(message.DESCRIPTOR).by_name
    for name, v in value.items():
        facts = fields.get(name)
        if facts is None:
            raise _Slow
        nested, repeated, allowed = facts
        if nested:
            if repeated:
                if type(v) is not list:
                    raise _Slow
                items = getattr(message, name)
                for item in v:
                    _fill(items.add(), item)
            else:
                sub = getattr(message, name)
                sub.SetInParent()
                _fill(sub, v)
            continue
        if allowed is None:
            raise _Slow
        if repeated:
            if type(v) is not list or any(type(x) not in allowed for x in v):
                raise _Slow
            getattr(message, name).extend(v)
        else:
            if type(v) not in allowed:
                raise _Slow
            setattr(message, name, v)
