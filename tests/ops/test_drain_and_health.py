"""Lifecycle: SIGTERM under load drains within the deadline, loses no acknowledged call and
closes the store cleanly (the next start replays no audit spool); readiness and liveness are
separate gRPC health services; start-up says what it opened.

One `engram serve` per engine over a fresh store (``fresh_served``) serves two tests: what it
printed at start is the start-up test's, and the drain test then loads it and SIGTERMs it (the
start-up test only reads the line it printed, so the order of the two does not matter)."""

from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram_core.api import admin_pb2, admin_pb2_grpc
from engram_core.cli.channel import admin_metadata
from engram_core.rpc.server import LIVENESS_SERVICE
from engram_core.store.audit_spool import SPOOL_NAME
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, Failed, activate, capture_args
from tests.support.ops_support import Served, serve

WORKERS = 6
DRAIN_S = 20.0


@pytest.fixture(scope="module")
def fresh_served(module_stores: EngineStores, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`engram serve --drain-seconds 20` over a fresh store, ready (see the module's docstring)."""
    served = serve(module_stores, tmp_path_factory.mktemp("served") / "data", "--drain-seconds", str(DRAIN_S))
    try:
        served.wait_ready()
        yield served
    finally:
        served.stop()


def test_sigterm_under_load_loses_no_acknowledged_call_and_needs_no_replay(fresh_served: Served,
                                                                           module_stores: EngineStores) -> None:
    served, stores = fresh_served, module_stores
    data = served.data_dir
    assert served.proc.poll() is None, "the fresh core is gone before the drain test"
    activate(served)
    acked_captures: list[tuple[dict, str]] = []  # (arguments, candidate id)
    acked_reads: list[str] = []  # audit ids of acknowledged searches
    lock = threading.Lock()
    go = threading.Event()

    def worker(n: int) -> None:
        client = Client(served, principal=f"user:w{n}")
        go.wait()
        i = 0
        while True:
            i += 1
            try:
                if i % 3:
                    args = capture_args(f"Worker {n} note {i}: drain keeps acknowledged work")
                    out = client.call("capture", args, timeout=30)
                    with lock:
                        acked_captures.append((args, out["candidate_id"]))
                else:
                    audit_id = "aud_" + secrets.token_hex(12)
                    client.call("search", {"query": "drain acknowledged", "purpose_ref": client.purpose_ref},
                                context=client.context("search", audit_id=audit_id), timeout=30)
                    with lock:
                        acked_reads.append(audit_id)
            except Failed:
                return  # draining or gone: nothing after this was acknowledged

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(WORKERS)]
    for t in threads:
        t.start()
    go.set()
    deadline = time.monotonic() + 60
    while len(acked_captures) < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    sent_at = time.monotonic()
    served.signal(signal.SIGTERM)
    served.proc.wait(timeout=DRAIN_S + 30)
    stopped_in = time.monotonic() - sent_at
    for t in threads:
        t.join(timeout=60)
    assert served.proc.returncode == 0
    assert stopped_in < DRAIN_S + 10, stopped_in
    assert len(acked_captures) >= 30 and acked_reads
    if not stores.is_postgresql:  # PostgreSQL's store has no audit spool and no file of its own
        # Closed cleanly: no audit rows left to replay, DuckDB's WAL checkpointed away.
        assert (data / SPOOL_NAME).stat().st_size == 0
        wal = data / "engram.duckdb.wal"
        assert not wal.exists() or wal.stat().st_size == 0

    again = serve(stores, data, log_name="restart.log")
    try:
        assert "audit_spool_replayed_rows 0" in again.opened
        again.wait_ready()
        # Every acknowledged capture is there: its retry with the same key answers the same candidate
        # (a lost one would be captured anew under a fresh random id).
        for n in range(WORKERS):
            client = Client(again, principal=f"user:w{n}")
            for args, candidate_id in [(a, c) for a, c in acked_captures if f"Worker {n} " in json.dumps(a)]:
                replay = client.call("capture", args)
                assert replay["candidate_id"] == candidate_id, replay
        # Every acknowledged read has its audit row.
        with grpc.insecure_channel(again.address) as ch:
            exported = admin_pb2_grpc.AdminServiceStub(ch).Export(
                admin_pb2.ExportRequest(tenant="acme", workspace="alpha", what="audit"),
                metadata=admin_metadata(str(again.host_key_path)), timeout=60)
        audited = {row["audit_id"] for row in json.loads(exported.json)["items"]}
        missing = [a for a in acked_reads if a not in audited]
        assert not missing, f"{len(missing)} acknowledged reads have no audit row"
    finally:
        assert again.stop() == 0
    events = [json.loads(line) for line in (data.parent / "restart.log").read_text().splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("event") == "audit_spool_replayed"]


def test_start_up_prints_what_it_opened(fresh_served: Served) -> None:
    """What the fresh core printed when it started (it became ready: ``fresh_served``)."""
    served = fresh_served
    opened = served.opened
    for part in ("store ", "schema_version ", "records 0", "scopes 0", "policy_revision engram-policies-",
                 f"listen {served.address}", "tls off", "metrics off", "tracing off", "audit_spool_replayed_rows 0"):
        assert part in opened, (part, opened)


def _health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def _until(address: str, service: str, status: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while _health(address, service) != status:
        assert time.monotonic() < deadline, f"{service!r} never became {status}"
        time.sleep(0.05)


def test_readiness_waits_for_the_search_index_while_liveness_serves(tmp_path: Path, stores) -> None:
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    # The watcher's period (1 s in the product) is not what is tested here: each change below
    # would wait out up to a period before it shows.
    running = stores.start_core(tmp_path / "data", health_interval_s=0.05)
    try:
        activate(running)
        for service in ("", "engram.v1.MemoryService", LIVENESS_SERVICE):
            _until(running.address, service, serving)
        # The state a commit of unknown outcome leaves (and every start, until the build ends):
        # the in-memory index is not current and is rebuilt before it is used again.
        running.core.store._stale = True
        _until(running.address, "engram.v1.MemoryService", not_serving)
        assert _health(running.address, "") == not_serving
        assert _health(running.address, LIVENESS_SERVICE) == serving
        Client(running).search("anything")  # rebuilds the index
        _until(running.address, "engram.v1.MemoryService", serving)
        running.stop()
        assert _health_after_stop_refused(running.address)
    finally:
        running.stop()


def _health_after_stop_refused(address: str) -> bool:
    try:
        _health(address, LIVENESS_SERVICE)
    except grpc.RpcError:
        return True
    return False


def test_a_core_stopped_right_after_it_started_closes_cleanly(tmp_path, stores) -> None:
    """The search index is built after the server listens, on a thread of its own; a stop right
    then closed the store under the build (the file stayed locked for the next start, or the
    process aborted). The store now lets the build finish before it closes."""
    for _ in range(4):
        stores.start_core(tmp_path / "data", semantic=False).stop()
    stores.start_core(tmp_path / "data", semantic=False).stop()  # and the store opens again
