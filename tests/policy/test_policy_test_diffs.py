"""``engram policy test`` says what went wrong: expected versus actual decision objects, as a
diff, for failing golden fixtures and Rego tests; ``--run`` selects (issue 30)."""

from __future__ import annotations

import json
import re

from engram_core.policy.bundle import read_bundle
from engram_core.policy.testing import UNDEFINED, run
from tests.support.policy_support import REPO, add_capture_rule, copy_bundle, engram

FIXTURES = REPO / "tests" / "policy" / "fixtures"


def test_an_added_deny_rule_shows_each_failing_golden_test_as_a_diff(tmp_path):
    bundle = copy_bundle(tmp_path)
    add_capture_rule(bundle)  # refuses the captures of more than one component
    done = engram("policy", "test", str(bundle))
    assert done.returncode == 1
    out = done.stdout
    block = out.split("FAIL data.engram.capture_test.test_tenant_config_permits_retain_families_and_requires_confirmation", 1)
    assert len(block) == 2, out
    failure = block[1].split("\nFAIL ", 1)[0]
    assert "expression 1 of 1: capture.decision ==" in failure
    assert "--- expected" in failure and "+++ actual" in failure
    assert '-  "allow": true,' in failure and '+  "allow": false,' in failure
    assert '+      "code": "TOO_MANY_COMPONENTS",' in failure
    passed, failed = map(int, re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE).groups())
    assert failed >= 2 and passed > 0
    assert "(undefined)" not in out


def test_a_golden_fixture_failure_shows_the_decision_diff(tmp_path):
    bundle = copy_bundle(tmp_path)
    add_capture_rule(bundle, '''
deny contains lib.reason("NO_CAPTURES_TODAY", "Captures are closed.") if true
''')
    report = run(read_bundle(bundle), pattern=r"^golden:capture/default_allowed", fixtures=[FIXTURES])
    [result] = report.results
    assert result.kind == "golden" and not result.passed
    assert result.failure.expected["allow"] is True and result.failure.actual["allow"] is False
    assert any(line.startswith("+") and "NO_CAPTURES_TODAY" in line for line in result.failure.diff())


def test_the_failing_expression_of_a_multi_expression_test_is_named(tmp_path):
    bundle = copy_bundle(tmp_path)
    test_file = bundle / "engram" / "lib" / "lib_test.rego"
    test_file.write_text(test_file.read_text() + '''
test_second_expression_fails if {
	lib.reason("X", "y") == {"code": "X", "message": "y"}
	config := {"tenants": {"*": {"retain_allowed": false}}}
	lib.tenant_setting("acme", "retain_allowed") == true with data.engram.config as config
	true
}
''')
    report = run(read_bundle(bundle), pattern="test_second_expression_fails")
    [result] = report.results
    f = result.failure
    assert not result.passed and (f.index, f.count) == (3, 4)
    assert f.expression.startswith('lib.tenant_setting("acme", "retain_allowed") == true')
    assert (f.actual, f.expected) == (False, True)


def test_an_undefined_side_is_shown_as_undefined(tmp_path):
    bundle = copy_bundle(tmp_path)
    test_file = bundle / "engram" / "lib" / "lib_test.rego"
    test_file.write_text(test_file.read_text() + '''
test_undefined_side if {
	lib.no_such_rule == 1
}
''')
    (bundle / "engram" / "lib" / "lib.rego").write_text(
        (bundle / "engram" / "lib" / "lib.rego").read_text() + "\nno_such_rule := 2 if false\n")
    [result] = run(read_bundle(bundle), pattern="test_undefined_side").results
    assert result.failure.actual == UNDEFINED and result.failure.expected == 1
    assert "-1" in result.failure.diff() and f"+{UNDEFINED}" in result.failure.diff()


def test_run_selects_tests_and_json_reports_the_diff(tmp_path):
    bundle = copy_bundle(tmp_path)
    add_capture_rule(bundle)
    done = engram("policy", "test", str(bundle), "--run", "capture_test.test_golden_default_allowed", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert [r["test"] for r in report["results"]] == ["data.engram.capture_test.test_golden_default_allowed"]
    failure = report["results"][0]["failure"]
    assert failure["expected"]["allow"] is True and failure["actual"]["allow"] is False
    assert any("TOO_MANY_COMPONENTS" in line for line in failure["diff"])
    assert report["coverage_enforced"] is False


def test_run_with_a_pattern_that_matches_nothing_fails(tmp_path):
    done = engram("policy", "test", str(copy_bundle(tmp_path)), "--run", "no_test_is_named_like_this")
    assert done.returncode == 1 and "0 passed, 0 failed" in done.stdout


def test_a_test_that_raises_an_error_is_reported_and_the_others_still_run(tmp_path):
    bundle = copy_bundle(tmp_path)
    test_file = bundle / "engram" / "lib" / "lib_test.rego"
    test_file.write_text(test_file.read_text() + '''
_conflict := 1 if true
_conflict := 2 if true

test_conflicting if {
	_conflict == 1
}
''')
    report = run(read_bundle(bundle))
    bad = [r for r in report.results if not r.passed]
    assert [r.name for r in bad] == ["data.engram.lib_test.test_conflicting"]
    assert "conflict" in (bad[0].error or "")
    assert report.passed > 90
