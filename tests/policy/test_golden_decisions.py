"""Golden decision fixtures: the embedded engine answers each exactly, and the Rego tests mirror them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import DECISION_PATHS

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/*.json"))


@pytest.fixture(scope="module")
def engine():
    engine = EmbeddedPolicyEngine(POLICIES)
    engine.reload()
    yield engine
    engine.close()


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_embedded_engine_answers_golden_fixture_exactly(engine, fixture):
    case = json.loads(fixture.read_text())
    decision = engine.decide(case["path"], case["input"])
    assert decision.result == case["expected"]
    assert decision.revision == json.loads((POLICIES / ".manifest").read_text())["revision"]


def test_every_decision_path_has_a_golden_fixture():
    paths = {json.loads(f.read_text())["path"] for f in FIXTURES}
    assert paths == set(DECISION_PATHS)


@pytest.mark.parametrize("family", sorted({f.parent.name for f in FIXTURES}))
def test_rego_tests_mirror_golden_fixtures(family):
    source = (POLICIES / "engram" / family / f"{family}_test.rego").read_text()
    golden_tests = set(re.findall(r"^test_golden_(\w+) if", source, re.MULTILINE))
    fixtures = {f.stem for f in FIXTURES if f.parent.name == family}
    assert golden_tests == fixtures
