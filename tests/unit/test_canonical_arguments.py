"""The core's one-pass validation (``canonical_arguments``) refuses exactly what
``validate_arguments`` refuses, with the same code, class and pointer, and otherwise returns the
arguments' RFC 8785 bytes: valid examples and arbitrarily damaged ones alike."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_core.contract.canonical import canonical_json
from engram_core.contract.errors import EngramError
from engram_core.contract.schema_examples import TOOL_EXAMPLES
from engram_core.contract.schemas import MAX_ARGUMENT_BYTES
from engram_core.contract.validation import canonical_arguments, validate_arguments

EXAMPLES = [(tool, example) for tool, examples in TOOL_EXAMPLES.items() for example in examples]


def _outcome(fn: Any, tool: str, args: Any) -> Any:
    try:
        fn(tool, args)
    except EngramError as exc:
        return ("refused", exc.code, exc.reason_class, exc.pointer)
    return "valid"


@pytest.mark.parametrize(("tool", "example"), EXAMPLES, ids=[f"{t}-{i}" for i, (t, _) in enumerate(EXAMPLES)])
def test_a_valid_call_is_its_canonical_bytes(tool: str, example: dict[str, Any]) -> None:
    body = canonical_arguments(tool, example)
    assert body.data == canonical_json(example)
    assert body.members is not None and set(body.members) == set(example)
    for name, member in body.members.items():
        assert member.data == canonical_json(example[name])
        if isinstance(example[name], dict):  # the payload's members are kept too
            assert member.members is not None and set(member.members) == set(example[name])


DAMAGE = st.one_of(
    st.none(), st.floats(allow_nan=True), st.integers(), st.integers(min_value=2**53, max_value=2**70),
    st.booleans(), st.text(max_size=20), st.sampled_from(["e\u0301", "\ud800", "x" * 70_000, "", "\x00"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.recursive(st.just(1), lambda inner: st.lists(inner, min_size=1, max_size=1), max_leaves=40),
)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _leaves(v, (*path, i))
    return out


def _damaged(example: dict[str, Any], seed: int, damage: Any, rename: bool) -> dict[str, Any]:
    args = copy.deepcopy(example)
    rnd = random.Random(seed)
    path = rnd.choice(_leaves(args)[1:])
    parent = args
    for part in path[:-1]:
        parent = parent[part]
    if rename and isinstance(parent, dict):
        parent[path[-1] + "\u0301"] = parent.pop(path[-1])  # an unknown, non-NFC name
    else:
        parent[path[-1]] = damage
    return args


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EXAMPLES), st.integers(min_value=0, max_value=10**6), DAMAGE, st.booleans())
def test_a_damaged_call_gets_the_same_refusal(example: tuple[str, dict[str, Any]], seed: int, damage: Any,
                                              rename: bool) -> None:
    tool, valid = example
    args = _damaged(valid, seed, damage, rename)
    assert _outcome(canonical_arguments, tool, args) == _outcome(validate_arguments, tool, args)
    if _outcome(validate_arguments, tool, args) == "valid":
        assert canonical_arguments(tool, args).data == canonical_json(args)


def test_the_size_bound_is_the_same_byte_for_byte() -> None:
    """Right at the bound, with escapes and two-byte characters in every text: the canonical
    size and the compact JSON size agree, so an argument object one byte over is too large for
    both, and one at the bound is valid for both."""
    tool, example = next((t, e) for t, e in EXAMPLES if t == "engram_memory_capture")
    base = copy.deepcopy(example)
    template = base["payload"]["components"][0]
    chunk = 'é"\\\n' * 8_000  # 40,000 bytes of text, 64,000 once escaped
    base["payload"]["components"] = [{**template, "component_id": f"part-{i:02d}", "text": chunk} for i in range(16)]
    base["payload"]["primary_component_id"] = "part-00"
    spare = MAX_ARGUMENT_BYTES - len(canonical_json(base))
    assert 0 < spare < 30_000
    outcomes = []
    for extra in (spare - 1, spare, spare + 1):
        args = copy.deepcopy(base)
        args["payload"]["components"][1]["text"] = chunk + "z" * extra
        outcomes.append(_outcome(validate_arguments, tool, args))
        assert _outcome(canonical_arguments, tool, args) == outcomes[-1]
    assert outcomes[:2] == ["valid", "valid"] and outcomes[2][2] == "too_large"


def test_a_request_far_over_the_bound_is_refused_without_walking_all_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-pass walk gives up as soon as the arguments are certainly too large (it counts a
    lower bound of the bytes it wrote), so four million tiny items cost no more nodes than a
    request as large as allowed; the refusal is still the size bound's, as before."""
    from engram_core.contract import validation

    tool, example = next((t, e) for t, e in EXAMPLES if t == "engram_memory_capture")
    args = copy.deepcopy(example)
    args["payload"]["reconciliation"] = {"family_refs": ["f"] * 4_000_000}
    walked: list[int] = []
    walk = validation._checked_walk

    def counted(*a: Any) -> None:
        walked.append(1)
        walk(*a)

    monkeypatch.setattr(validation, "_checked_walk", counted)
    outcome = _outcome(canonical_arguments, tool, args)
    assert outcome == _outcome(validate_arguments, tool, args) and outcome[2] == "too_large"
    assert 0 < len(walked) <= MAX_ARGUMENT_BYTES // 2 + 1


def test_the_explanation_of_a_refusal_sees_lists_cut_where_the_schema_bounds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal's explanation walks the arguments in pure Python; nested lists made it walk the
    product of their lengths (257 components of 257 citation ids: 66k ids, 0.46 s of CPU for a
    460 kB request). Each list is now cut to one item past its schema's maxItems (so it is still
    too long) and a list the schema has no array for (never looked into) to one item; the
    refusal is the same."""
    from engram_core.contract import validation

    tool, example = next((t, e) for t, e in EXAMPLES if t == "engram_memory_capture")
    args = copy.deepcopy(example)
    component = args["payload"]["components"][0]
    args["payload"]["components"] = [{**component, "citation_ids": [f"c{j:03d}" for j in range(257)]}
                                     for _ in range(257)]
    args["evidence"]["unknown"] = [["x"] * 300] * 300
    seen: list[Any] = []
    explainer = validation._EXPLAINERS[tool]

    class Counting:
        def iter_errors(self, instance: Any) -> Any:
            seen.append(instance)
            return explainer.iter_errors(instance)

    monkeypatch.setitem(validation._EXPLAINERS, tool, Counting())
    outcome = _outcome(validate_arguments, tool, args)
    assert outcome[0] == "refused" and outcome[2] == "unknown_field"
    assert outcome == _outcome(canonical_arguments, tool, args)
    [pruned] = seen[:1]
    components = pruned["payload"]["components"]
    assert len(components) == 65 and all(len(c["citation_ids"]) == 257 for c in components)
    assert pruned["evidence"]["unknown"] == [["x"]]
