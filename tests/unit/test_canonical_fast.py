"""The canonical-JSON fast path is byte-identical to rfc8785 (and fails where it fails)."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_core.canonical import canonical_json

KEYS = st.one_of(st.text(max_size=8), st.sampled_from(["a", "b", "\U0001f600", "\ue000", "é", "A", "_", "\x00"]))
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.floats(),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x40)),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(KEYS, inner, max_size=5)), max_leaves=30)


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
    {"s": "\x00\x1f\x7f\"\\\u2028"},
    (1, 2), {"t": True, "f": False, "n": None},
])
def test_edges(value: Any) -> None:
    assert _fast(value) == _reference(value)
