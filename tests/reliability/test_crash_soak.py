"""SIGKILL at random points under a mixed workload (issue 7 item 1, SPEC §7).

Every cycle starts `engram serve` on the same data directory (the database must
reopen without manual repair), retries what was in flight at the previous kill
(a definitive outcome, never an error), verifies the journal and audit chains
through AdminService, runs the workload from a few threads, and SIGKILLs the
process after a random short delay (on each engine: the PostgreSQL leg restarts
`engram serve --store` over the same database and key directory). At the end, with the core
stopped, the store itself is checked (chains, nothing half-applied, every acknowledged mutation has
its journal event and audit row); then every acknowledged mutation is retried
with its idempotency key and must return its original outcome.

CI: 10 kill points per engine (each a restart, a retry of what was in flight and a kill
mid-workload: the seeded workload acknowledges every kind of mutation within them, over a hundred
calls, which the end of the test asserts). ENGRAM_SOAK=1: 200; ENGRAM_KILL_POINTS=N any other.

Each `engram serve` is forked from a process that has imported Engram once
(tests/support/forked_core.py): a process of its own, SIGKILLed for real, whose start opens and
recovers the store, replays the spool and compiles the policy bundle as an exec'd one does,
without the ~1 s of module imports that were two thirds of each of the 22 starts.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from tests.support.core_engines import EngineStores
from tests.support.core_support import Client
from tests.support.forked_core import ForkedCoreProcess
from tests.support.reliability_crash import (
    HostAdmin,
    Ledger,
    SubprocessCore,
    activate_scope,
    check_replays,
    perform,
    verify_file,
    workload,
)
from tests.support.reliability_support import SOAK, scaled

KILL_POINTS = int(os.environ.get("ENGRAM_KILL_POINTS", 0)) or scaled(10, 200)
# When a cycle's kill comes: once the workload has had a drawn number of calls acknowledged in
# the cycle, and a drawn 0-100 ms more, so that it falls at a random point of the calls the three
# clients have in flight. None acknowledged: the kill lands among a fresh start's first calls
# (the index built on its thread, the in-flight retries just answered); more: in steady mixed
# writes and reads. Counting calls rather than waiting a drawn time keeps a run's work, and the
# kinds of mutation it acknowledges (which the end asserts), the same on a loaded machine as on a
# quiet one; CI's ~18 a cycle on average (~180 a run) acknowledge every kind, the soak size's ~75
# as many as its former 0.1-1.2 s did.
CALLS_BEFORE_KILL = scaled(36, 150)
WORKERS = 3
SEED = int(os.environ.get("ENGRAM_SOAK_SEED", "20261207"))


def _until_acknowledged(ledger: Ledger, threads: list[threading.Thread], calls: int, timeout: float = 120) -> None:
    """Until ``calls`` more mutations and reads are acknowledged (or every worker has stopped:
    an unexpected error, which the end of the test reports)."""
    target = len(ledger.acked) + len(ledger.reads) + calls
    deadline = time.monotonic() + timeout
    while len(ledger.acked) + len(ledger.reads) < target and any(t.is_alive() for t in threads):
        assert time.monotonic() < deadline, f"the workload did not reach {calls} acknowledged calls in {timeout:g} s"
        time.sleep(0.005)


@pytest.mark.timeout(3600 if SOAK else 600)
def test_random_sigkills_lose_nothing_acknowledged_and_leave_nothing_half_applied(stores: EngineStores, tmp_path, monkeypatch, record_property) -> None:
    monkeypatch.setenv("ENGRAM_SEMANTIC", os.environ.get("ENGRAM_SEMANTIC", "" if SOAK else "off"))
    rng = random.Random(SEED)
    data = tmp_path / "data"
    proc = ForkedCoreProcess(data, stores)
    ledger = Ledger()
    retried = 0
    try:
        for point in range(KILL_POINTS):
            proc.start()
            core = SubprocessCore(proc.address, data)
            if point == 0:
                activate_scope(core)
            admin = HostAdmin(core)
            clients = [Client(core) for _ in range(WORKERS)]  # type: ignore[arg-type]
            # In flight at the last kill: the retry (same key) gives a definitive outcome.
            in_flight, ledger.in_flight = ledger.in_flight, []
            for kind, args in in_flight:
                ledger.ack(kind, args, perform(clients[0], admin, kind, args, timeout=10))
                retried += 1
            report = admin.verify()
            assert report["ok"] is True, report
            if point % 5 == 0:
                admin.migrate()  # the migration ledger re-verified and applied under the writer lock
            threads = [threading.Thread(target=workload, args=(c, admin, ledger, random.Random(rng.random()), i))
                       for i, c in enumerate(clients)]
            for t in threads:
                t.start()
            _until_acknowledged(ledger, threads, rng.randint(0, CALLS_BEFORE_KILL))
            time.sleep(rng.uniform(0, 0.1))
            proc.kill()
            for t in threads:
                t.join(timeout=30)
                assert not t.is_alive(), "a client hung after the server died"
            for c in clients:
                c.channel.close()
            admin.close()
        assert not ledger.unexpected, ledger.unexpected
        counts = verify_file(stores, data, ledger)
        proc.start()
        core = SubprocessCore(proc.address, data)
        client, admin = Client(core), HostAdmin(core)  # type: ignore[arg-type]
        for kind, args in ledger.in_flight:
            ledger.ack(kind, args, perform(client, admin, kind, args, timeout=10))
            retried += 1
        replayed = check_replays(client, admin, ledger)
        assert admin.verify()["ok"] is True
        kinds = {k for k, _, _ in ledger.acked}
        assert {"capture", "admit", "withdraw", "forget", "host"} <= kinds, kinds
        assert ledger.reads, "no search or get was acknowledged"
        client.channel.close()
        admin.close()
        summary = {"kill_points": KILL_POINTS, "acknowledged": len(ledger.acked), "retried_in_flight": retried,
                   "replayed": replayed, **counts}
        record_property("crash_soak", summary)
        print(f"\ncrash soak: {summary}")
    finally:
        proc.stop()
