"""A core over PostgreSQL whose database server goes away and comes back (issue 28: "the cores
recover without a restart"): readiness says NOT_SERVING while the store does not answer, and
SERVING again once it does, the same process serving calls again. The health watcher used to
die on the first store error (a thread exception), leaving readiness at its last value for the
life of the process."""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.core_engines import POSTGRESQL, EngineStores
from tests.support.core_support import Client, activate
from tests.support.pg_cluster import PgCluster, wait_until

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


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
        pg_cluster.stop("immediate")  # a crash of the server: recovered from its WAL at start
        try:
            # The health read waits for a connection up to the pool's timeout (30 s) before it fails.
            assert wait_until(lambda: _readiness(running.address) == NOT_SERVING, timeout=45), \
                "readiness did not notice the store was gone"
        finally:
            pg_cluster.resume()
        assert wait_until(lambda: _readiness(running.address) == SERVING, timeout=30), \
            "readiness did not come back with the store"
        assert ana.get(rid)["record"]["record_id"] == rid
        assert [r["record"]["record_id"] for r in ana.search("godwit")["records"]] == [rid]
    finally:
        running.stop()
        stores.close()
