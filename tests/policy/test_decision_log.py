"""Decision logs: OPA-style events of every decision, joined to the audit log by audit id,
masked by the bundle's Rego, written off the call path; drops counted, never an unmasked
line (issue 30). Real core on loopback, real DuckDB, real Rego, real HTTP collector."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from engram_core.app.composition import start_core
from engram_core.policy.decisionlog.config import DecisionLogConfig, from_toml, parse_decision_log
from engram_core.policy.decisionlog.logger import DecisionLogger
from engram_core.policy.decisionlog.mask import MaskError, Pseudonymizer, apply_mask
from engram_core.policy.decisionlog.sinks import FileSink, HttpSink
from engram_core.policy.embedded import EmbeddedPolicyEngine
from engram_core.policy.port import AUTHZ, DECISION_PATHS, Decision
from engram_core.policy.serving import PolicySettings, build_serving_policy
from tests.support.core_support import Client, activate
from tests.support.policy_support import REPO, LogCollector, copy_bundle

SECRET_TEXT = "We chose DuckDB for the ledger because it is embedded and fast."
KEY = Pseudonymizer(b"k" * 32)


# --- the mask operations ---


def test_mask_operations_erase_upsert_pseudonymize_with_wildcards_and_leave_the_event_untouched():
    event = {"path": "p", "input": {"context": {"tenant": "acme", "workspace": ""}, "family_refs": ["f1", "f2"],
                                    "members": [{"principal": "u1"}, {"principal": "u2"}]},
             "result": {"allow": False, "reasons": [{"code": "X", "message": "family f1"}]}}
    original = json.dumps(event, sort_keys=True)
    out = apply_mask(event, ["/result/reasons/*/message", {"op": "pseudonymize", "path": "/input/context"},
                             {"op": "pseudonymize", "path": "/input/family_refs"},
                             {"op": "pseudonymize", "path": "/input/members/*/principal"},
                             {"op": "upsert", "path": "/input/note/x", "value": 1}, "/input/nowhere/at/all"], KEY)
    assert json.dumps(event, sort_keys=True) == original
    assert out["input"]["context"] == {"tenant": KEY("acme"), "workspace": ""}  # empty names nobody
    assert out["input"]["family_refs"] == [KEY("f1"), KEY("f2")]
    assert [m["principal"] for m in out["input"]["members"]] == [KEY("u1"), KEY("u2")]
    assert out["input"]["note"] == {"x": 1} and out["result"]["reasons"] == [{"code": "X"}]
    assert out["erased"] == ["/result/reasons/*/message"]  # the pointer that led nowhere is not listed
    assert "/input/context" in out["masked"] and KEY("acme").startswith("masked:") and KEY("acme") != KEY("acm")


@pytest.mark.parametrize("ops", [5, ["/data/x"], ["input/x"], [{"op": "delete", "path": "/input/x"}],
                                 [{"op": "upsert", "path": "/input/x"}], [{"op": "remove", "path": "/input", "x": 1}]])
def test_anything_but_mask_operations_is_refused(ops):
    with pytest.raises(MaskError):
        apply_mask({"input": {"x": 1}, "result": {}}, ops, KEY)


def test_pseudonyms_are_keyed():
    assert Pseudonymizer(b"a" * 32)("acme") != Pseudonymizer(b"b" * 32)("acme")
    assert Pseudonymizer(b"a" * 32).key_id != Pseudonymizer(b"b" * 32).key_id


# --- a real core with the flag's configuration ---


def _serving(tmp_path: Path, sink: str, bundle: Path | None = None):
    settings = PolicySettings(policies=bundle, decision_log=parse_decision_log(sink))
    return build_serving_policy(settings, tmp_path / "data")


def test_every_decision_of_a_real_workload_is_logged_joined_to_its_audit_row_and_holds_no_names(tmp_path):
    log_file = tmp_path / "logs" / "decisions.jsonl"
    serving = _serving(tmp_path, f"file:{log_file}")
    running = start_core(tmp_path / "data", policy=serving.engine, semantic=False)
    try:
        activate(running)
        client = Client(running)
        record_id = client.remember(SECRET_TEXT)
        client.search("DuckDB ledger")
        client.get(record_id)
        refused = client.fails("capture", {"idempotency_key": "k" * 16, "payload": {}, "evidence": {}})
        with running.core.store.read() as tx:
            audit = tx.audit_rows(None, 0, None)
        revision = running.core.policy.revision()
    finally:
        running.stop()  # closes the engine: the logger flushes
    assert refused.value == "INVALID_SCHEMA"
    text = log_file.read_text()
    events = [json.loads(line) for line in text.splitlines()]
    decided = {(d["decision_id"], row["audit_id"]) for row in audit for d in row["decisions"] if "decision_id" in d}
    logged = {(e["decision_id"], e["audit_id"]) for e in events}
    assert decided and decided <= logged  # every decision the audit log records is in the decision log
    assert serving.logger.written == len(events) and not +serving.logger.dropped
    for e in events:
        assert set(e) >= {"decision_id", "path", "input", "result", "bundles", "timestamp", "labels", "audit_id"}
        assert e["bundles"] == {"engram": {"revision": revision}} and e["path"] in DECISION_PATHS
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", e["timestamp"])
        assert e["labels"]["pseudonym_key"] == serving.logger.labels["pseudonym_key"]
    key = Pseudonymizer((tmp_path / "data" / "decision-log.key").read_bytes())
    tenants = {e["input"]["context"]["tenant"] for e in events if e["input"].get("context", {}).get("tenant")}
    assert key("acme") in tenants
    for name in ("acme", "alpha", "user:ana", "agent-7", "purpose:engineering-notes", "DuckDB", "ledger",
                 "docs/adr/7.md", "doc:adr-7", "The secret scanner"):
        assert name not in text, name
    assert (tmp_path / "data" / "decision-log.key").stat().st_mode & 0o777 == 0o600
    assert log_file.stat().st_mode & 0o777 == 0o600


class _BlockedSink:
    name = "blocked"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lines: list[bytes] = []

    def write(self, lines):
        self.release.wait(30)
        self.lines.extend(lines)

    def tick(self, now):
        pass

    def close(self, deadline):
        return 0


def _decision(i: int) -> Decision:
    return Decision(path=AUTHZ, result={"allow": True, "reasons": [], "obligations": {"confirmation_required": False}},
                    decision_id=f"d-{i}", revision="r", input_digest="sha256:" + "0" * 64, log_mask=[])


def test_a_full_buffer_drops_and_counts_without_blocking_the_caller(caplog):
    sink = _BlockedSink()
    logger = DecisionLogger(sink, pseudonymizer=KEY, buffer_events=5, flush_s=0.01)
    try:
        logger.record(_decision(0), {})  # the logger's thread takes it and blocks in the sink
        deadline = time.monotonic() + 5
        while logger.buffered and time.monotonic() < deadline:
            time.sleep(0.01)
        done = threading.Event()

        def calls() -> None:
            for i in range(1, 21):
                logger.record(_decision(i), {"operation": "engram_memory_search"})
            done.set()

        threading.Thread(target=calls, daemon=True).start()
        assert done.wait(5), "recording a decision waited for the sink"
        assert logger.dropped["buffer_full"] == 15 and logger.buffered == 5
    finally:
        sink.release.set()
        with caplog.at_level("WARNING", logger="engram.event"):
            logger.close()
    assert [json.loads(line)["decision_id"] for line in sink.lines] == [f"d-{i}" for i in range(6)]
    assert any("decision_log_dropped" in r.getMessage() and "buffer_full:15" in r.getMessage() for r in caplog.records)


def test_a_bundle_without_a_mask_logs_nothing_and_counts_it(tmp_path):
    bundle = copy_bundle(tmp_path)
    for f in (bundle / "engram" / "log").iterdir():
        f.unlink()
    (bundle / "engram" / "log").rmdir()
    log_file = tmp_path / "decisions.jsonl"
    serving = _serving(tmp_path, f"file:{log_file}", bundle)
    serving.engine.decide(AUTHZ, {"operation": "engram_memory_search"})
    serving.engine.close()
    assert log_file.read_text() == "" and serving.logger.dropped["mask_missing"] == 1


@pytest.mark.parametrize("mask", ["mask(event) := 5", 'mask(event) := {"/elsewhere"}',
                                  "mask(event) := 1 if true\nmask(event) := 2 if true"],
                         ids=["not-a-set", "bad-pointer", "conflict"])
def test_a_failing_mask_drops_the_event_and_never_the_decision(tmp_path, mask):
    bundle = copy_bundle(tmp_path)
    (bundle / "engram" / "log" / "mask.rego").write_text(f"package engram.log\n\n{mask}\n")
    (bundle / "engram" / "log" / "mask_test.rego").unlink()
    log_file = tmp_path / "decisions.jsonl"
    serving = _serving(tmp_path, f"file:{log_file}", bundle)
    d = serving.engine.decide(AUTHZ, {})
    many = serving.engine.decide_all([(AUTHZ, {}), ("engram/redaction/decision", {})])
    serving.engine.close()
    assert d.result["allow"] is False and [x.path for x in many] == [AUTHZ, "engram/redaction/decision"]
    assert log_file.read_text() == "" and serving.logger.dropped["mask_failed"] == 3


def test_the_file_sink_rotates_and_keeps_max_files(tmp_path):
    sink = FileSink(tmp_path / "d.jsonl", max_bytes=4096, max_files=3)
    for i in range(200):
        sink.write([json.dumps({"n": i, "pad": "x" * 60}).encode()])
    sink.close(0)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["d.jsonl", "d.jsonl.1", "d.jsonl.2"]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    newest = [json.loads(line)["n"] for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    older = [json.loads(line)["n"] for line in (tmp_path / "d.jsonl.1").read_text().splitlines()]
    assert newest[-1] == 199 and older[-1] == newest[0] - 1


def test_a_log_file_that_already_exists_with_a_wider_mode_is_narrowed_to_0600(tmp_path, caplog):
    """Issue 57.6: ``os.open``'s mode applies only to a file it creates, so a log file left 0644
    (by an older version, a copy, a umask) stayed readable by every local user."""
    log_file = tmp_path / "logs" / "decisions.jsonl"
    log_file.parent.mkdir()
    log_file.write_text("")
    log_file.chmod(0o644)
    serving = _serving(tmp_path, f"file:{log_file}")
    running = start_core(tmp_path / "data", policy=serving.engine, semantic=False)
    try:
        activate(running)
        Client(running).remember(SECRET_TEXT)
    finally:
        running.stop()
    assert log_file.stat().st_mode & 0o777 == 0o600
    assert log_file.read_text() and serving.logger.written
    assert "had mode 0644; now 0600" in caplog.text


def test_http_sink_uploads_in_opas_format_retrying_after_failures(tmp_path):
    with LogCollector(fail_first=2) as collector:
        sink = HttpSink(collector.url, upload_size_limit_bytes=2048, min_delay_seconds=0.05, max_delay_seconds=0.2)
        logger = DecisionLogger(sink, pseudonymizer=KEY, flush_s=0.02)
        engine = EmbeddedPolicyEngine(REPO / "policies", log_mask=True)
        engine.reload()
        for i in range(40):
            logger.record(engine.decide(AUTHZ, {"operation": "engram_memory_search", "n": i,
                                                "context": {"tenant": "acme"}}), {"operation": "engram_memory_search",
                                                                                  "context": {"tenant": "acme"}, "n": i})
        deadline = time.monotonic() + 60
        while len(collector.events()) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        logger.close()
        events = collector.events()
    assert [e["input"]["n"] for e in events] == list(range(40))
    assert all(e["input"]["context"]["tenant"] == KEY("acme") for e in events)
    assert collector.refused == 2 and sink.upload_failures == 2 and len(collector.batches) > 1
    assert all(size <= 2048 for size in collector.bodies)


def test_the_toml_section_configures_everything_and_refuses_unknown_keys(tmp_path):
    config = tmp_path / "engram.toml"
    config.write_text('[decision_log]\nurl = "https://collector.example/logs"\nupload_size_limit_bytes = 65536\n'
                      'buffer_size_limit_events = 50\nlabels = { region = "eu-1" }\n')
    parsed = parse_decision_log(str(config))
    assert parsed == DecisionLogConfig(url="https://collector.example/logs", upload_size_limit_bytes=65536,
                                       buffer_size_limit_events=50, labels={"region": "eu-1"})
    config.write_text('[decision_log]\nfile = "/tmp/x"\nmax_bytes = 1\n')
    with pytest.raises(ValueError, match="unknown \\[decision_log\\] keys: max_bytes"):
        from_toml(config)
    with pytest.raises(ValueError, match="exactly one of file or url"):
        DecisionLogConfig()
    with pytest.raises(ValueError):
        parse_decision_log("syslog:local0")


def test_with_an_opa_server_the_mask_is_asked_over_its_query_api(tmp_path):
    from tests.support.opa_rest_server import OpaRestTestServer

    log_file = tmp_path / "decisions.jsonl"
    with OpaRestTestServer(REPO / "policies") as opa:
        settings = PolicySettings(opa_url=opa.url, decision_log=parse_decision_log(f"file:{log_file}"))
        serving = build_serving_policy(settings, tmp_path / "data")
        serving.engine.decide(AUTHZ, {"operation": "engram_memory_search", "context": {"tenant": "acme"}})
        serving.engine.close()
    [event] = [json.loads(line) for line in log_file.read_text().splitlines()]
    key = Pseudonymizer((tmp_path / "data" / "decision-log.key").read_bytes())
    assert event["input"]["context"]["tenant"] == key("acme") and "message" not in json.dumps(event["result"])


def test_an_event_mask_adds_to_the_path_mask(tmp_path):
    bundle = copy_bundle(tmp_path)
    (bundle / "engram" / "log" / "event_mask.rego").write_text('''package engram.log

mask(event) := {"/input/now_ms"} if event.input.operation == "engram_memory_search"
''')
    log_file = tmp_path / "decisions.jsonl"
    serving = _serving(tmp_path, f"file:{log_file}", bundle)
    serving.engine.decide(AUTHZ, {"operation": "engram_memory_search", "now_ms": 5, "context": {"tenant": "acme"}})
    serving.engine.decide(AUTHZ, {"operation": "engram_memory_get", "now_ms": 6, "context": {"tenant": "acme"}})
    serving.engine.close()
    search, get = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert "now_ms" not in search["input"] and "/input/now_ms" in search["erased"] and get["input"]["now_ms"] == 6
    key = Pseudonymizer((tmp_path / "data" / "decision-log.key").read_bytes())
    assert search["input"]["context"]["tenant"] == get["input"]["context"]["tenant"] == key("acme")
