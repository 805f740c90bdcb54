"""`engram serve --metrics HOST:PORT`: after a known workload the scrape, parsed with the
Prometheus text parser, counts exactly the calls made, names no tenant unless asked to, and
reports the core's levels (index size, key slots, open page cursors, audit spool, bundle)."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from engram_core.contract.errors import Code
from tests.support.core_support import Client, activate
from tests.support.ops_support import serve


def scrape(address: str) -> tuple[str, dict[str, list]]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    return text, families


def samples(families: dict[str, list], name: str, family: str | None = None, /, **labels: str) -> list:
    return [s for s in families.get(family or name, []) if s.name == name
            and all(s.labels.get(k) == v for k, v in labels.items())]


def value(families: dict[str, list], name: str, family: str | None = None, /, **labels: str) -> float:
    found = samples(families, name, family, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def test_scrape_counts_exactly_the_calls_made_and_reports_levels(tmp_path: Path, stores) -> None:
    served = serve(stores, tmp_path / "data", "--metrics", "127.0.0.1:0")
    try:
        served.wait_ready()
        assert served.metrics_address, served.opened
        activate(served)
        ana = Client(served)
        made: Counter[tuple[str, str, str]] = Counter({("admin.activate", "OK", "host"): 1})
        records = []
        for i in range(4):
            records.append(ana.remember(f"Decision {i}: the heron index keeps postings per field"))
        made[("memory.capture", "OK", "workspace")] += 4
        made[("memory.request_admission", "OK", "workspace")] += 4
        for _ in range(3):
            page = ana.search("heron postings", limit=1)
            assert "next_page_cursor" in page
        made[("memory.search", "OK", "workspace")] += 3
        ana.get(records[0])
        made[("memory.get", "OK", "workspace")] += 1
        ana.call("forget", {"record_id": records[3], "idempotency_key": "fg-metrics-000001", "reason_ref": "r:x"},
                 grant=True)
        made[("memory.forget", "OK", "workspace")] += 1
        outsider = Client(served, tenant="initech", workspace="nowhere")
        for _ in range(2):
            assert outsider.fails("search", {"query": "heron", "purpose_ref": outsider.purpose_ref}) is Code.UNAUTHORIZED
        made[("memory.search", "UNAUTHORIZED", "workspace")] += 2
        assert ana.fails("get", {"record_id": "nope", "purpose_ref": ana.purpose_ref}) is Code.INVALID_SCHEMA
        made[("memory.get", "INVALID_SCHEMA", "workspace")] += 1
        assert ana.fails("get", {"record_id": records[0], "purpose_ref": ana.purpose_ref}, context=False) \
            is Code.TRUSTED_CONTEXT_UNAVAILABLE
        made[("memory.get", "TRUSTED_CONTEXT_UNAVAILABLE", "unbound")] += 1

        text, fam = scrape(served.metrics_address)
        counted = Counter({(s.labels["operation"], s.labels["code"], s.labels["scope_class"]): int(s.value)
                           for s in samples(fam, "engram_calls_total", "engram_calls")})
        assert counted == made
        for (op, _code, _cls), _n in made.items():
            per_op = sum(n for (o, _, _), n in made.items() if o == op)
            assert value(fam, "engram_call_duration_seconds_count", "engram_call_duration_seconds", operation=op) == per_op
        # Never a tenant or workspace name without the opt-in.
        for name in ("acme", "alpha", "initech", "nowhere", "user:ana"):
            assert name not in text

        revision = value(fam, "last_success_bundle_activation", active_revision="engram-policies-1") and "engram-policies-1"
        # Decisions: every allowed memory call asked authz once; the refused ones were denied.
        allowed = sum(n for (op, code, _), n in made.items() if code == "OK" and op.startswith("memory."))
        assert value(fam, "engram_policy_decisions_total", "engram_policy_decisions", family="authz",
                     revision=revision, outcome="allow") >= allowed
        assert value(fam, "engram_policy_decisions_total", "engram_policy_decisions", family="authz",
                     revision=revision, outcome="deny") == 2
        assert value(fam, "engram_policy_decisions_total", "engram_policy_decisions", family="admission",
                     revision=revision, outcome="accept") == 4
        evals = samples(fam, "engram_policy_decision_duration_seconds_count", "engram_policy_decision_duration_seconds")
        assert evals and all(s.labels["revision"] == revision for s in evals)
        assert value(fam, "bundle_loaded_counter_total", "bundle_loaded_counter", name="engram") == 1
        # Every mutation committed at least once (admission and forget each one transaction).
        assert value(fam, "engram_store_commit_duration_seconds_count", "engram_store_commit_duration_seconds") >= 9
        commits = value(fam, "engram_store_commit_duration_seconds_count", "engram_store_commit_duration_seconds")
        assert value(fam, "engram_store_commit_batch_transactions_sum", "engram_store_commit_batch_transactions") == commits
        assert value(fam, "engram_search_index_rebuild_duration_seconds_count",
                     "engram_search_index_rebuild_duration_seconds") >= 1
        # Levels.
        assert value(fam, "engram_search_index_documents") == 3  # four admitted, one forgotten
        assert value(fam, "engram_keyvault_slots", state="destroyed") >= 1  # the forgotten record's key
        assert value(fam, "engram_keyvault_slots", state="live") >= 3
        assert value(fam, "engram_page_cursors_open") == 3  # each first page with a next page pins
        if stores.is_postgresql:  # no audit spool: a read's row is in the database when it answers
            assert value(fam, "engram_audit_spool_pending_rows") == 0
        else:
            assert value(fam, "engram_audit_spool_pending_rows") >= 1  # reads since the last move
        assert value(fam, "engram_audit_spool_lag_seconds") >= 0
        assert value(fam, "engram_ready") == 1 and value(fam, "engram_policy_active") == 1
        assert value(fam, "engram_store_open") == 1

        served.signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            _, fam = scrape(served.metrics_address)
            if value(fam, "bundle_loaded_counter_total", "bundle_loaded_counter", name="engram") == 2:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("SIGHUP reload not counted")
    finally:
        served.stop()


def test_tenant_labels_only_on_request(tmp_path: Path, stores) -> None:
    served = serve(stores, tmp_path / "data", "--metrics", "127.0.0.1:0", "--metrics-tenant-labels")
    try:
        served.wait_ready()
        activate(served)
        ana = Client(served)
        ana.search("anything at all")
        _, fam = scrape(served.metrics_address)
        assert value(fam, "engram_calls_total", "engram_calls", operation="memory.search", code="OK",
                     scope_class="workspace", tenant="acme", workspace="alpha") == 1
    finally:
        served.stop()


def test_a_failing_audit_device_is_counted(tmp_path: Path, stores) -> None:
    """Two devices: a file and a unix socket whose listener goes away. Calls keep succeeding (the
    file takes every row) and the socket's failures show in engram_audit_device_write_failures_total."""
    import os
    import socket
    import threading

    sock_path = str(tmp_path / "audit.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(4)
    conns: list[socket.socket] = []

    def accept() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                conns.append(conn)
        except OSError:
            return

    threading.Thread(target=accept, daemon=True).start()
    served = serve(stores, tmp_path / "data", "--metrics", "127.0.0.1:0",
                   "--audit-device", f"file:{tmp_path / 'audit.device'}", "--audit-device", f"unix:{sock_path}")
    try:
        served.wait_ready()
        activate(served)
        ana = Client(served)
        ana.search("before the socket goes")
        _, fam = scrape(served.metrics_address)
        assert value(fam, "engram_audit_devices") == 2
        assert value(fam, "engram_audit_device_write_failures_total", "engram_audit_device_write_failures",
                     device=f"unix:{sock_path}") == 0
        # The shipper goes away: no listener (shutdown wakes the blocked accept), no socket file.
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        os.unlink(sock_path)
        for conn in conns:
            conn.close()
        failures = 0.0
        for _ in range(20):
            ana.search("after the socket went")  # still answered: the file device took the row
            _, fam = scrape(served.metrics_address)
            failures = value(fam, "engram_audit_device_write_failures_total", "engram_audit_device_write_failures",
                             device=f"unix:{sock_path}")
            if failures:
                break
        assert failures >= 1
        assert value(fam, "engram_audit_device_write_failures_total", "engram_audit_device_write_failures",
                     device=f"file:{tmp_path / 'audit.device'}") == 0
    finally:
        served.stop()


def test_semantic_embed_latency_is_observed(tmp_path: Path, stores) -> None:
    """The local embedding model is timed at admission (the record) and at a semantic search (the query)."""
    from prometheus_client import generate_latest

    from engram_core.observability.metrics import CoreMetrics

    metrics = CoreMetrics()
    running = stores.start_core(tmp_path / "data", semantic=True, metrics=metrics)
    try:
        activate(running)
        ana = Client(running)
        ana.remember("The heron index keeps postings per field")
        ana.search("heron postings", capability_policy={"minimum_channels": "lexical_and_semantic"})
        fam = {f.name: f.samples for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
        counts = {s.labels["kind"]: s.value for s in fam["engram_semantic_embed_duration_seconds"]
                  if s.name == "engram_semantic_embed_duration_seconds_count"}
        assert sum(counts.values()) >= 2, counts
    finally:
        running.stop()
