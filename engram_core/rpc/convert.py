"""Protobuf messages <-> contract JSON values, with exact field presence.

``json_format`` renders int64 as strings and drops unset presence info in ways
the contract does not want, so this walks descriptors directly: a field is in
the dict exactly when it is present in the message (repeated fields when
non-empty), and integers stay integers.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable
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
    """What ``value_to_message`` needs of one message type, read once: descriptor attributes are
    C calls in upb, and a search response reads them thousands of times."""

    by_name: dict[str, tuple[bool, bool, tuple[type, ...] | None]]  # name -> (message-typed, repeated, types)


_SHAPES: dict[Any, _Shape] = {}


def _shape(descriptor: Any) -> _Shape:
    shape = _SHAPES.get(descriptor)
    if shape is None:
        shape = _SHAPES[descriptor] = _Shape(by_name={
            f.name: (f.type == FieldDescriptor.TYPE_MESSAGE, f.is_repeated, _SCALAR_TYPES.get(f.type))
            for f in descriptor.fields})
    return shape


def message_to_value(msg: Message) -> dict[str, Any]:
    """The contract value of ``msg``: a key for each field ``ListFields`` lists (a singular field
    with presence when set, one without when not its zero value, a repeated one when not empty),
    in field-number order as it lists them, and the lists SPEC §5 requires even when empty."""
    descriptor = msg.DESCRIPTOR
    return (_TO_VALUE.get(descriptor) or _to_value(descriptor))(msg)


# Per message type, a function reading its fields by name (generated once, ``_to_value``).
# A search reply holds ~100 messages; ``ListFields`` sorts and boxes each one's fields into
# tuples and the generic walk then looks every field up again, which made converting the reply
# the adapter's largest cost of its own (a broad page at 10k: ~0.18 ms; generated, ~0.155).
# tests/unit/test_convert_fast.py checks the two agree over every output the schemas allow.
_TO_VALUE: dict[Any, Callable[[Message], dict[str, Any]]] = {}
_FLOATING = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})


def _to_value(descriptor: Any) -> Callable[[Message], dict[str, Any]]:
    fields = sorted(descriptor.fields, key=lambda f: f.number)
    if any(f.message_type is not None and f.message_type.GetOptions().map_entry for f in fields):
        fn = _TO_VALUE[descriptor] = _listed  # no contract message has one; converted as always
        return fn
    env: dict[str, Any] = {"_TO_VALUE": _TO_VALUE, "_to_value": _to_value, "copysign": math.copysign}
    body = ["def to_value(m):", "    out = {}"]
    for i, f in enumerate(fields):
        name = f.name
        # A proto identifier, read as an attribute; one that is a Python keyword only by getattr.
        read = f"getattr(m, {name!r})" if keyword.iskeyword(name) else f"m.{name}"
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            env[f"t{i}"] = f.message_type
            sub = f"(_TO_VALUE.get(t{i}) or _to_value(t{i}))"
            if f.is_repeated:
                body += [f"    v = {read}", "    if v:", f"        c = {sub}", f"        out[{name!r}] = [c(x) for x in v]"]
            else:
                body += [f"    if m.HasField({name!r}):", f"        out[{name!r}] = {sub}({read})"]
        elif f.is_repeated:
            body += [f"    v = {read}", "    if v:", f"        out[{name!r}] = list(v)"]
        elif f.has_presence:
            body += [f"    if m.HasField({name!r}):", f"        out[{name!r}] = {read}"]
        else:
            # Without presence a field is listed when its bits are not zero: -0.0 is listed.
            listed = "v or copysign(1.0, v) < 0" if f.type in _FLOATING else "v"
            body += [f"    v = {read}", f"    if {listed}:", f"        out[{name!r}] = v"]
    for f in descriptor.fields:  # after the listed ones, in declaration order, as they always were
        if f.is_repeated and f.name in _ALWAYS_PRESENT_LISTS:
            body += [f"    if {f.name!r} not in out:", f"        out[{f.name!r}] = []"]
    body.append("    return out")
    exec(compile("\n".join(body), f"<message_to_value {descriptor.full_name}>", "exec"), env)  # noqa: S102
    fn = _TO_VALUE[descriptor] = env["to_value"]
    return fn


def _listed(msg: Message) -> dict[str, Any]:
    """The generic walk over ``ListFields`` (what the generated functions must equal)."""
    out: dict[str, Any] = {}
    for field, value in msg.ListFields():
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            out[field.name] = [message_to_value(v) for v in value] if field.is_repeated else message_to_value(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    for field in msg.DESCRIPTOR.fields:
        if field.is_repeated and field.name in _ALWAYS_PRESENT_LISTS and field.name not in out:
            out[field.name] = []
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
