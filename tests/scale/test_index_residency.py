"""Scopes' search indexes loaded on first use and evicted within a budget (issue 28): a core over
a shared PostgreSQL store holds no scope's index until a read needs it, keeps the loaded ones
within `--index-max-records`, and an evicted scope answers its next search as before (loaded
again), with what other cores wrote meanwhile. Eviction costs a cold read, never an answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from engram_core.app.composition import RunningCore, start_core
from engram_core.contract.canonical import with_receipt_digest
from engram_core.contract.errors import Code
from engram_core.contract.scope import Scope
from engram_core.observability.metrics import CoreMetrics
from tests.support.core_support import Client, activate
from tests.support.pg_cluster import Database

WORKSPACES = ("alpha", "beta", "gamma")
PER_SCOPE = 3


@pytest.fixture
def cores(pg_database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunningCore, RunningCore, CoreMetrics]]:
    for name, value in pg_database.env.items():
        monkeypatch.setenv(name, value)
    writer = start_core(tmp_path / "keys", store_url=pg_database.conninfo, semantic=False)
    metrics = CoreMetrics()
    try:
        for w in WORKSPACES:
            activate(writer, workspace=w)
        # Room for two scopes' records: the third's load evicts the least recently used.
        budgeted = start_core(tmp_path / "keys", store_url=pg_database.conninfo, semantic=False,
                              index_max_records=2 * PER_SCOPE, metrics=metrics)
    except BaseException:
        writer.stop()
        raise
    try:
        yield writer, budgeted, metrics
    finally:
        budgeted.stop()
        writer.stop()


def _ids(result: dict) -> set[str]:
    return {r["record"]["record_id"] for r in result["records"]}


def test_scopes_load_on_first_use_and_the_least_recently_used_is_evicted(
        cores: tuple[RunningCore, RunningCore, CoreMetrics]) -> None:
    writer, budgeted, metrics = cores
    written = {w: {Client(writer, workspace=w).remember(f"Residency: the {w} scope's storm petrel note {n}.")
                   for n in range(PER_SCOPE)} for w in WORKSPACES}
    stats = budgeted.core.store.residency()
    assert stats.scopes_loaded == 0 and stats.records_loaded == 0  # nothing loaded at open

    readers = {w: Client(budgeted, workspace=w) for w in WORKSPACES}
    assert _ids(readers["alpha"].search("storm petrel note")) == written["alpha"]
    assert _ids(readers["beta"].search("storm petrel note")) == written["beta"]
    stats = budgeted.core.store.residency()
    assert (stats.scopes_loaded, stats.records_loaded, stats.evictions) == (2, 2 * PER_SCOPE, 0)
    readers["alpha"].search("storm petrel")  # alpha is now the most recently used
    assert _ids(readers["gamma"].search("storm petrel note")) == written["gamma"]
    stats = budgeted.core.store.residency()
    assert (stats.scopes_loaded, stats.evictions) == (2, 1)  # beta went

    # Beta, evicted, gets a record written on the other core, and a forget: its next search
    # loads it again as the database holds it now.
    beta = Client(writer, workspace="beta")
    added = beta.remember("Residency: while beta was evicted, a storm petrel note on the Lisbon ferry timetable was written.")
    gone = sorted(written["beta"])[0]
    beta.call("forget", {"record_id": gone, "idempotency_key": "residency-forget-beta-01", "reason_ref": "r:x"},
              grant=True)
    assert _ids(readers["beta"].search("storm petrel note")) == (written["beta"] - {gone}) | {added}
    assert readers["beta"].fails("get", {"record_id": gone, "purpose_ref": readers["beta"].purpose_ref}) \
        == Code.NOT_FOUND
    stats = budgeted.core.store.residency()
    assert stats.loads == 4 and stats.scopes_loaded == 2 and stats.records_loaded <= 2 * PER_SCOPE + 1

    # A record this core admits into a scope it has not loaded is found by that scope's first read.
    own = readers["alpha"]
    assert budgeted.core.store.residency().evictions == 2  # alpha went when beta loaded again
    mine = own.remember("Residency: a storm petrel note admitted by the budgeted core itself.")
    assert mine in _ids(own.search("storm petrel note"))

    # The admission itself read alpha's index (the admission policy's similar current records,
    # issue 59), loading alpha's three records and evicting the least recently used scope; the
    # admitted record joined it, one over the budget until the next load, as any admission into a
    # held scope is.
    stats = budgeted.core.store.residency()
    assert (stats.scopes_loaded, stats.records_loaded) == (2, 2 * PER_SCOPE + 1)
    scraped = generate_latest(metrics.registry).decode()
    for name in ("engram_search_index_scopes_loaded 2.0", "engram_search_index_scope_loads_total",
                 "engram_search_index_scope_evictions_total", "engram_search_index_budget_records 6.0",
                 "engram_search_index_scope_load_duration_seconds_count"):
        assert name in scraped, name


def test_a_forget_on_a_core_that_has_not_loaded_the_scope_neither_loads_it_nor_miscounts(
        cores: tuple[RunningCore, RunningCore, CoreMetrics]) -> None:
    """A forget counts the postings it removes for its coverage receipt, under the scope lock.
    Counted from a scope's index that this core had not loaded, it loaded the whole scope there
    first (seconds at 100k records, every core's writes to the scope waiting); counted from an
    index behind another core's writes, it said 0. The sealed projection counts them instead."""
    writer, budgeted, _ = cores
    store = budgeted.core.store

    def forget_counted(rid: str, key: str) -> None:
        with store.read() as tx:
            rec = tx.record(Scope("acme", "alpha"), rid)
            postings = tx.postings_count(rid)
        assert rec is not None and postings > 0
        out = Client(budgeted).call("forget", {"record_id": rid, "idempotency_key": key, "reason_ref": "r:x"},
                                    grant=True)
        coverage = with_receipt_digest({
            "kind": "coverage", "record_id": rid, "postings_removed": postings, "vectors_removed": True,
            "body_dropped": True, "key_destroyed": True, "tombstone_ledgered": True,
            "cursor": out["receipt"]["cursor"], "derivative_rule": rec.derivative_rule,
            "derivatives": []})["receipt_digest"]
        assert out["coverage_receipt_digest"] == coverage
        for core in (writer, budgeted):  # total on both cores all the same
            assert Client(core).fails("get", {"record_id": rid, "purpose_ref": Client(core).purpose_ref}) \
                == Code.NOT_FOUND

    forget_counted(Client(writer).remember("Residency: a grebe note forgotten on a core that never searched alpha."),
                   "residency-forget-cold-01")
    stats = store.residency()
    assert (stats.loads, stats.scopes_loaded) == (0, 0)
    # Its admission read alpha's index once (the similar current records the admission policy
    # sees, issue 59); its capture loaded nothing.
    assert writer.core.store.residency().loads == 1
    # Loaded, then behind: a record the other core wrote since this core's last read.
    Client(budgeted).search("grebe note")
    forget_counted(Client(writer).remember("Residency: a second grebe note, written after alpha was loaded here."),
                   "residency-forget-behind-01")
    assert store.residency().loads == 1
