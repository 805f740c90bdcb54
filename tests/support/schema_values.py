"""Hypothesis strategies for the values a tool's JSON schema allows (its arguments, its output),
built once per process and cheap to draw.

``hypothesis_jsonschema.from_schema`` builds an object's member strategies again on every draw
(canonicalising, merging and compiling each member's schema: ~0.1-0.2 s per capture, most of a
converter property's time). Here the object and array levels of a schema become plain Hypothesis
strategies once (``fixed_dictionaries``, ``lists``), and every other level (strings with their
patterns and lengths, integers and their bounds, enums, consts, ``anyOf``) is handed to
``from_schema`` as it stands, so what a leaf may be is still hypothesis-jsonschema's reading.
A keyword these levels do not know sends the whole level to ``from_schema`` too: correct, only
slower. One kind of leaf is drawn here: a string whose pattern is anchored at both ends and made
of literals and fixed-count character classes (the digests, instants and record ids), as one
``st.text`` per class: Hypothesis's regex strategy draws such a string character by character
(~17 ms a digest, a capture holds several), the same strings.

Arrays are drawn with at most ``MAX_ITEMS`` items (at least ``minItems``): what these tests check
(conversions, validation, the surfaces' answers) is per item, and four items of every kind say
what sixty-four do; the size bounds themselves are probed by the fuzzing's hostile mutations.
Every value drawn is checked against the schema (``jsonschema``), so this generator cannot drift
from the schemas unnoticed.
"""

from __future__ import annotations

import functools
import json
import re
import re._parser as re_parser
from re import _constants as re_constants
from typing import Any

import jsonschema
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from engram_core.contract.schemas import INPUT_SCHEMAS, OUTPUT_VALUES

MAX_ITEMS = 4
_OBJECT_KEYWORDS = {"type", "properties", "required", "additionalProperties", "description", "examples", "$defs"}
_PATTERN_KEYWORDS = {"type", "pattern", "minLength", "maxLength", "description", "examples"}
_ARRAY_KEYWORDS = {"type", "items", "minItems", "maxItems", "uniqueItems", "description", "examples", "$defs"}
# Members an open object gets besides its properties (hypothesis-jsonschema's own JSON values).
_EXTRA_MEMBERS = 2


def _inlined(schema: Any, defs: dict[str, Any]) -> Any:
    """A copy of ``schema`` with its ``#/$defs/...`` references replaced by what they name: the
    published schemas are never handed to ``from_schema`` (it resolves references in place)."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            ref = schema["$ref"]
            if not ref.startswith("#/$defs/"):
                raise ValueError(f"unsupported $ref {ref!r}")
            merged = {**defs[ref.removeprefix("#/$defs/")], **{k: v for k, v in schema.items() if k != "$ref"}}
            return _inlined(merged, defs)
        return {k: _inlined(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(v, defs) for v in schema]
    return schema


def _class_chars(items: Any) -> str | None:
    """The characters of a regex character class of literals and ranges (else None)."""
    chars: list[str] = []
    for op, arg in items:
        if op is re_constants.LITERAL:
            chars.append(chr(arg))
        elif op is re_constants.RANGE and arg[1] - arg[0] < 256:
            chars.extend(map(chr, range(arg[0], arg[1] + 1)))
        else:
            return None  # a negation, a category (\d, \w), a wide range: left to hypothesis
    return "".join(sorted(set(chars)))


def _pattern_strategy(pattern: str) -> st.SearchStrategy[str] | None:
    """The strings ``pattern`` fully matches if it is ``^...$`` over literals, character classes and
    their fixed-count repeats (else None)."""
    try:
        parsed = list(re_parser.parse(pattern))
    except re.error:
        return None  # hypothesis-jsonschema's to judge (it warns, and draws nothing)
    ends = [(re_constants.AT, re_constants.AT_BEGINNING), (re_constants.AT, re_constants.AT_END)]
    if len(parsed) < 2 or [parsed[0], parsed[-1]] != ends:
        return None
    parts: list[st.SearchStrategy[str]] = []
    for op, arg in parsed[1:-1]:
        low = high = 1
        if op is re_constants.MAX_REPEAT and len(arg[2]) == 1 and arg[1] is not re_constants.MAXREPEAT:
            low, high, (op, arg) = arg[0], arg[1], list(arg[2])[0]
        if op is re_constants.LITERAL:
            chars: str | None = chr(arg)
        elif op is re_constants.IN:
            chars = _class_chars(arg)
        else:
            return None
        if not chars:
            return None
        parts.append(st.text(chars, min_size=low, max_size=high))
    return st.tuples(*parts).map("".join)


def _strategy(schema: dict[str, Any], max_items: int) -> st.SearchStrategy[Any]:
    """``schema`` (references inlined) as a strategy built once."""
    kind = schema.get("type")
    if kind == "string" and "pattern" in schema and set(schema) <= _PATTERN_KEYWORDS:
        strings = _pattern_strategy(schema["pattern"])
        if strings is not None:
            low, high = schema.get("minLength", 0), schema.get("maxLength", float("inf"))
            return strings.filter(lambda s: low <= len(s) <= high)
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    if kind == "object" and set(schema) <= _OBJECT_KEYWORDS and required <= set(properties):
        closed = _strategy_dict({k: v for k, v in properties.items() if k in required}, max_items)
        optional = _strategy_dict({k: v for k, v in properties.items() if k not in required}, max_items)
        members = st.fixed_dictionaries(closed, optional=optional)
        additional = schema.get("additionalProperties", True)
        if additional is False:
            return members
        values = from_schema(additional if isinstance(additional, dict) else True)
        extras = st.dictionaries(st.text().filter(lambda name: name not in properties), values,
                                 max_size=_EXTRA_MEMBERS)
        return st.tuples(members, extras).map(lambda both: {**both[1], **both[0]})
    if kind == "array" and set(schema) <= _ARRAY_KEYWORDS and isinstance(schema.get("items", {}), dict):
        low = schema.get("minItems", 0)
        high = max(low, min(schema.get("maxItems", max_items), max_items))
        unique = schema.get("uniqueItems", False)
        return st.lists(_strategy(schema.get("items", {}), max_items), min_size=low, max_size=high,
                        unique_by=(lambda v: json.dumps(v, sort_keys=True)) if unique else None)
    return from_schema(schema)


def _strategy_dict(properties: dict[str, Any], max_items: int) -> dict[str, st.SearchStrategy[Any]]:
    return {name: _strategy(sub, max_items) for name, sub in properties.items()}


def values_of(schema: dict[str, Any], max_items: int = MAX_ITEMS) -> st.SearchStrategy[Any]:
    """Values ``schema`` allows, each checked against it."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    built = _strategy(_inlined(schema, schema.get("$defs", {})), max_items)

    def checked(value: Any) -> Any:
        errors = list(validator.iter_errors(value))
        assert not errors, f"schema_values drew a value its schema refuses: {errors[0].message}"
        return value

    return built.map(checked)


@functools.cache
def arguments(tool: str) -> st.SearchStrategy[Any]:
    """Arguments ``tool``'s input schema allows."""
    return values_of(INPUT_SCHEMAS[tool])


@functools.cache
def outputs(tool: str) -> st.SearchStrategy[Any]:
    """Output values ``tool``'s output schema allows."""
    return values_of(OUTPUT_VALUES[tool])
