"""Audit fails closed (issue 7 item 6, SPEC §10): a mutation whose audit row cannot
be written does not happen. The fault is injected into the real store of a
running in-process core: the DuckDB engine's write of a mutation's audit rows raises a
DuckDB I/O error, as a full disk would, inside the mutation's transaction (alone or in a
group commit)."""

from __future__ import annotations

import duckdb
import pytest

from engram_core.contract.errors import Code
from engram_core.store.duckdb import engine as duckdb_engine
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, capture_args
from tests.support.reliability_crash import HostAdmin, activate_scope, domain_state

pytestmark = pytest.mark.duckdb_only(
    reason="injects duckdb.IOException into the DuckDB engine's audit insert (and its batch) and reads the "
           "file vault's datakeys.bin")


@pytest.fixture
def core(stores: EngineStores, tmp_path):
    running = stores.start_core(tmp_path / "data", semantic=False)
    activate_scope(running)
    yield running
    running.stop()


def test_audit_write_failure_aborts_every_mutation(core, monkeypatch) -> None:
    c = Client(core)
    host = HostAdmin(core)
    rid = c.remember("The audit drill keeps this ptarmigan record about the Redis cache.")
    rid2 = c.remember("The audit drill keeps a second ptarmigan record, on the Postgres replica lag of 30 seconds.")
    cid = c.capture("The audit drill keeps this ptarmigan candidate pending.")["candidate_id"]
    cap = capture_args("The audit drill tries to capture this ptarmigan.", key="audit-drill-capture-key-1")
    adm = {"candidate_id": cid, "idempotency_key": "audit-drill-admission-key"}
    wd = {"candidate_id": cid, "idempotency_key": "audit-drill-withdraw-key1", "reason_ref": "reason:drill"}
    fg = {"record_id": rid, "idempotency_key": "audit-drill-forget-key-01", "reason_ref": "reason:drill"}
    before = domain_state(core)
    with open(core.core.data_dir / "datakeys.bin", "rb") as f:
        slots_before = f.read()

    def failing(original):
        def insert_audit(self, docs, *, if_absent=False):
            if if_absent:  # the reads' spooled rows moving in: they are not what this drill breaks
                return original(self, docs, if_absent=True)
            raise duckdb.IOException("injected: audit row cannot be written")
        return insert_audit

    for cls in (duckdb_engine.DuckDBEngineTx, duckdb_engine._BatchAudit):
        monkeypatch.setattr(cls, "insert_audit", failing(cls.insert_audit))
    for op, args, gated in [("capture", cap, False), ("request_admission", adm, False), ("withdraw", wd, True),
                            ("forget", fg, True)]:
        code = c.fails(op, args, grant=gated or None)
        assert code in (Code.MUTATION_OUTCOME_UNKNOWN, Code.STORE_UNAVAILABLE), (op, code)
    for req in ({"operation": "dispute", "target": rid2, "event_id": "audit-drill-dispute-evt"},
                {"operation": "tombstone", "target": rid2, "event_id": "audit-drill-tomb-evt-01"},
                {"operation": "reject", "target": cid, "event_id": "audit-drill-reject-evt-1"}):
        with pytest.raises(Exception) as err:
            host.transition({**req, "reason_ref": "reason:drill"})
        assert getattr(err.value, "code", None) in (Code.MUTATION_OUTCOME_UNKNOWN, Code.STORE_UNAVAILABLE)
    assert domain_state(core) == before
    # no live key slot was left behind by the aborted capture/admission (new slots were zeroed)
    with open(core.core.data_dir / "datakeys.bin", "rb") as f:
        slots_after = f.read()
    live_after = {i for i in range(0, len(slots_after), 64) if slots_after[i:i + 64].strip(b"\0")}
    live_before = {i for i in range(0, len(slots_before), 64) if slots_before[i:i + 64].strip(b"\0")}
    assert live_after == live_before
    monkeypatch.undo()
    # the retries are fresh effects (nothing was half-recorded under the keys)
    assert c.call("capture", cap)["status"] == "committed_pending"
    assert c.call("forget", fg, grant=True)["replayed"] is False
    assert c.call("request_admission", adm)["replayed"] is False
    assert host.transition({"operation": "dispute", "target": rid2, "event_id": "audit-drill-dispute-evt",
                            "reason_ref": "reason:drill"})["replayed"] is False
    assert host.verify()["ok"] is True
    host.close()
