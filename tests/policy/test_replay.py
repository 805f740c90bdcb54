"""Replay before deploy, against a real decision log: `engram serve --decision-log` records
what the MCP tools did (the SDK's own client over stdio), then `engram policy replay` tells
what a candidate bundle would have decided differently (issue 30)."""

from __future__ import annotations

import copy
import json
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.mcp_helpers import (
    Core,
    activate,
    binding_for,
    capture_args,
    stdio_client,
    unique,
    value_of,
    write_config,
)
from tests.support.policy_support import (
    MULTI_COMPONENT_RULE,
    add_capture_rule,
    copy_bundle,
    engram,
    serve,
)

PURPOSE = "purpose:engineering-notes"


def _two_components(key: str, text: str) -> dict[str, Any]:
    args = capture_args(key, text)
    payload = args["payload"]
    payload["components"].append({"component_id": "c2", "kind": "context", "text": text + " (context)",
                                  "citation_ids": ["cit1"]})
    return args


async def _work(config: Path, tenant_word: str, multi: int) -> None:
    async with stdio_client(config) as client:
        for i in range(2):
            cap = value_of(await client.call_tool("engram_memory_capture",
                                                  capture_args(unique("cap"), f"{tenant_word} single {i}")))
            adm = value_of(await client.call_tool("engram_memory_request_admission",
                                                  {"candidate_id": cap["candidate_id"], "idempotency_key": unique("adm")}))
            assert adm["outcome"]["status"] == "accepted"
        for i in range(multi):
            value_of(await client.call_tool("engram_memory_capture",
                                            _two_components(unique("cap"), f"{tenant_word} double {i}")))
        found = value_of(await client.call_tool("engram_memory_search", {"query": tenant_word, "purpose_ref": PURPOSE}))
        assert found["records"]
        record_id = found["records"][0]["record"]["record_id"]
        value_of(await client.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": PURPOSE}))


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> dict[str, Path]:
    """A decision log made by a real run of the MCP tools: acme (two captures of two components
    each, refused by the candidate below) and globex."""
    tmp = tmp_path_factory.mktemp("replay")
    log_file = tmp / "decisions.jsonl"
    served = serve(tmp / "data", "--decision-log", f"file:{log_file}", "--metrics", "127.0.0.1:0")
    try:
        core = Core(address=served.address, host_key_path=served.data_dir / "host.key")
        for tenant in ("acme", "globex"):
            activate(core, tenant, "ws-main")
        acme = write_config(tmp / "acme.toml", address=core.address, signing_key=core.host_key_path,
                            binding=binding_for("acme"))
        globex = write_config(tmp / "globex.toml", address=core.address, signing_key=core.host_key_path,
                              binding=binding_for("globex"))
        anyio.run(_work, acme, "saffron", 2)
        anyio.run(_work, globex, "cobalt", 0)
        address = served.opened.split("metrics http://", 1)[1].split("/metrics", 1)[0]
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            metrics = response.read().decode()
    finally:
        assert served.stop() == 0
    (tmp / "metrics.txt").write_text(metrics)
    names = tmp / "tenants.txt"
    names.write_text("acme\nglobex\n")
    return {"log": log_file, "key": tmp / "data" / "decision-log.key", "names": names, "tmp": tmp,
            "metrics": tmp / "metrics.txt"}


def _replay(bundle: Path, logged: dict[str, Path], *extra: str) -> tuple[int, dict[str, Any]]:
    done = engram("policy", "replay", "--bundle", str(bundle), "--log", str(logged["log"]), "--json", *extra)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_log_holds_every_tool_call_masked_and_counted(logged):
    events = [json.loads(line) for line in logged["log"].read_text().splitlines()]
    paths = {e["path"] for e in events}
    assert {"engram/authz/decision", "engram/authz/tools", "engram/capture/decision", "engram/admission/decision",
            "engram/redaction/decision"} <= paths
    text = logged["log"].read_text()
    assert "saffron" not in text and "acme" not in text and "globex" not in text and "agent-alice" not in text
    written = [line for line in logged["metrics"].read_text().splitlines()
               if line.startswith("engram_decision_log_events_total")]
    assert written and float(written[0].split()[-1]) == len(events)


def test_an_unchanged_bundle_changes_nothing(logged):
    code, report = _replay(copy_bundle(logged["tmp"], "same"), logged, "--pseudonym-key", str(logged["key"]),
                           "--fail-on-change")
    assert code == 0 and report["totals"]["changed"] == 0 and report["totals"]["replayed"] > 20
    assert report["skipped"] == {} and report["pseudonyms"]["keys_missing"] == []


def test_a_new_deny_rule_reports_the_refused_captures_their_reason_and_tenant(logged):
    candidate = copy_bundle(logged["tmp"], "multi")
    add_capture_rule(candidate, MULTI_COMPONENT_RULE)
    code, report = _replay(candidate, logged, "--pseudonym-key", str(logged["key"]), "--names", str(logged["names"]),
                           "--fail-on-change")
    assert code == 1
    capture = report["paths"]["engram/capture/decision"]
    assert capture["replayed"] == 6 and capture["changed"] == 2
    assert list(capture["transitions"]) == ["allowed→denied"]
    change = capture["transitions"]["allowed→denied"]
    assert change["count"] == 2 and change["reasons_appeared"] == {"TOO_MANY_COMPONENTS": 2}
    assert change["tenants"] == {"acme": 2} and change["reasons_disappeared"] == {}
    assert all(ex["reasons_after"] == ["TOO_MANY_COMPONENTS"] and ex["audit_id"].startswith("aud_")
               for ex in change["examples"])
    others = {p: v["changed"] for p, v in report["paths"].items() if p != "engram/capture/decision"}
    assert set(others.values()) == {0}
    text = engram("policy", "replay", "--bundle", str(candidate), "--log", str(logged["log"]),
                  "--pseudonym-key", str(logged["key"]), "--names", str(logged["names"])).stdout
    assert "engram/capture/decision: 6 replayed, 2 would change" in text
    assert "reasons appearing: TOO_MANY_COMPONENTS ×2" in text and "tenants: acme ×2" in text
    # The candidate still carries the logged revision: replay says to bump it (issue 60 item 13).
    assert report["candidate_revision"] in report["logged_revisions"]
    assert f"note: the candidate's revision {report['candidate_revision']} is one the log was decided under: " \
           "bump the revision in .manifest" in text


def test_a_rule_naming_a_tenant_is_replayed_faithfully_with_the_key(logged):
    candidate = copy_bundle(logged["tmp"], "globex-closed")
    add_capture_rule(candidate, '''
deny contains lib.reason("TENANT_CLOSED", "This tenant takes no new captures.") if {
	input.context.tenant == "globex"
}
''')
    _, with_key = _replay(candidate, logged, "--pseudonym-key", str(logged["key"]))
    change = with_key["paths"]["engram/capture/decision"]["transitions"]
    assert change["allowed→denied"]["count"] == 2 and change["allowed→denied"]["tenants"] == {"globex": 2}
    _, without = _replay(candidate, logged)  # names stay pseudonyms: the rule cannot match them
    assert without["totals"]["changed"] == 0 and without["pseudonyms"]["keys_missing"]


def test_since_and_paths_select_decisions(logged):
    candidate = copy_bundle(logged["tmp"], "multi-2")
    add_capture_rule(candidate, MULTI_COMPONENT_RULE)
    _, future = _replay(candidate, logged, "--since", "2999-01-01T00:00:00Z")
    assert future["totals"]["replayed"] == 0 and future["skipped"]["outside_window"] > 0
    _, recent = _replay(candidate, logged, "--since", "1h", "--path", "engram/capture/decision")
    assert list(recent["paths"]) == ["engram/capture/decision"] and recent["totals"]["changed"] == 2


def test_replay_reads_opas_upload_format_too(logged, tmp_path):
    events = [json.loads(line) for line in logged["log"].read_text().splitlines()]
    import gzip

    upload = tmp_path / "upload.json.gz"
    upload.write_bytes(gzip.compress(json.dumps(copy.deepcopy(events)).encode()))
    (tmp_path / "torn.jsonl").write_text(logged["log"].read_text() + '{"decision_id": "cut mid-li')
    done = engram("policy", "replay", "--bundle", str(copy_bundle(tmp_path, "same")), "--log", str(upload),
                  "--log", str(tmp_path / "torn.jsonl"), "--json")
    report = json.loads(done.stdout)
    assert report["totals"]["read"] == 2 * len(events) + 1 and report["skipped"] == {"unreadable": 1}
