"""DuckDB's intent log (engram_core/store/duckdb/intent_log.py): a lone writer's captures and
admissions are answered once their writes are in the synced log, DuckDB commits them later
together, and nothing answered is lost to a crash between the two, replayed twice, or missed by
a read or by the content gate's similar-records check meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.contract.tools import CAPTURE_TOOL
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.services.maintenance import check_audit, check_journal
from engram_core.store.duckdb import engine as duckdb_engine
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.duckdb.intent_log import EPOCH_KEY, INTENTS_NAME, IntentLog
from engram_core.store.port import IdempotencyRow
from tests.support.core_engines import EngineStores
from tests.support.core_support import Client, activate
from tests.support.poisoning_corpus import DUPLICATES

pytestmark = pytest.mark.duckdb_only(reason="the intent log is the DuckDB engine's (PostgreSQL answers at COMMIT)")

REPO = Path(__file__).resolve().parents[2]
PAIRS = 6

# A core in a process of its own that answers PAIRS captures and admissions and then dies
# without closing anything: DuckDB never commits them; only the intent log has them.
_CHILD = """
import json, os, sys, time
from pathlib import Path
from engram_core.app.composition import open_core
from engram_core.services.memory import MemoryService
from engram_core.trust.hostctx import make_context, verify_context
from engram_core.trust.hostkeys import load_private_key_file
from tests.support.core_support import PURPOSE, capture_args

data, pairs, keep = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
import engram_core.store.duckdb.engine as duckdb_engine
duckdb_engine.READS_HOLD_OFF_S = 0.0  # answered from the log even just after open's reads
core, host_key, _ = open_core(data, semantic=False)
memory, key = MemoryService(core), load_private_key_file(host_key)

def ctx(call):
    signed = make_context(key, call=call, tenant="acme", workspace="alpha", principal="user:ana", agent_id="a",
                          session="s", purpose_ref=PURPOSE, now_ms=time.time_ns() // 1_000_000, memory_enabled=True)
    return verify_context(signed, core.trusted, now_ms=core.now_ms())

answered = []
for i in range(pairs):
    args = capture_args(f"Crash test decision {i}: the ledger keeps shard s{i} because of replay order.",
                        key=f"crash-capture-{i:04d}")
    cap = memory.capture(ctx("engram_memory_capture"), args, None)
    out = memory.request_admission(ctx("engram_memory_request_admission"),
                                   {"candidate_id": cap["candidate_id"], "idempotency_key": f"crash-admit-{i:04d}"},
                                   None)
    answered.append([cap["candidate_id"], out["outcome"]["record_id"]])
log = data / "engram.intents"
if keep == "commit-then-restore":  # the log's bytes as they were, put back after DuckDB committed them
    saved = log.read_bytes()
    with core.store.read() as tx:  # a reader: DuckDB commits the answered writes, the log is emptied
        pass
    assert log.stat().st_size == 0
    log.write_bytes(saved)
print(json.dumps(answered), flush=True)
os._exit(0)
"""


@pytest.fixture(autouse=True)
def _log_even_after_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about what the log holds: every lone writer's batch is answered from it,
    even right after a read (READS_HOLD_OFF_S has its own test below)."""
    monkeypatch.setattr(duckdb_engine, "READS_HOLD_OFF_S", 0.0)


def _die_after_pairs(data: Path, how: str = "crash") -> list[list[str]]:
    """[candidate id, record id] of each pair the child answered."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(data), str(PAIRS), how], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _prepared(stores: EngineStores, data: Path) -> None:
    running = stores.start_core(data)
    activate(running)
    running.stop()


def _check_whole(data: Path, answered: list[str]) -> None:
    store = open_duckdb_store(data, keys=FileKeyVault(data))
    try:
        with store.read() as tx:
            rows = tx.records(Scope("acme", "alpha"), answered)
            scope = tx.scope(Scope("acme", "alpha"))
            events = tx.events(Scope("acme", "alpha"), 1, None)
            audit = tx.audit_rows(None, 1, None)
            heads = tx.audit_heads()
        assert set(rows) == set(answered)
        assert all(r.state == "accepted_current" for r in rows.values())
        assert scope is not None and scope.last_cursor == len(events) == 2 * PAIRS
        assert check_journal(scope, events) == []
        assert check_audit(audit, heads) == []
    finally:
        store.close()


def test_answered_writes_survive_a_crash_before_duckdb_commits_them(stores: EngineStores, tmp_path: Path) -> None:
    data = tmp_path / "data"
    _prepared(stores, data)
    pairs = _die_after_pairs(data)
    answered = [rid for _, rid in pairs]
    frames = IntentLog(data / INTENTS_NAME).frames()
    assert len(frames) == 2 * PAIRS  # one frame per answer: nothing of them reached DuckDB
    running = stores.start_core(data)  # replays the frames, then empties the log
    try:
        assert (data / INTENTS_NAME).stat().st_size == 0
        client = Client(running)
        for rid in answered:
            assert client.get(rid)["record"]["record_id"] == rid
        found = {r["record"]["record_id"] for r in client.search("ledger shard replay order", limit=20)["records"]}
        assert set(answered) <= found
        # The idempotency keys came back with the rows: a retry is a replay, not a second record.
        again = client.call("request_admission", {"candidate_id": pairs[0][0], "idempotency_key": "crash-admit-0000"})
        assert again["outcome"]["record_id"] == answered[0] and again["replayed"]
    finally:
        running.stop()
    _check_whole(data, answered)


def test_a_torn_frame_ends_the_log_and_the_whole_ones_replay(stores: EngineStores, tmp_path: Path) -> None:
    data = tmp_path / "data"
    _prepared(stores, data)
    answered = [rid for _, rid in _die_after_pairs(data)]
    log = data / INTENTS_NAME
    assert len(IntentLog(log).frames()) == 2 * PAIRS
    whole = log.read_bytes()
    with log.open("ab") as f:  # a crash in the middle of writing a frame never answered
        f.write(whole[: len(whole) // (2 * PAIRS) // 2])
    _check_whole(data, answered)
    assert log.stat().st_size == 0


def test_frames_duckdb_committed_before_a_crash_are_not_replayed_twice(stores: EngineStores, tmp_path: Path) -> None:
    data = tmp_path / "data"
    _prepared(stores, data)
    answered = [rid for _, rid in _die_after_pairs(data, "commit-then-restore")]
    assert IntentLog(data / INTENTS_NAME).frames()  # the frames are back, DuckDB has their rows too
    _check_whole(data, answered)  # an insert twice would have failed the open on a primary key


def test_reads_and_the_content_gate_see_answers_not_yet_committed(fresh_core: Any) -> None:
    """Between the answer and DuckDB's COMMIT: a get and a search see the record, and a
    restatement's admission meets it in the similar-records check (read through the writer's
    open batch, not committed for it)."""
    client = Client(fresh_core)
    engine = fresh_core.core.store.engine
    original, restatement = DUPLICATES[0]
    first = client.admit(client.capture(original)["candidate_id"])["outcome"]
    assert first["status"] == "accepted"
    assert engine._batch.acked_members == 2 and engine._intents.size > 0  # answered from the log alone
    again = client.admit(client.capture(restatement)["candidate_id"])["outcome"]
    assert again["status"] != "accepted", again  # the gate met the first, not yet in DuckDB
    assert engine._batch.acked_members == 4, "the admission's checks committed the open batch"
    assert client.get(first["record_id"])["record"]["record_id"] == first["record_id"]
    assert engine._batch is None and engine._intents.size == 0  # the get committed them, the log emptied


def test_a_forget_commits_before_it_is_answered_and_leaves_the_log_empty(fresh_core: Any) -> None:
    client = Client(fresh_core)
    engine = fresh_core.core.store.engine
    rid = client.remember("We retired the nightly export because nobody read it.")
    assert engine._intents.size > 0
    client.call("forget", {"record_id": rid, "idempotency_key": "intent-forget-0001", "reason_ref": "r:x"},
                grant=True)
    assert engine._intents.size == 0 and (engine.data_dir / INTENTS_NAME).stat().st_size == 0
    assert client.fails("get", {"record_id": rid, "purpose_ref": client.purpose_ref}) == Code.NOT_FOUND


def test_the_epoch_duckdb_committed_is_recorded_with_its_rows(fresh_core: Any) -> None:
    client = Client(fresh_core)
    client.remember("The retry budget is three attempts with jitter.")
    with fresh_core.core.store.read():  # commits the answered pair
        pass
    con = fresh_core.core.store.engine._con
    epoch = con.execute("SELECT v FROM store_meta WHERE k = ?", [EPOCH_KEY]).fetchone()
    assert epoch is not None and int(epoch[0]) >= 1


def test_a_write_refused_after_answered_ones_keeps_them(stores: EngineStores, tmp_path: Path) -> None:
    """A refused member rolls the open batch back; the batch is rebuilt from the log's frames,
    so the writes answered before it stay, found by the next writer and after a reopen."""
    data = tmp_path / "data"
    data.mkdir()
    scope = Scope("acme", "alpha")
    row = IdempotencyRow(CAPTURE_TOOL, "cand_x", "sha256:" + "0" * 64, {"status": "committed_pending"})
    store = open_duckdb_store(data, keys=FileKeyVault(data))
    try:
        with store.write(batched=True) as tx:
            tx.idempotency_put(scope, "user:ana", "key-answered-0001", row, 1)
        assert store.engine._batch.acked  # answered from the log, not committed
        with pytest.raises(RuntimeError), store.write(batched=True) as tx:
            tx.idempotency_put(scope, "user:ana", "key-refused-0001", row, 1)
            raise RuntimeError("refused after its writes")
        with store.write(batched=True) as tx:
            assert tx.idempotency_get(scope, "user:ana", "key-answered-0001") == row
            assert tx.idempotency_get(scope, "user:ana", "key-refused-0001") is None
    finally:
        store.close()
    store = open_duckdb_store(data, keys=FileKeyVault(data))
    try:
        with store.read() as tx:
            assert tx.idempotency_get(scope, "user:ana", "key-answered-0001") == row
            assert tx.idempotency_get(scope, "user:ana", "key-refused-0001") is None
    finally:
        store.close()


def test_a_row_duckdb_would_refuse_is_refused_before_the_answer(stores: EngineStores, tmp_path: Path) -> None:
    """Answered from the log, a batch flushes only later: a primary key already answered (in the
    open batch, or committed) is refused before the answer, as the flush would have refused it,
    and what was answered stays."""
    data = tmp_path / "data"
    data.mkdir()
    store = open_duckdb_store(data, keys=FileKeyVault(data))
    try:
        with store.write(batched=True) as tx:
            tx.put_data_key("record:once", 7, 1)
        assert store.engine._batch.acked
        for _ in range(2):  # against the open batch, then against the committed row
            with pytest.raises(EngramError) as refused, store.write(batched=True) as tx:
                tx.put_data_key("record:once", 8, 2)
            assert refused.value.code == Code.STORE_UNAVAILABLE and "before its answer" in str(refused.value)
            with store.read() as tx:  # commits the answered write (the second time: nothing open)
                assert tx.data_key_slot("record:once") == 7
        with store.write(batched=True) as tx:  # a key the batch itself deletes may come back
            tx.drop_data_key("record:once", 3, "test")
            tx.put_data_key("record:once", 9, 3)
        with store.read() as tx:
            assert tx.data_key_slot("record:once") == 9
    finally:
        store.close()


def test_while_reads_arrive_a_lone_writer_commits_before_its_answer(fresh_core: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A read begun within the hold-off (READS_HOLD_OFF_S) makes the next batches commit before
    they are answered, as without the log: the readers that follow find nothing to commit. With
    no read within it, the log answers again."""
    client = Client(fresh_core)
    engine = fresh_core.core.store.engine
    monkeypatch.setattr(duckdb_engine, "READS_HOLD_OFF_S", 3600.0)
    with fresh_core.core.store.read(snapshot=False):
        pass
    rid = client.remember("The export job writes one file per tenant per day.")
    assert engine._batch is None and engine._intents.size == 0  # committed before its answer
    assert client.get(rid)["record"]["record_id"] == rid
    monkeypatch.setattr(duckdb_engine, "READS_HOLD_OFF_S", 0.0)
    client.remember("The import job reads the files in the order they were written.")
    assert engine._batch is not None and engine._batch.acked_members == 2 and engine._intents.size > 0

