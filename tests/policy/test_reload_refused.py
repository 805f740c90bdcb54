"""Reloads that say why: a refused bundle names the file, line and error, the previous
revision stays active, and the outcome is REFUSED in logs, metrics and the admin command's
answer ("refused; revision R still active"), never "retry later" (issue 30)."""

from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest

from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import RETENTION, BundleRefused
from tests.support.policy_support import copy_bundle, engram, serve

BROKEN = "package engram.retention\n\nimport data.engram.lib\n\ndecision := {\n"


def test_a_syntax_error_is_refused_with_file_line_and_error(tmp_path):
    bundle = copy_bundle(tmp_path, revision="rev-1")
    engine = EmbeddedPolicyEngine(bundle)
    engine.reload()
    (bundle / "engram" / "retention" / "retention.rego").write_text(BROKEN)
    with pytest.raises(BundleRefused) as caught:
        engine.reload()
    problem = caught.value.problem
    assert problem["file"] == "engram/retention/retention.rego" and problem["line"] == 6
    assert problem["error"].startswith("rego_parse_error: unexpected eof token")
    assert caught.value.active_revision == "rev-1" and engine.decide(RETENTION, {}).revision == "rev-1"


def test_invalid_data_and_manifest_are_refused_by_name(tmp_path):
    bundle = copy_bundle(tmp_path, revision="rev-1")
    engine = EmbeddedPolicyEngine(bundle)
    engine.reload()
    data = bundle / "data.json"
    good = data.read_text()
    data.write_text(good.replace('"agent_tools": [', '"agent_tools": [,', 1))
    with pytest.raises(BundleRefused) as caught:
        engine.reload()
    assert caught.value.problem["file"] == "data.json" and caught.value.problem["line"] == 4
    data.write_text(good)
    (bundle / ".manifest").write_text('{"roots": ["engram"]}')
    with pytest.raises(BundleRefused) as caught:
        engine.reload()
    assert caught.value.problem == {"file": ".manifest", "line": 0, "error": "no revision string"}


def _metric(address: str, name: str) -> list[str]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(name)]


def _wait(predicate, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def test_sighup_and_reload_policies_refuse_a_broken_bundle_and_say_so(tmp_path):
    bundle = copy_bundle(tmp_path, revision="rev-1")
    served = serve(tmp_path / "data", "--policies", str(bundle), "--metrics", "127.0.0.1:0")
    try:
        metrics = served.opened.split("metrics http://", 1)[1].split("/metrics", 1)[0]
        assert served.health().policy_revision == "rev-1"
        (bundle / ".manifest").write_text(json.dumps({"revision": "rev-2", "roots": ["engram"]}))
        (bundle / "engram" / "retention" / "retention.rego").write_text(BROKEN)

        served.signal(signal.SIGHUP)
        [event] = _wait(lambda: served.json_events("policy_reload"))
        assert (event["outcome"], event["file"], event["line"]) == ("REFUSED", "engram/retention/retention.rego", 6)
        assert event["active_revision"] == "rev-1" and "rego_parse_error" in event["error"]
        assert event["level"] == "error"

        done = engram("admin", "--core", served.address, "--host-key", str(served.data_dir / "host.key"),
                      "reload-policies")
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.strip().startswith(
            "refused; revision rev-1 still active: engram/retention/retention.rego:6: rego_parse_error: "
            "unexpected eof token")
        assert "retry later" not in done.stdout + done.stderr
        as_json = engram("admin", "--core", served.address, "--host-key", str(served.data_dir / "host.key"),
                         "--json", "reload-policies")
        answer = json.loads(as_json.stdout)
        assert answer["outcome"] == "refused" and answer["revision"] == "rev-1"
        assert answer["problem"]["file"] == "engram/retention/retention.rego"

        failed = _metric(metrics, "bundle_failed_load_counter_total")
        assert any('code="REFUSED"' in line and line.endswith(" 3.0") for line in failed), failed
        health = served.health()
        assert (health.status, health.policy_revision) == ("SERVING", "rev-1")

        (bundle / "engram" / "retention" / "retention.rego").write_text(
            (copy_bundle(tmp_path, "pristine") / "engram" / "retention" / "retention.rego").read_text())
        fixed = engram("admin", "--core", served.address, "--host-key", str(served.data_dir / "host.key"),
                       "reload-policies", check=True)
        assert fixed.stdout.strip() == "policy revision rev-2 (was rev-1)"
    finally:
        served.stop()
