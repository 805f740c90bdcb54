"""The OPA REST backend answers like the embedded one and fails closed (SPEC §9)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.opa_rest import OpaRestPolicyEngine
from engram_core.policy.port import AUTHZ
from tests.support.opa_rest_server import OpaRestTestServer

POLICIES = Path(__file__).resolve().parents[2] / "policies"
REVISION = json.loads((POLICIES / ".manifest").read_text())["revision"]
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/*.json"))


def _unavailable(call) -> None:
    with pytest.raises(EngramError) as caught:
        call()
    assert caught.value.code is Code.POLICY_UNAVAILABLE


@pytest.fixture(scope="module")
def server():
    with OpaRestTestServer(POLICIES) as server:
        yield server


ANSWER_TIMEOUT_S = 10.0


def test_rest_backend_answers_every_golden_fixture_like_embedded(server):
    embedded = EmbeddedPolicyEngine(POLICIES)
    embedded.reload()
    # The answers are what this compares, not how fast the test server gives them: a loaded
    # machine's evaluation may pass the production default (0.5 s); timeouts are tested below.
    rest = OpaRestPolicyEngine(server.url, expected_revision=REVISION, timeout_s=ANSWER_TIMEOUT_S)
    assert rest.active() and rest.revision() == REVISION
    for fixture in FIXTURES:
        case = json.loads(fixture.read_text())
        via_rest = rest.decide(case["path"], case["input"])
        via_embedded = embedded.decide(case["path"], case["input"])
        assert via_rest.result == via_embedded.result == case["expected"], fixture.name
        assert via_rest.revision == via_embedded.revision == REVISION
        assert via_rest.input_digest == via_embedded.input_digest
    rest.close()


def test_rest_backend_asks_several_decisions_like_embedded(server):
    embedded = EmbeddedPolicyEngine(POLICIES)
    embedded.reload()
    rest = OpaRestPolicyEngine(server.url, expected_revision=REVISION, timeout_s=ANSWER_TIMEOUT_S)
    cases = [json.loads(f.read_text()) for f in FIXTURES[:6]]
    requests = [(c["path"], c["input"]) for c in cases]
    assert [d.result for d in rest.decide_all(requests)] == [d.result for d in embedded.decide_all(requests)] \
        == [c["expected"] for c in cases]
    _unavailable(lambda: rest.decide_all([(AUTHZ, {}), ("engram/authz/no_such_rule", {})]))
    rest.close()


def test_rest_backend_uses_server_decision_id(server):
    rest = OpaRestPolicyEngine(server.url)
    assert rest.decide(AUTHZ, {}).decision_id != rest.decide(AUTHZ, {}).decision_id


def test_other_revision_is_not_active(server):
    rest = OpaRestPolicyEngine(server.url, expected_revision="not-this-one")
    assert not rest.active()
    _unavailable(lambda: rest.decide(AUTHZ, {}))


def test_undefined_path_is_policy_unavailable(server):
    _unavailable(lambda: OpaRestPolicyEngine(server.url).decide("engram/authz/no_such_rule", {}))


def test_200_without_result_is_policy_unavailable():
    with OpaRestTestServer(POLICIES, mode="no_result") as server:
        rest = OpaRestPolicyEngine(server.url)
        _unavailable(lambda: rest.decide(AUTHZ, {}))
        assert not rest.active()


def test_server_error_is_policy_unavailable():
    with OpaRestTestServer(POLICIES, mode="error") as server:
        _unavailable(lambda: OpaRestPolicyEngine(server.url).decide(AUTHZ, {}))


def test_server_down_is_policy_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rest = OpaRestPolicyEngine(f"http://127.0.0.1:{port}")
    _unavailable(lambda: rest.decide(AUTHZ, {}))
    assert not rest.active()


def test_slow_server_past_timeout_is_policy_unavailable():
    with OpaRestTestServer(POLICIES, mode="slow", delay_s=0.5) as server:
        rest = OpaRestPolicyEngine(server.url, timeout_s=0.1)
        started = time.monotonic()
        _unavailable(lambda: rest.decide(AUTHZ, {}))
        assert time.monotonic() - started < 0.45
