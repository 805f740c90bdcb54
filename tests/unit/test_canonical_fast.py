"""The canonical-JSON fast path is byte-identical to rfc8785 (and fails where it fails)."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_core.contract.canonical import canonical_json

KEYS = st.one_of(st.text(max_size=8), st.sampled_from(["a", "b", "\U0001f600", "\ue000", "é", "A", "_", "\x00"]))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.floats(),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x40)),
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=5))


VALUES = st.recursive(SCALARS, _containers, max_leaves=30)
# The members of a composed object (below): up to nine at once, so smaller trees each. What a member
# holds is VALUES' part (the differential and the splicing properties); composing is about members.
MEMBER_VALUES = st.recursive(SCALARS, _containers, max_leaves=8)


def _reference(value: Any) -> bytes | type[Exception]:
    try:
        return rfc8785.dumps(value)
    except Exception as exc:  # noqa: BLE001 - the error class is what is compared
        return type(exc)


def _fast(value: Any) -> bytes | type[Exception]:
    try:
        return canonical_json(value)
    except Exception as exc:  # noqa: BLE001
        return type(exc)


@settings(max_examples=600, deadline=None)
@given(VALUES)
def test_fast_path_matches_rfc8785(value: Any) -> None:
    assert _fast(value) == _reference(value)


@pytest.mark.parametrize("value", [
    {"\U0001f600": 1, "\ue000": 2},  # UTF-16 order differs from code point order
    {"k": "\ud800"},  # lone surrogate
    {1: "non-string key"},
    [2**53, -(2**53)], [2**53 - 1, -(2**53) + 1],
    [1.0, 1e21, 1e-7, 123456789012345680000.0, -0.0, 0.1],
    [1e-4, 0.99999e-4, 9.999999999999998e15, 1e16, 0.873456789, 2.0**52 + 0.5, -1.0, 5e-324],  # the repr range's ends
    {"s": "\x00\x1f\x7f\"\\\u2028"},
    (1, 2), {"t": True, "f": False, "n": None},
])
def test_edges(value: Any) -> None:
    assert _fast(value) == _reference(value)


def _spliced(value: Any, depth: int) -> Any:
    """``value`` with its members (``depth`` levels down) replaced by Canonicals of themselves,
    and the whole again: what the request pipeline hands to ``digest`` and ``seal``."""
    from engram_core.contract.canonical import canonical

    if isinstance(value, dict):
        return {k: canonical(v, depth=depth) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v, depth=depth) for v in value]
    return canonical(value, depth=depth)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUES, st.integers(min_value=0, max_value=3))
def test_a_canonical_spliced_anywhere_writes_the_same_bytes(value: Any, depth: int) -> None:
    from engram_core.contract.canonical import canonical

    plain = _fast(value)
    if not isinstance(plain, bytes):
        return  # not canonical JSON at all: nothing to splice
    made = canonical(value, depth=depth)
    assert made.data == plain
    assert canonical_json(_spliced(value, depth)) == plain
    assert canonical_json({"outer": made, "list": [made]}) == canonical_json({"outer": value, "list": [value]})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, MEMBER_VALUES, max_size=6), st.dictionaries(KEYS, MEMBER_VALUES, max_size=3))
def test_an_object_composed_from_members_is_the_object(members: dict[str, Any], changes: dict[str, Any]) -> None:
    from engram_core.contract.canonical import canonical, canonical_object

    merged = {**members, **changes}
    plain = _fast(merged)
    if not isinstance(plain, bytes) or not all(isinstance(_fast(v), bytes) for v in (members, changes)):
        return  # a part that is not canonical JSON (an infinity the change replaced, ...)
    base = canonical(members, depth=1)
    composed = canonical_object({**(base.members or {}), **{k: canonical(v) for k, v in changes.items()}})
    assert composed.data == plain
    assert composed.value == merged
