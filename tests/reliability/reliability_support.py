"""Shared pieces of the reliability suite: soak switch, hostile-value strategies."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st

SOAK = os.environ.get("ENGRAM_SOAK") == "1"


def scaled(ci: int, soak: int) -> int:
    return soak if SOAK else ci


HOSTILE_STRINGS = st.sampled_from([
    "", "\x00", "a\x00b", "Cafe\u0301", "\ud800", "x\udfff", "é" * 300, "x" * 70_000, " ", "\u202e",
    "sha256:" + "A" * 64, "mem_" + "a" * 52, "null", "{}", "\n" * 10,
])
HOSTILE_NUMBERS = st.sampled_from([2**53, -(2**53), 2**53 - 1, -(2**53 - 1), 2**63, -1, 0, 1.5, float("inf"), True, False])
HOSTILE_VALUES = st.one_of(
    HOSTILE_STRINGS, HOSTILE_NUMBERS, st.none(), st.just([]), st.just({}),
    st.just(["x"] * 5000),                          # huge array
    st.recursive(st.just(1), lambda c: st.lists(c, max_size=1), max_leaves=200),
)


def deep(n: int) -> Any:
    v: Any = "x"
    for _ in range(n):
        v = [v]
    return v


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, prefix + (i,))
    return out


def set_at(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    import copy

    root = copy.deepcopy(value)
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return root


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict]) -> dict:
    """A valid request with one hostile change: a replaced value, an extra key, deep nesting."""
    value = draw(base)
    targets = paths(value)
    path = draw(st.sampled_from(targets))
    kind = draw(st.sampled_from(["replace", "extra", "deep"]))
    if kind == "extra":
        node = value
        for p in path:
            node = node[p]
        if isinstance(node, dict):
            return set_at(value, path + ("unexpected_field",), draw(HOSTILE_VALUES))
    if kind == "deep":
        return set_at(value, path, deep(draw(st.integers(20, 120))))
    return set_at(value, path, draw(HOSTILE_VALUES))
