"""Shared pieces of the reliability suite: soak switch, hostile values (as hypothesis
strategies and as a cheap seeded mutator), pools of hypothesis examples."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

SOAK = os.environ.get("ENGRAM_SOAK") == "1"


def scaled(ci: int, soak: int) -> int:
    return soak if SOAK else ci


HOSTILE_STRING_VALUES = [
    "", "\x00", "a\x00b", "Cafe\u0301", "\ud800", "x\udfff", "é" * 300, "x" * 70_000, " ", "\u202e",
    "sha256:" + "A" * 64, "mem_" + "a" * 52, "null", "{}", "\n" * 10,
]
HOSTILE_NUMBER_VALUES = [2**53, -(2**53), 2**53 - 1, -(2**53 - 1), 2**63, -1, 0, 1.5, float("inf"), True, False]
HUGE_ARRAY = ["x"] * 5000
HUGE_BYTES = 2 * 1024 * 1024
HOSTILE_STRINGS = st.sampled_from(HOSTILE_STRING_VALUES)
HOSTILE_NUMBERS = st.sampled_from(HOSTILE_NUMBER_VALUES)
HOSTILE_VALUES = st.one_of(
    HOSTILE_STRINGS, HOSTILE_NUMBERS, st.none(), st.just([]), st.just({}),
    st.just(HUGE_ARRAY),                            # huge array
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


def nodes(value: Any, list_items: int = 8) -> list[tuple[tuple, Any]]:
    """(path, node) for every node, in one pass; of a list longer than ``list_items`` only the
    first ``list_items`` items and the last are visited (mutating item 4,000 of a 5,000-item
    array says nothing item 7 does not)."""
    out: list[tuple[tuple, Any]] = []
    stack: list[tuple[tuple, Any]] = [((), value)]
    while stack:
        path, node = stack.pop()
        out.append((path, node))
        if isinstance(node, dict):
            stack.extend((path + (k,), v) for k, v in node.items())
        elif isinstance(node, list):
            idx = range(len(node)) if len(node) <= list_items + 1 else [*range(list_items), len(node) - 1]
            stack.extend((path + (i,), node[i]) for i in idx)
    return out


def get_at(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def set_at(value: Any, path: tuple, new: Any) -> Any:
    """A copy of ``value`` with ``new`` at ``path``: only the containers on the path are
    copied (the rest is shared, never mutated in place)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = set_at(value[head], rest, new) if rest else new
    return copy


def delete_at(value: Any, path: tuple) -> Any:
    """A copy of ``value`` without the key/item at ``path`` (non-empty path)."""
    parent = path[:-1]
    node = get_at(value, parent)
    copy = dict(node) if isinstance(node, dict) else list(node)
    del copy[path[-1]]
    return set_at(value, parent, copy)


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


# ---- pools of hypothesis examples, and cheap seeded mutations of them ----------------------------


def draw_pool(strategy: st.SearchStrategy[Any], n: int, seed_value: int) -> list[Any]:
    """``n`` examples of ``strategy`` drawn by hypothesis' own engine (generate phase only),
    reproducible from ``seed_value``."""
    out: list[Any] = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @seed(seed_value)
    @given(strategy)
    def collect(example: Any) -> None:
        out.append(example)

    collect()
    return out


def _hostile_value(rng: random.Random) -> Any:
    """The repertoire of HOSTILE_VALUES, drawn with ``random``."""
    roll = rng.random()
    if roll < 0.45:
        return rng.choice(HOSTILE_STRING_VALUES)
    if roll < 0.80:
        return rng.choice(HOSTILE_NUMBER_VALUES)
    if roll < 0.88:
        return rng.choice([None, [], {}, HUGE_ARRAY])
    nested: Any = 1
    for _ in range(rng.randint(1, 200)):
        nested = [nested] if rng.random() < 0.5 else [nested, 1]
    return nested


def _wrong_type(rng: random.Random, node: Any) -> Any:
    """A value of another JSON type than ``node``."""
    if isinstance(node, bool):
        options: list[Any] = [0, "true", None, [True]]
    elif isinstance(node, int):
        options = [str(node), float(node), bool(node % 2), [node], {"value": node}, None]
    elif isinstance(node, str):
        options = [len(node), True, [node], {"value": node}, None, 1.0]
    elif isinstance(node, list):
        options = [{str(i): v for i, v in enumerate(node)}, "[]", len(node), None]
    elif isinstance(node, dict):
        options = [list(node.values()), "{}", 1, None, True]
    else:
        options = ["", 0, [], {}]
    return rng.choice(options)


def _corrupt_string(rng: random.Random, text: str) -> str:
    """A hostile edit of an existing string: NUL, lone surrogate, non-NFC, oversize, empty, bidi."""
    at = rng.randint(0, len(text))
    return rng.choice([
        lambda: text[:at] + "\x00" + text[at:],
        lambda: text[:at] + "\ud800" + text[at:],
        lambda: text + "\udfff",
        lambda: text + "e\u0301",                    # decomposed é: not NFC
        lambda: "A\u030a" + text,                    # decomposed Å
        lambda: text + "x" * 70_000,                 # over every byte bound
        lambda: text * (65_537 // max(1, len(text.encode("utf-8", "surrogatepass"))) + 1),
        lambda: "",
        lambda: text[: max(0, at - 1)],              # shortened (under minimum byte lengths)
        lambda: "\u202e" + text,
        lambda: text + "\n",                         # a pattern's $ must not accept a newline
        lambda: text.upper(),
    ])()


def _edge_number(rng: random.Random) -> Any:
    return rng.choice([2**53, -(2**53), 2**53 - 1, -(2**53 - 1), 2**53 + 1, 2**63, 2**63 - 1, -(2**63), 2**64,
                       -1, 0, 1, 49, 51, 4095, 1_048_577, 1.5, 1.0, -0.0, float("inf"), float("-inf"),
                       float("nan"), True, False])


MUTATION_KINDS = ("replace", "extra", "deep", "drop", "wrong_type", "string", "number", "huge_array")


def mutate(rng: random.Random, value: Any, value_nodes: list[tuple[tuple, Any]] | None = None) -> tuple[str, Any]:
    """One hostile change to ``value`` (never modified in place): the repertoire of ``mutated``
    (replace with a hostile value, extra key, deep nesting) plus dropped keys, wrong types, edits
    of existing strings and numbers, and huge arrays. Returns (kind, new value)."""
    targets = value_nodes if value_nodes is not None else nodes(value)
    kind = rng.choice(MUTATION_KINDS)
    path, node = rng.choice(targets)

    def pick(accept: Callable[[tuple, Any], bool]) -> tuple[tuple, Any] | None:
        matching = [(p, n) for p, n in targets if accept(p, n)]
        return rng.choice(matching) if matching else None

    if kind == "extra":
        found = pick(lambda p, n: isinstance(n, dict))
        if found is None:
            return kind, {"unexpected_field": _hostile_value(rng)}
        name = rng.choice(["unexpected_field", "__proto__", "", "purpose_ref ", "\x00", "schema_version"])
        if name in found[1]:
            name = "unexpected_field"
        return kind, set_at(value, found[0] + (name,), _hostile_value(rng))
    if kind == "drop":
        found = pick(lambda p, n: bool(p))
        return kind, (delete_at(value, found[0]) if found else {})
    if kind == "deep":
        return kind, set_at(value, path, deep(rng.randint(20, 120)))
    if kind == "wrong_type":
        return kind, set_at(value, path, _wrong_type(rng, node))
    if kind == "string" and (found := pick(lambda p, n: isinstance(n, str))):
        return kind, set_at(value, found[0], _corrupt_string(rng, found[1]))
    if kind == "number" and (found := pick(lambda p, n: isinstance(n, int | float))):
        return kind, set_at(value, found[0], _edge_number(rng))
    if kind == "huge_array" and (found := pick(lambda p, n: isinstance(n, list) and 0 < len(n) <= 300)):
        items, count = found[1], rng.choice([257, 300, 5000])
        # past every item bound, and past the 1 MiB argument bound at most twice (not 30 MB of 'x')
        if len(json.dumps(items, default=repr)) * count // len(items) <= HUGE_BYTES:
            return kind, set_at(value, found[0], [items[i % len(items)] for i in range(count)])
        return kind, set_at(value, found[0], HUGE_ARRAY)
    return "replace", set_at(value, path, _hostile_value(rng))


def derive_cases(pool: dict[str, list[Any]], rng: random.Random,
                 fresh: Callable[[str, Any, int], Any] | None = None) -> Iterator[tuple[str, Any, str]]:
    """Endless (tool, arguments, origin) cases: every pool example once as drawn, then pool
    examples with 1–3 cheap hostile mutations (origin: the mutation kinds joined by "+"); one
    case in five is a pool example as drawn again (origin "drawn"), passed through ``fresh`` so
    a valid request can make a new effect instead of replaying."""
    tools = sorted(pool)
    index = [(tool, i) for tool in tools for i in range(len(pool[tool]))]
    rng.shuffle(index)
    for tool, i in index:
        yield tool, pool[tool][i], "drawn"
    cached: dict[tuple[str, int], list[tuple[tuple, Any]]] = {}
    n = 0
    while True:
        n += 1
        tool = rng.choice(tools)
        i = rng.randrange(len(pool[tool]))
        value = pool[tool][i]
        if rng.random() < 0.2:
            yield tool, (fresh(tool, value, n) if fresh else value), "drawn"
            continue
        kinds: list[str] = []
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            if kinds:
                value_nodes = nodes(value)
            else:
                if (tool, i) not in cached:
                    cached[(tool, i)] = nodes(value)
                value_nodes = cached[(tool, i)]
            kind, value = mutate(rng, value, value_nodes)
            kinds.append(kind)
        yield tool, value, "+".join(kinds)
