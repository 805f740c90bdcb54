"""Sealed search projections (store/projection.py): the codec, and migration 6, which converts a
store of the earlier format (plain postings and vectors) and rewrites the file so the plain rows
are not left in freed pages."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pytest

from engram_core.contract.scope import Scope
from engram_core.crypto.keyvault import FileKeyVault
from engram_core.crypto.sealing import seal
from engram_core.store.duckdb import open_duckdb_store
from engram_core.store.duckdb.migrations import LEDGER_DDL, MIGRATIONS
from engram_core.store.projection import Projection, decode, encode, open_projection, seal_projection
from tests.support.core_engines import rows


def test_codec_round_trips_postings_and_vector() -> None:
    p = Projection.of({0: Counter({-(2**63): 2, 5: 1}), 3: Counter({7: 4})}, "model-x", [0.25, -1.5, 3.0])
    back = decode(encode(p))
    assert {c: (t.tolist(), f.tolist()) for c, (t, f) in back.fields.items()} == \
        {0: ([-(2**63), 5], [2, 1]), 3: ([7], [4])}
    assert back.model == "model-x" and back.vector is not None and back.vector.tolist() == [0.25, -1.5, 3.0]
    assert back.postings == 3
    empty = decode(encode(Projection.of({}, "", None)))
    assert empty.fields == {} and empty.vector is None and empty.model == ""


def test_a_projection_opens_only_with_its_records_key_and_id() -> None:
    key, other = bytes(32), bytes([1]) * 32
    sealed = seal_projection(key, "mem_a", Projection.of({1: Counter({9: 1})}))
    assert open_projection(key, "mem_a", sealed).postings == 1
    with pytest.raises(Exception):  # noqa: B017 - any refusal of the AEAD will do
        open_projection(other, "mem_a", sealed)
    with pytest.raises(Exception):  # noqa: B017
        open_projection(key, "mem_b", sealed)


def _legacy_store(data_dir: Path, vault: FileKeyVault) -> tuple[str, list[int], np.ndarray]:
    """A store as migration 5 left it: one record with plain postings and a plain vector."""
    con = duckdb.connect(str(data_dir / "engram.duckdb"))
    con.execute(LEDGER_DDL)
    for m in MIGRATIONS[:5]:
        con.execute(m.sql)
        con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?, ?)", [m.version, m.name, m.checksum, 0])
    rid = "mem_" + "a" * 52
    slot, key = vault.new_data_key(f"record:{rid}")
    now = int(time.time() * 1000)
    con.execute(
        "INSERT INTO records (record_id, tenant, workspace, candidate_id, record_digest, payload_digest, state, "
        "trust_class, principal, agent_id, valid_t, valid_t_end, expires_at_ms, derivative_rule, accepted_at_ms, "
        "accepted_cursor, state_cursor, successor_id, sealed_body, key_slot) VALUES (?, 'acme', 'alpha', 'cand_1', "
        "?, ?, 'accepted_current', 'asserted', 'agent', 'a1', ?, NULL, NULL, 'make-ineligible', ?, 1, 1, NULL, ?, ?)",
        [rid, "sha256:" + "1" * 64, "sha256:" + "2" * 64, now, now, seal(key, b"{}", kind="record", owner=rid), slot])
    con.execute("INSERT INTO data_keys VALUES (?, ?, ?)", [f"record:{rid}", slot, now])
    terms = [0x1122334455667788, -0x0102030405060708, 0x5A5A5A5A5A5A5A5A]
    doc = con.execute("SELECT doc FROM records").fetchone()[0]
    for i, term in enumerate(terms):
        con.execute("INSERT INTO postings VALUES ('acme', 'alpha', ?, ?, 'primary', ?, 6, ?)", [term, rid, i + 1, doc])
    vector = np.linspace(-1.0, 1.0, 384, dtype=np.float32)
    con.execute("INSERT INTO vectors VALUES (?, 'acme', 'alpha', 'model-x', ?)", [rid, vector.tolist()])
    con.execute("CHECKPOINT")
    con.close()
    return rid, terms, vector


def test_migration_seals_a_legacy_store_and_leaves_no_plain_rows_in_the_file(tmp_path: Path) -> None:
    vault = FileKeyVault(tmp_path)
    rid, terms, vector = _legacy_store(tmp_path, vault)
    before = (tmp_path / "engram.duckdb").read_bytes()
    assert any(t.to_bytes(8, "little", signed=True) in before for t in terms)  # the legacy file holds them

    store = open_duckdb_store(tmp_path, keys=vault)
    try:
        assert [row["version"] for row in store.migration_ledger()][-1] == MIGRATIONS[-1].version
        with store.read() as tx:
            assert tx.postings_count(rid) == 3 and tx.vector_count(rid) == 1
            tables = {r[0] for r in rows(tx, "SELECT table_name FROM information_schema.tables")}
            assert not tables & {"postings", "vectors", "field_stats"}
            assert not rows(tx, "SELECT 1 FROM store_meta WHERE k = 'compact_pending'")
        with store.search_index() as index:
            assert index.indexed_postings(Scope("acme", "alpha"), rid) == 3
    finally:
        store.close()
    files = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    for term in terms:
        assert not any(term.to_bytes(8, order, signed=True) in blob for blob in files for order in ("little", "big"))
    assert not any(vector.tobytes()[:16] in blob for blob in files)
    assert not (tmp_path / "engram.duckdb.compact").exists()


def test_a_crash_before_the_rewrite_finishes_it_at_the_next_open(tmp_path: Path) -> None:
    vault = FileKeyVault(tmp_path)
    rid, terms, _ = _legacy_store(tmp_path, vault)
    store = open_duckdb_store(tmp_path, keys=vault)
    store.close()
    # as if the process died between the migration's commit and the swap: the mark is back
    con = duckdb.connect(str(tmp_path / "engram.duckdb"))
    con.execute("INSERT INTO store_meta VALUES ('compact_pending', 'migration 6')")
    con.close()
    (tmp_path / "engram.duckdb.compact").write_bytes(b"half-written copy")
    store = open_duckdb_store(tmp_path, keys=vault)
    try:
        with store.read() as tx:
            assert not rows(tx, "SELECT 1 FROM store_meta WHERE k = 'compact_pending'")
            assert tx.postings_count(rid) == 3
    finally:
        store.close()
