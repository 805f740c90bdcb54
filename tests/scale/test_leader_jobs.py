"""Leader-only jobs across cores (issue 28): KEK rotation and retirement run on one core at a
time, under the store's leader lease (a PostgreSQL advisory lock on a session of its own), and
another core takes the job over when the leader dies."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_core.app.composition import RunningCore, start_core
from engram_core.clock import FixedClock
from engram_core.crypto.keyvault import KekRing
from engram_core.services.key_schedule import DAY_MS, KeySchedule
from engram_core.services.keyring import KeyRingScheduler
from tests.support.pg_cluster import Database
from tests.support.replicas import serve_store

INTERVAL_S = 2  # the replicas' --key-rotation-interval (checked every 0.5 s)
LEADS = "this core leads job key-ring"
ROTATED = "rotated on schedule"


@pytest.fixture
def two_cores(pg_database: Database, tmp_path: Path) -> Iterator[tuple[FixedClock, RunningCore, RunningCore]]:
    """Two cores in this process over one database and key directory, on one clock; their own
    schedules rotate only on request (the test ticks schedulers of its own)."""
    clock = FixedClock(time.time_ns() // 1_000_000)
    on_request = KeySchedule(rotation_interval_ms=0, retention_ms=DAY_MS)
    key_dir = tmp_path / "keys"
    a = start_core(key_dir, store_url=pg_database.conninfo, clock=clock, key_schedule=on_request, semantic=False)
    try:
        b = start_core(key_dir, store_url=pg_database.conninfo, clock=clock, key_schedule=on_request, semantic=False)
    except BaseException:
        a.stop(0)
        raise
    try:
        yield clock, a, b
    finally:
        b.stop(0)
        a.stop(0)


def test_a_rotation_due_on_both_cores_at_once_happens_once(
        two_cores: tuple[FixedClock, RunningCore, RunningCore]) -> None:
    clock, a, b = two_cores
    daily = KeySchedule(rotation_interval_ms=DAY_MS, retention_ms=DAY_MS)
    schedulers = [KeyRingScheduler(a.core, daily), KeyRingScheduler(b.core, daily)]
    leaders = set()
    for n in range(4):
        clock.advance(DAY_MS + 60_000)  # due on both
        barrier = threading.Barrier(2)
        out: list[Any] = [None, None]

        def tick(i: int, barrier: threading.Barrier = barrier, out: list[Any] = out) -> None:
            barrier.wait()
            out[i] = schedulers[i].tick()

        threads = [threading.Thread(target=tick, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        rotated = [i for i, o in enumerate(out) if "rotated" in o]
        assert len(rotated) == 1, out  # one rotation across both cores, not one per core
        assert out[1 - rotated[0]] == {"leader": False}
        assert out[rotated[0]]["rotated"]["active_generation"] == n + 2
        leaders.add(rotated[0])
    assert len(leaders) == 1  # the core that took the lease kept it from tick to tick
    # The leader stops: its lease is given up, and the other core's next tick leads.
    (a if leaders == {0} else b).stop(0)
    follower = schedulers[1 - leaders.pop()]
    clock.advance(DAY_MS + 60_000)
    assert follower.tick()["rotated"]["active_generation"] == 6


def _until(predicate: Any, timeout_s: float) -> float:
    """Wait for ``predicate()`` (polled); the time it took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.05)
    return time.monotonic() - started


def test_one_replica_rotates_on_schedule_and_another_takes_over_when_it_is_killed(
        pg_database: Database, tmp_path: Path) -> None:
    key_dir = tmp_path / "keys"
    flags = ("--key-rotation-interval", f"{INTERVAL_S}s", "--key-retention", "1h")
    replicas = [serve_store(pg_database.conninfo, key_dir, pg_database.env, *flags)]
    try:
        replicas.append(serve_store(pg_database.conninfo, key_dir, pg_database.env, *flags))
        logs = [r.drain() for r in replicas]
        _until(lambda: any(log.times(LEADS) for log in logs), 15)
        leader = next(i for i, log in enumerate(logs) if log.times(LEADS))
        _until(lambda: len(logs[leader].times(ROTATED)) >= 3, 6 * INTERVAL_S + 15)
        # One rotation per interval across both replicas, all by the leader; the ring's generations
        # are an interval apart (none made twice for one interval).
        assert logs[1 - leader].times(LEADS) == [] and logs[1 - leader].times(ROTATED) == []
        created = [g.created_at_ms for g in KekRing(key_dir / "store.kek").generations()]
        assert len(created) >= 4  # the first generation and three rotations
        assert all(later - earlier >= INTERVAL_S * 1000
                   for earlier, later in zip(created[:-1], created[1:], strict=True))
        # The leader dies without a word: its session ends with its process, and the other replica
        # takes the lease at one of its next checks (every 0.5 s), then rotates on schedule.
        killed = time.monotonic()
        os.kill(replicas[leader].proc.pid, signal.SIGKILL)
        replicas[leader].proc.wait(10)
        took_over = _until(lambda: bool(logs[1 - leader].times(LEADS)), 10)
        _until(lambda: bool(logs[1 - leader].times(ROTATED)), 2 * INTERVAL_S + 10)
        # Still one rotation per interval across the takeover (the new leader's due check reads
        # the ring as the old one left it).
        created = [g.created_at_ms for g in KekRing(key_dir / "store.kek").generations()]
        assert all(later - earlier >= INTERVAL_S * 1000
                   for earlier, later in zip(created[:-1], created[1:], strict=True))
        print(f"lease taken over {took_over:.2f} s after the leader was killed "
              f"(first rotation by the new leader {logs[1 - leader].times(ROTATED)[0] - killed:.2f} s after)")
    finally:
        for r in replicas:
            if r.proc.poll() is None:
                r.stop()
