"""A core over PostgreSQL whose database server goes away and comes back (issue 28: "the cores
recover without a restart"): readiness says NOT_SERVING while the store does not answer, and
SERVING again once it does, the same process serving calls again. The health watcher used to
die on the first store error (a thread exception), leaving readiness at its last value for the
life of the process; and it waited out the store pool's 30 s timeout before it said anything
(an orchestrator kept sending calls for as long): readiness now gives the store
READINESS_PROBE_TIMEOUT_S to answer."""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engram_core.rpc.server import HEALTH_INTERVAL_S, READINESS_PROBE_TIMEOUT_S
from engram_core.store.postgres.engine import PostgresEngine
from tests.support.core_engines import POSTGRESQL, EngineStores
from tests.support.core_support import Client, activate
from tests.support.pg_cluster import PgCluster, wait_until

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
# What readiness used to wait out: how long a call waits for one of the store's connections.
POOL_TIMEOUT_S = inspect.signature(PostgresEngine).parameters["pool_timeout_s"].default
# A check in flight when the server stops, then one that waits READINESS_PROBE_TIMEOUT_S; the
# rest is slack for a loaded machine, well short of the pool's timeout.
NOTICED_WITHIN_S = 2 * HEALTH_INTERVAL_S + READINESS_PROBE_TIMEOUT_S + 5.0


def _readiness(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def test_readiness_follows_a_postgresql_outage_and_recovers_without_a_restart(
        pg_cluster: PgCluster, tmp_path: Path) -> None:
    stores = EngineStores(POSTGRESQL, pg_cluster)  # PostgreSQL's leg only: the outage is its server's
    running = stores.start_core(tmp_path / "keys", semantic=False)
    try:
        activate(running)
        ana = Client(running)
        rid = ana.remember("Outage drill: the godwit note survives the database restart.")
        assert wait_until(lambda: _readiness(running.address) == SERVING, timeout=15)
        assert NOTICED_WITHIN_S < POOL_TIMEOUT_S, "the wait below would not tell a fast check from the pool's timeout"
        pg_cluster.stop("immediate")  # a crash of the server: recovered from its WAL at start
        stopped = time.monotonic()
        try:
            assert wait_until(lambda: _readiness(running.address) == NOT_SERVING, timeout=NOTICED_WITHIN_S), \
                f"readiness did not notice within {NOTICED_WITHIN_S:g} s that the store was gone"
            noticed = time.monotonic() - stopped
        finally:
            pg_cluster.resume()
        # The pool retries a connection 1, 3, 7, 15, 31 s after losing it (a doubling back-off):
        # with the server back within 16 s of its stop, the retry at 31 s at the latest finds it.
        assert wait_until(lambda: _readiness(running.address) == SERVING, timeout=30), \
            f"readiness did not come back with the store (NOT_SERVING after {noticed:.1f} s)"
        assert ana.get(rid)["record"]["record_id"] == rid
        assert [r["record"]["record_id"] for r in ana.search("godwit")["records"]] == [rid]
    finally:
        running.stop()
        stores.close()
