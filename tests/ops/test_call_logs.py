"""`engram serve --log-format json`: one JSON line per call with who, what, outcome, reasons and
duration; operational events as lines of their own; never the memory text or the query."""

from __future__ import annotations

import secrets
import signal
import time
from pathlib import Path

import grpc
import pytest

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.cli.channel import admin_metadata
from engram_core.contract.errors import Code
from tests.support.core_support import Client, activate, now_ms
from tests.support.ops_support import serve

# Distinctive words that must never reach a log line.
SECRET_TEXT = "Quokkas guard the lighthouse ledger with zebrawood keys 7731"
QUERY = "zebrawood lighthouse quokkas"


def _calls(lines: list[dict]) -> list[dict]:
    return [line for line in lines if line.get("event") == "call"]


def _wait_for(served, predicate, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = served.json_lines()
        if predicate(lines):
            return lines
        time.sleep(0.1)
    raise AssertionError(f"log never matched: {served.log_text()[-3000:]}")


@pytest.fixture
def served(tmp_path: Path, stores):
    if stores.is_postgresql:  # an empty database: the open migrates it (its `migration` event is tested)
        stores.empty_database(tmp_path / "data")
    s = serve(stores, tmp_path / "data", "--log-format", "json")
    s.wait_ready()
    yield s
    s.stop()


def test_every_call_is_one_json_line_with_scope_outcome_reasons_and_no_content(served) -> None:
    activate(served)
    ana = Client(served)
    audit_id = "aud_" + secrets.token_hex(12)
    cap = ana.call("capture", _capture_args(), context=ana.context("capture", audit_id=audit_id))
    adm = ana.admit(cap["candidate_id"])
    record_id = adm["outcome"]["record_id"]
    found = ana.search(QUERY)
    assert found["records"], "the record is searchable"
    ana.get(record_id)
    # Refusals: a scope never activated (policy denies), and bad input.
    outsider = Client(served, tenant="initech", workspace="nowhere")
    assert outsider.fails("search", {"query": QUERY, "purpose_ref": outsider.purpose_ref}) is Code.UNAUTHORIZED
    assert ana.fails("get", {"record_id": "not-an-id", "purpose_ref": ana.purpose_ref}) is Code.INVALID_SCHEMA
    # No context at all: refused before anyone is known.
    assert ana.fails("search", {"query": QUERY, "purpose_ref": ana.purpose_ref}, context=False) \
        is Code.TRUSTED_CONTEXT_UNAVAILABLE

    lines = _wait_for(served, lambda ls: len(_calls(ls)) >= 8)
    calls = _calls(lines)
    ops = [c["operation"] for c in calls]
    assert ops == ["admin.activate", "memory.capture", "memory.request_admission", "memory.search",
                   "memory.get", "memory.search", "memory.get", "memory.search"], ops

    for c in calls:
        assert set(c) >= {"ts", "level", "logger", "operation", "tenant", "workspace", "principal", "agent_id",
                          "audit_id", "outcome", "reasons", "decisions", "policy_revision", "duration_ms"}, c
        assert c["logger"] == "engram.call"
        assert c["duration_ms"] > 0

    activate_line, capture, admission, search, get, refused, bad, anonymous = calls
    assert activate_line["principal"] == "host:operator" and activate_line["outcome"] == "OK"
    assert capture["audit_id"] == audit_id
    for ok in (capture, admission, search, get):
        assert (ok["tenant"], ok["workspace"], ok["principal"], ok["agent_id"]) == ("acme", "alpha", "user:ana", "agent-7")
        assert ok["outcome"] == "OK"
        assert ok["audit_id"].startswith("aud_")
        assert any(d.startswith("authz:allow") for d in ok["decisions"]), ok
        assert ok["policy_revision"]
    assert search["audit_id"] != capture["audit_id"]
    assert "admission:" in " ".join(admission["decisions"])
    assert (refused["tenant"], refused["workspace"], refused["outcome"]) == ("initech", "nowhere", "UNAUTHORIZED")
    assert "authz:deny" in refused["decisions"]
    assert refused["reasons"], "a policy refusal names its reason codes"
    assert refused["level"] == "info"  # the caller's own refusal, not the operator's problem
    assert bad["outcome"] == "INVALID_SCHEMA"
    assert anonymous["outcome"] == "TRUSTED_CONTEXT_UNAVAILABLE" and anonymous["tenant"] == ""

    text = served.log_text()
    for needle in (SECRET_TEXT, "zebrawood", "Quokkas", "lighthouse", QUERY, "adr-7-secret-locator"):
        assert needle not in text, f"{needle!r} leaked into the log"


def test_operational_events_are_logged_as_events(served) -> None:
    served.signal(signal.SIGHUP)  # policy reload
    with grpc.insecure_channel(served.address) as ch:  # a fresh signed context per call (single use)
        admin_pb2_grpc.AdminServiceStub(ch).RotateKeys(admin_pb2.ScopeRequest(),
                                                       metadata=admin_metadata(str(served.host_key_path)), timeout=30)
        admin_pb2_grpc.AdminServiceStub(ch).Migrate(admin_pb2.ScopeRequest(),
                                                    metadata=admin_metadata(str(served.host_key_path)), timeout=30)
    lines = _wait_for(served, lambda ls: {"policy_reload", "key_rotation", "migration"}
                      <= {line.get("event") for line in ls if line.get("event") != "call"}
                      and sum(1 for line in ls if line.get("event") == "migration") >= 2)
    events = {line["event"]: line for line in lines if line.get("logger") == "engram.event"}
    assert events["started"]["tls"] == "off"
    assert events["started"]["policy_revision"] == events["policy_reload"]["revision"]
    assert events["policy_reload"]["outcome"] == "OK"
    assert events["key_rotation"]["principal"] == "host:operator"
    assert isinstance(events["key_rotation"]["active_kek"], int)
    migrations = [line for line in lines if line.get("event") == "migration"]
    assert migrations[0]["trigger"] == "open" and migrations[-1]["applied"] == []
    served.stop()
    after = {line.get("event") for line in served.json_lines()}
    assert {"draining", "stopped"} <= after


def test_text_format_is_the_default_and_names_scope_and_outcome(tmp_path: Path, stores) -> None:
    s = serve(stores, tmp_path / "data")
    try:
        s.wait_ready()
        outsider = Client(s, tenant="initech", workspace="nowhere")
        outsider.fails("search", {"query": QUERY, "purpose_ref": outsider.purpose_ref})
        deadline = time.monotonic() + 20
        while "engram.call memory.search" not in s.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        s.stop()
    line = next(line for line in s.log_text().splitlines() if "engram.call memory.search" in line)
    assert "initech/nowhere" in line and "outcome=UNAUTHORIZED" in line and "principal=user:ana" in line
    assert QUERY not in s.log_text()


def _capture_args() -> dict:
    from tests.support.core_support import capture_args

    args = capture_args(SECRET_TEXT, t=now_ms() - 60_000)
    args["payload"]["citations"][0]["locator"]["value"] = "adr-7-secret-locator"
    return args
