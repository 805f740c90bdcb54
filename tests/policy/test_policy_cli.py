"""``engram policy test|check|bundle`` (SPEC §9, §14)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tarfile
from pathlib import Path

from engram_core.cli.policy import register

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="engram policy")
    register(parser)
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_policy_test_passes_on_the_bundle_with_coverage_above_floor(capsys):
    assert _run("test", str(POLICIES), "--coverage-floor", "80") == 0
    out = capsys.readouterr().out
    passed, failed = map(int, re.search(r"^(\d+) passed, (\d+) failed$", out, re.MULTILINE).groups())
    assert passed > 0 and failed == 0
    coverage = float(re.search(r"^coverage: ([\d.]+)%", out, re.MULTILINE).group(1))
    assert coverage >= 80.0


def test_policy_test_json_report(capsys):
    assert _run("test", str(POLICIES), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and report["coverage"] >= 80.0
    assert all(not f.endswith("_test.rego") for f in report["files"])


def test_policy_test_fails_on_a_broken_test(tmp_path, capsys):
    bundle = tmp_path / "policies"
    shutil.copytree(POLICIES, bundle)
    test_file = bundle / "engram" / "retention" / "retention_test.rego"
    test_file.write_text(test_file.read_text() + '\ntest_broken if {\n\tretention.decision.action == "never"\n}\n')
    assert _run("test", str(bundle)) == 1
    out = capsys.readouterr().out
    assert "FAIL data.engram.retention_test.test_broken" in out
    assert re.search(r"^\d+ passed, 1 failed$", out, re.MULTILINE)


def test_policy_test_fails_below_coverage_floor(tmp_path, capsys):
    bundle = tmp_path / "policies"
    shutil.copytree(POLICIES, bundle)
    for name in ("capture", "admission", "redaction", "retention"):
        (bundle / "engram" / name / f"{name}_test.rego").unlink()
    assert _run("test", str(bundle), "--coverage-floor", "80") == 1
    assert re.search(r"^\d+ passed, 0 failed$", capsys.readouterr().out, re.MULTILINE)


def test_policy_check_passes_on_the_bundle():
    assert _run("check", str(POLICIES)) == 0


def test_policy_check_reports_a_malformed_decision(tmp_path, capsys):
    bundle = tmp_path / "policies"
    shutil.copytree(POLICIES, bundle)
    (bundle / "engram" / "retention" / "retention_test.rego").unlink()
    (bundle / "engram" / "retention" / "retention.rego").write_text("package engram.retention\n\ndecision := true\n")
    assert _run("check", str(bundle)) == 1
    assert "engram/retention/decision" in capsys.readouterr().out


def test_policy_check_refuses_a_package_outside_the_roots(tmp_path):
    bundle = tmp_path / "policies"
    shutil.copytree(POLICIES, bundle)
    (bundle / "other.rego").write_text("package other\n\nx := 1\n")
    assert _run("check", str(bundle)) == 1


def test_policy_bundle_writes_an_opa_bundle_without_tests(tmp_path):
    out = tmp_path / "bundle.tar.gz"
    assert _run("bundle", str(POLICIES), "--out", str(out)) == 0
    with tarfile.open(out) as tar:
        names = {n.lstrip("/") for n in tar.getnames()}
        manifest = json.load(tar.extractfile("/.manifest"))
    assert {".manifest", "data.json", "engram/authz/authz.rego"} <= names
    assert not any(n.endswith("_test.rego") for n in names)
    assert manifest["roots"] == ["engram"] and manifest["revision"]


def test_policy_bundle_can_include_tests(tmp_path):
    out = tmp_path / "bundle.tar.gz"
    assert _run("bundle", str(POLICIES), "--out", str(out), "--include-tests") == 0
    with tarfile.open(out) as tar:
        assert any(n.endswith("authz_test.rego") for n in tar.getnames())
