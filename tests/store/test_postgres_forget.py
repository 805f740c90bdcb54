"""Forget leaves nothing readable in PostgreSQL (SPEC §10), proved on the real cluster's files.

PostgreSQL keeps deleted rows: a forgotten record's old row versions stay in the heap files as
dead tuples, in the WAL, and in every dump taken before the forget. So the guarantee cannot rest
on deletion: only sealed bytes and wrapped keys may ever reach the database. This test admits a
record with distinctive text through the kernel (sealed body, sealed projection of its term
hashes and vector, data keys from the PostgreSQL key vault), takes a ``pg_dump``, forgets it,
forces everything to disk, and then reads the cluster's heap files, its WAL and the dumps:

- what must never be there: the plaintext, the term hashes and the vector (in any byte order),
  the projection's plain encoding, and the unwrapped data keys (raw or hex);
- what must be there, so the search above is not vacuous: the sealed body, the sealed projection
  and the wrapped key bytes (dead tuples, the WAL and the dump keep them: the reason the next
  step exists);
- after the KEK generation that wrapped those keys retires, no KEK left in the ring opens any
  wrapped copy found, so the copies the database kept are shreds.
"""

from __future__ import annotations

import secrets
import struct
from pathlib import Path

import numpy as np
from pg_cluster import Database, PgCluster, wal_stream
from store_checks import T, W, search
from store_targets import PostgresTarget

from engram_core.canonical import canonical_json
from engram_core.crypto.sealing import seal
from engram_core.services.lexical import TermHasher
from engram_core.store.port import CandidateRow, RecordRow
from engram_core.store.projection import Projection, encode
from engram_core.store.search_index import FIELD_CODE


def _files(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _wrapped(db: Database, ref: int) -> bytes | None:
    """The wrapped key the vault stored at ``ref`` (None: destroyed)."""
    with db.connect() as con:
        row = con.execute("SELECT wrapped FROM vault_keys WHERE ref = %s", [ref]).fetchone()
    return bytes(row[0]) if row else None


def _found(haystack: bytes, needles: dict[str, bytes]) -> list[str]:
    return sorted(name for name, needle in needles.items() if needle in haystack)


def test_a_forgotten_record_leaves_nothing_readable_in_heap_wal_or_dump(
        tmp_path: Path, pg_database: Database, pg_cluster: PgCluster) -> None:
    target = PostgresTarget(tmp_path, pg_database)
    store = target.open()
    vault = store.vault  # type: ignore[attr-defined]
    # The cluster is shared with every other test: without a slot holding it, the checkpoints below
    # may recycle the segment that holds the capture's WAL before it is read. (And the WAL is read
    # with its page headers cut out, wal_stream: a record split by one failed the controls once.)
    slot = "forget_" + secrets.token_hex(4)
    with pg_database.connect() as con:
        con.execute("SELECT pg_create_physical_replication_slot(%s, true)", [slot])
    try:
        marker = "zq" + secrets.token_hex(6)  # a word no other test writes
        text = f"Quarterly {marker} decision: the vermilion-heron protocol ships to Ulaanbaatar on Tuesday"
        payload = {"primary": text, "decision": f"ship {marker} now", "citations": ["doc:vermilion-heron"]}
        hasher = TermHasher(secrets.token_bytes(32))
        fields = {"primary": hasher.counts(text), "decision": hasher.counts(payload["decision"])}
        rng = np.random.default_rng(7)
        vector = [float(x) for x in rng.standard_normal(64).astype(np.float32)]

        # Capture: the envelope sealed under the candidate's own key.
        cand_slot, cand_key = vault.new_data_key("candidate:cand_forget", durable=False)
        envelope = seal(cand_key, canonical_json({"payload": payload}), kind="candidate", owner="cand_forget")
        with store.write() as tx:
            ev = tx.append_event(T, W, event_id="evt_capture", operation="capture", target="cand_forget",
                                 from_state="", to_state="pending", at_ms=1, body={})
            tx.insert_candidate(CandidateRow("cand_forget", T, W, "user:ana", "agent", "s1", "pending",
                                             "sha256:" + "a" * 64, "sha256:" + "b" * 64, "asserted", {"n": 1},
                                             envelope, 1, ev.cursor, key_slot=cand_slot))
            tx.put_data_key("candidate:cand_forget", cand_slot, 1)
        wrapped = {"candidate": _wrapped(pg_database, cand_slot)}
        # Admission: the record's body and projection sealed under the record's key; the candidate's
        # envelope dropped and its key destroyed.
        rec_slot, rec_key = vault.new_data_key("record:mem_forget", durable=False)
        body = seal(rec_key, canonical_json(payload), kind="record", owner="mem_forget")
        with store.write() as tx:
            ev = tx.append_event(T, W, event_id="evt_accept", operation="accept", target="cand_forget",
                                 from_state="pending", to_state="accepted_current", at_ms=2, body={})
            tx.insert_record(RecordRow("mem_forget", T, W, "cand_forget", "sha256:" + "b" * 64, "sha256:" + "a" * 64,
                                       "accepted_current", "asserted", "user:ana", "agent", 1, None, None,
                                       "make-ineligible", 2, ev.cursor, ev.cursor, None, body, key_slot=rec_slot))
            tx.put_data_key("record:mem_forget", rec_slot, 2)
            tx.index_record(T, W, "mem_forget", fields, ("test-model-64", vector))
            tx.set_candidate_state("cand_forget", "accepted", decision={"status": "accepted"}, drop_envelope=True)
            tx.drop_data_key("candidate:cand_forget", 2, "accepted", slot=cand_slot)
        term = next(iter(fields["primary"]))
        assert search(store, [term]) == ["mem_forget"]  # admitted and searchable
        with store.read() as rtx:
            sealed_projection = rtx.projection_blob("mem_forget")[0]
        wrapped["record"] = _wrapped(pg_database, rec_slot)
        # The candidate's key was destroyed at admission: its row is gone (its bytes are not, below).
        assert _wrapped(pg_database, cand_slot) is None
        with pg_database.connect() as con:
            con.execute("CHECKPOINT")  # the candidate key's row and the envelope's, still in pages
        heap_before = _files(pg_cluster.database_dir(pg_database))
        dump_before = pg_cluster.pg_dump(pg_database)

        # Forget.
        with store.write() as tx:
            rec = tx.record(T, W, "mem_forget")
            assert rec is not None
            ev = tx.append_event(T, W, event_id="evt_forget", operation="forget", target="mem_forget",
                                 from_state="accepted_current", to_state="tombstoned", at_ms=3, body={})
            tx.set_record_state("mem_forget", "tombstoned", state_cursor=ev.cursor, drop_body=True)
            tx.unindex_record(T, W, "mem_forget")
            tx.drop_record_links("mem_forget")
            tx.add_tombstone(T, W, rec.payload_digest, "mem_forget", ev.cursor, 3)
            tx.drop_data_key("record:mem_forget", 3, "tombstone", slot=rec_slot)
        assert tx.keys_zeroed and tx.key_destruction_outcome == "pending"  # generation 1 still in the ring
        assert search(store, [term]) == [] and vault.data_key(rec_slot, "record:mem_forget") is None
        with pg_database.connect() as con:
            con.execute("CHECKPOINT")  # every page the forget dirtied, on disk
            con.execute("SELECT pg_switch_wal()")
        heap_after = _files(pg_cluster.database_dir(pg_database))
        wal = _files(pg_cluster.data / "pg_wal") + wal_stream(sorted((pg_cluster.data / "pg_wal").glob("0*")))
        dump_after = pg_cluster.pg_dump(pg_database)

        plain = Projection.of({FIELD_CODE[name]: counts for name, counts in fields.items()}, "test-model-64", vector)
        vec32 = np.asarray(vector, dtype="<f4").tobytes()
        secret: dict[str, bytes] = {
            "plaintext": text.encode(), "marker": marker.encode(), "decision text": payload["decision"].encode(),
            "vector float32": vec32, "vector float32 big-endian": np.asarray(vector, dtype=">f4").tobytes(),
            "vector float64": np.asarray(vector, dtype="<f8").tobytes(),
            "vector head": vec32[:16], "projection plain": encode(plain),
            "record key": rec_key, "candidate key": cand_key,
        }
        for n, t in enumerate(sorted({t for counts in fields.values() for t in counts})):
            secret[f"term hash {n} le"] = struct.pack("<q", t)
            secret[f"term hash {n} be"] = struct.pack(">q", t)
        # And as text (bytea as hex, numbers in decimal): the dumps are text, and a leak into a text
        # column would be text in the heap and the WAL too.
        in_text = {**secret, **{f"{k} hex": v.hex().encode() for k, v in secret.items() if "key" in k or "vector" in k},
                   **{f"term hash {n} decimal": str(t).encode()
                      for n, t in enumerate(sorted({t for counts in fields.values() for t in counts}))}}
        for place, haystack in (("heap before", heap_before), ("heap after", heap_after), ("WAL", wal),
                                ("dump before", dump_before), ("dump after", dump_after)):
            assert _found(haystack, in_text) == [], place

        # Positive controls: the searches above looked where the sealed bytes really are.
        assert body in wal and sealed_projection in wal and wrapped["record"] in wal
        assert body in heap_after and wrapped["record"] in heap_after  # dead tuples: DELETE is not erasure
        assert body.hex().encode() in dump_before and wrapped["record"].hex().encode() in dump_before
        assert envelope in wal and wrapped["candidate"] in wal and b"mem_forget" in heap_after

        # Retirement: rotate (no live key to re-wrap), retire the generation that wrapped them, and no
        # KEK left anywhere opens a wrapped copy the database kept.
        old = vault.active_generation()
        # Until then the copies are real keys: the generation that wrapped them opens them.
        assert vault.ring.unwrap(2, old, wrapped["record"], "record:mem_forget") == rec_key
        assert vault.ring.unwrap(2, old, wrapped["candidate"], "candidate:cand_forget") == cand_key
        vault.rotate(10)
        vault.retire(old, 11)
        assert vault.destruction_complete(old)
        ring = vault.ring
        for copy, owner in ((wrapped["record"], "record:mem_forget"), (wrapped["candidate"], "candidate:cand_forget")):
            for generation in [g.generation for g in ring.generations()] + [old]:
                assert ring.unwrap(2, generation, copy, owner) is None
        with store.read() as rtx:
            destruction = rtx.key_destruction("record:mem_forget")
        assert destruction is not None and destruction.generation == old
    finally:
        target.close_all()
        with pg_database.connect() as con:
            con.execute("SELECT pg_drop_replication_slot(%s)", [slot])
