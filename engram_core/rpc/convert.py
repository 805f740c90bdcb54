"""Protobuf messages <-> contract JSON values, with exact field presence.

``json_format`` renders int64 as strings and drops unset presence info in ways
the contract does not want, so this walks descriptors directly: a field is in
the dict exactly when it is present in the message (repeated fields when
non-empty), and integers stay integers.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, unknown_fields
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

# Repeated fields the contract requires even when empty (SPEC §5 outputs; in the capture
# input, reconciliation.family_refs: proto3 cannot tell an empty list from an absent one, and
# without it a schema-valid `"reconciliation": {"family_refs": []}` became INVALID_SCHEMA).
_ALWAYS_PRESENT_LISTS = frozenset({"records", "redacted_fields", "family_refs"})


def message_to_value(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        out[field.name] = _convert(field, value)
    for name in _ALWAYS_PRESENT_LISTS:
        field = msg.DESCRIPTOR.fields_by_name.get(name)
        if field is not None and field.is_repeated and name not in out:
            out[name] = []
    return out


def _convert(field: FieldDescriptor, value: Any) -> Any:
    if field.is_repeated:
        return [_scalar(field, v) for v in value]
    return _scalar(field, value)


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_to_value(value)
    return value


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
    fields = message.DESCRIPTOR.fields_by_name
    for name, v in value.items():
        field = fields.get(name)
        if field is None:
            raise _Slow
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
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
        allowed = _SCALAR_TYPES.get(field.type)
        if allowed is None:
            raise _Slow
        if field.is_repeated:
            if type(v) is not list or any(type(x) not in allowed for x in v):
                raise _Slow
            getattr(message, name).extend(v)
        else:
            if type(v) not in allowed:
                raise _Slow
            setattr(message, name, v)
