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

The second test does the same through two real cores (``engram serve --store``) after real
searches and pages across them, so it also reads what a search, a page, a quota count and a
lease write (``page_pins``, ``usage_buckets``, ``context_nonce_claims``, the audit rows; leases
are advisory locks and write no row): neither the forgotten record's words, nor their keyed term
hashes (with the key directory's ``index.key``), nor the queries' digests may be there, before
or after the forget. A search pin is sealed under a key only its cursor carries
(``engram_core/store/page_pins.py``); the last test checks that seal on the engine.
"""

from __future__ import annotations

import base64
import json
import secrets
import struct
from pathlib import Path
from typing import Any

import numpy as np

from engram_core.api import admin_pb2
from engram_core.contract.canonical import canonical_json, digest
from engram_core.contract.scope import Scope
from engram_core.crypto.sealing import seal
from engram_core.services.lexical import TermHasher
from engram_core.store.conformance.support import T, W, search
from engram_core.store.page_pins import Binding, Pin, PinRef, open_pin, pin_to_json
from engram_core.store.port import CandidateRow, LexicalStats, RecordRow
from engram_core.store.projection import Projection, encode
from engram_core.store.search_index import FIELD_CODE
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, make_context

# Two real cores, as tests/scale runs them: its helpers and the core and MCP ones they use.
from tests.support.core_support import Client, activate, now_ms
from tests.support.pg_cluster import Database, PgCluster, wal_stream
from tests.support.replicas import replica_pair
from tests.support.store_targets import PostgresTarget


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
            ev = tx.append_event(Scope(T, W), event_id="evt_capture", operation="capture", target="cand_forget",
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
            ev = tx.append_event(Scope(T, W), event_id="evt_accept", operation="accept", target="cand_forget",
                                 from_state="pending", to_state="accepted_current", at_ms=2, body={})
            tx.insert_record(RecordRow("mem_forget", T, W, "cand_forget", "sha256:" + "b" * 64, "sha256:" + "a" * 64,
                                       "accepted_current", "asserted", "user:ana", "agent", 1, None, None,
                                       "make-ineligible", 2, ev.cursor, ev.cursor, None, body, key_slot=rec_slot))
            tx.put_data_key("record:mem_forget", rec_slot, 2)
            tx.index_record(Scope(T, W), "mem_forget", fields, ("test-model-64", vector))
            tx.set_candidate_state("cand_forget", "accepted", decision={"status": "accepted"}, drop_envelope=True)
            tx.drop_data_key("candidate:cand_forget", 2, "accepted", slot=cand_slot)
        term = next(iter(fields["primary"]))
        assert search(store, [term]) == ["mem_forget"]  # admitted and searchable
        with store.engine.read() as rtx:  # the sealed blob as the engine keeps it (not a Tx member)
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
            rec = tx.record(Scope(T, W), "mem_forget")
            assert rec is not None
            ev = tx.append_event(Scope(T, W), event_id="evt_forget", operation="forget", target="mem_forget",
                                 from_state="accepted_current", to_state="tombstoned", at_ms=3, body={})
            tx.set_record_state("mem_forget", "tombstoned", state_cursor=ev.cursor, drop_body=True)
            tx.unindex_record(Scope(T, W), "mem_forget")
            tx.drop_record_links("mem_forget")
            tx.add_tombstone(Scope(T, W), rec.payload_digest, "mem_forget", ev.cursor, 3)
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


def _slot(db: Database) -> str:
    """A physical replication slot holding the WAL from now on (the cluster is shared: without it a
    checkpoint may recycle the segment the test must read)."""
    slot = "forget_" + secrets.token_hex(4)
    with db.connect() as con:
        con.execute("SELECT pg_create_physical_replication_slot(%s, true)", [slot])
    return slot


def _drop_slot(db: Database, slot: str) -> None:
    with db.connect() as con:
        con.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def _word() -> str:
    """A word no other test writes, that analysis keeps whole (lower-case consonants, no s)."""
    return "".join(secrets.choice("bcdfghjklmnpqrtvwxz") for _ in range(12))


def _pin_ref(cursor: str) -> PinRef:
    """The pin reference a page cursor carries (its body is readable to whoever holds it; the tag
    after it is what the core checks)."""
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    ref = PinRef.parse(json.loads(raw[:-16])["pin"])
    assert ref is not None
    return ref


def _operator(client: Client) -> list[tuple[str, bytes]]:
    ctx = make_context(client.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:operator",
                       now_ms=now_ms(), host_principal=True, maintenance_scopes=("read", "maintain"),
                       memory_enabled=False)
    return [(CONTEXT_METADATA_KEY, ctx)]


def _ids(page: dict[str, Any]) -> list[str]:
    return [r["record"]["record_id"] for r in page["records"]]


def test_searches_and_pages_on_two_cores_leave_nothing_of_a_forgotten_record_in_postgresql(
        tmp_path: Path, pg_database: Database, pg_cluster: PgCluster) -> None:
    """Issue 57: a paged search's pin held the keyed term hashes of the query's words with their
    document frequencies, and an unkeyed digest of the query, as plain JSON in ``page_pins``. After
    a forget, a rotation and ``retire-keys --now``, the WAL and a dump still named the forgotten
    record's two words to anyone holding ``index.key`` and a guess list, and confirmed a guessed
    query with no key at all. Now a pin is sealed under a key only its cursor carries."""
    slot = _slot(pg_database)
    key_dir = tmp_path / "keys"
    try:
        with replica_pair(pg_database.conninfo, key_dir, pg_database.env) as (ra, rb):
            activate(ra)  # type: ignore[arg-type]
            a, b = Client(ra), Client(rb)  # type: ignore[arg-type]
            w1, w2 = _word(), _word()
            text = f"Kittiwake runbook: {w1} and {w2} name the failover order."
            rid = a.remember(text)
            others = [b.remember(f"Kittiwake note {n} about the runbook.") for n in range(3)]
            # Paged searches naming both words, each first page on one core and paged on the other.
            queries = {f"{w1} {w2} kittiwake runbook": (a, b), f"kittiwake {w2} {w1}": (b, a)}
            cursors, digests = [], []
            for query, (first_core, next_core) in queries.items():
                first = first_core.search(query, limit=1)
                assert _ids(first) == [rid] and "next_page_cursor" in first
                second = next_core.search(query, limit=1, page_cursor=first["next_page_cursor"])
                assert _ids(second) and _ids(second)[0] in others  # paged on the other core
                request_digest = digest("query", {"query": query, "params": {"limit": 1}})
                assert first["rank_receipt"]["request_digest"] == request_digest  # what the pin held
                cursors.append(first["next_page_cursor"])
                digests.append(request_digest)
            index_key = (key_dir / "index.key").read_bytes()
            hasher = TermHasher(index_key)
            forgotten = {hasher.term(w) for w in (w1, w2)}
            assert forgotten <= set(hasher.terms(text))
            with pg_database.connect() as con:
                rows = {r[0]: bytes(r[1]) for r in con.execute("SELECT pin_id, pin FROM page_pins").fetchall()}
                counted = con.execute("SELECT count(*) FROM usage_buckets").fetchone()[0]  # type: ignore[index]
                claims = con.execute("SELECT count(*) FROM context_nonce_claims").fetchone()[0]  # type: ignore[index]
                audited = con.execute(
                    "SELECT count(*) FROM audit WHERE operation = 'engram_memory_search'").fetchone()[0]  # type: ignore[index]
            assert counted > 0 and claims > 0 and audited >= 4  # the tables the calls wrote, read below
            # Control: the rows are the pins, and what they seal is exactly what must not be readable:
            # the forgotten words' keyed hashes, each held by one record, and the query's digest.
            for cursor, request_digest in zip(cursors, digests, strict=True):
                ref = _pin_ref(cursor)
                pin = open_pin(ref, rows[ref.pin_id])
                assert pin is not None and pin.binding.request_digest == request_digest
                assert pin.lexical_stats is not None
                assert {t: pin.lexical_stats.df[t] for t in forgotten} == dict.fromkeys(forgotten, 1)
            pins_sealed = list(rows.values())
            dump_before = pg_cluster.pg_dump(pg_database)  # a dump taken while the pins live

            # Forget on A; rotate and retire at once: the record's key destroyed and its KEK gone.
            a.call("forget", {"record_id": rid, "idempotency_key": "forget-pins-0001", "reason_ref": "r:x"},
                   grant=True)
            rotated = json.loads(a.admin.RotateKeys(admin_pb2.ScopeRequest(), metadata=_operator(a), timeout=60).json)
            retired = json.loads(a.admin.RetireKeys(admin_pb2.RetireKeysRequest(now=True), metadata=_operator(a),
                                                    timeout=60).json)
            assert retired["retired_keks"] and rotated["active_kek"] not in retired["retired_keks"]
            for c in (a, b):
                assert rid not in _ids(c.search(f"{w1} {w2} kittiwake runbook", limit=1))
            with pg_database.connect() as con:
                con.execute("CHECKPOINT")
                con.execute("SELECT pg_switch_wal()")
            heap = _files(pg_cluster.database_dir(pg_database))
            wal = _files(pg_cluster.data / "pg_wal") + wal_stream(sorted((pg_cluster.data / "pg_wal").glob("0*")))
            dump_after = pg_cluster.pg_dump(pg_database)
            for c in (a, b):
                c.channel.close()
    finally:
        _drop_slot(pg_database, slot)

    hashes = forgotten | set(hasher.terms(text)) | {t for q in queries for t in hasher.query_terms(q)}
    needles: dict[str, bytes] = {"word 1": w1.encode(), "word 2": w2.encode()}
    for n, request_digest in enumerate(digests):
        needles[f"query {n}"] = list(queries)[n].encode()
        needles[f"query digest {n}"] = request_digest.split(":", 1)[1].encode()
        needles[f"query digest {n} raw"] = bytes.fromhex(request_digest.split(":", 1)[1])
    for n, t in enumerate(sorted(hashes)):
        needles[f"term hash {n} decimal"] = str(t).encode()  # a pin's JSON held them so
        needles[f"term hash {n} le"] = struct.pack("<q", t)
        needles[f"term hash {n} be"] = struct.pack(">q", t)
    for place, haystack in (("heap", heap), ("WAL", wal), ("dump before", dump_before), ("dump after", dump_after)):
        assert _found(haystack, needles) == [], place
    # Positive controls: the sealed pins are where the plain ones were found before.
    assert all(sealed in wal for sealed in pins_sealed)
    assert all(sealed.hex().encode() in dump_before for sealed in pins_sealed)


def test_a_shared_pin_is_sealed_under_the_key_its_cursor_carries(tmp_path: Path, pg_database: Database) -> None:
    """The row alone is ciphertext; another core opens it with the reference; a reference without
    the key, with another key, or a row changed or moved finds no pin (the caller's STALE_PAGE)."""
    target = PostgresTarget(tmp_path, pg_database)
    try:
        a, b = target.open(), target.open()
        now = 1_800_000_000_000
        term = -4_611_686_018_427_387_903
        pin = Pin(binding=Binding("user:ana", T, W, "sha256:" + "c" * 64, "sha256:prof"), system_as_of=7,
                  valid_as_of=8, candidate_count=2, created_ms=now, lexical_stats=LexicalStats(3, 2.5, {term: 1}),
                  best_bm25=1.5, ordered=[("mem_a", 0.9, 5)])
        pins_a, pins_b = a.page_pins(lambda: now), b.page_pins(lambda: now)
        token, other = pins_a.put(pin), pins_a.put(pin)
        ref = PinRef.parse(token)
        assert ref is not None and pins_b.get(token) == pin  # another core pages it
        with pg_database.connect() as con:
            stored = {r[0]: bytes(r[1]) for r in con.execute("SELECT pin_id, pin FROM page_pins").fetchall()}
        plain = pin_to_json(pin)
        assert plain not in stored[ref.pin_id] and str(term).encode() not in stored[ref.pin_id]
        assert b"request_digest" not in stored[ref.pin_id] and b"c" * 64 not in stored[ref.pin_id]
        wrong = PinRef(ref.pin_id, secrets.token_bytes(32)).token()
        for pins in (pins_a, pins_b):  # this core's memory and the database answer alike
            assert pins.get(ref.pin_id) is None  # no key: a cursor of the format before
            assert pins.get(wrong) is None
            assert pins.get(ref.pin_id + ".short") is None
        other_ref = PinRef.parse(other)
        assert other_ref is not None
        with pg_database.connect() as con:  # the other pin's row moved onto this one's id
            con.execute("UPDATE page_pins SET pin = %s WHERE pin_id = %s", [stored[other_ref.pin_id], ref.pin_id])
        assert b.page_pins(lambda: now).get(token) is None
        with pg_database.connect() as con:  # one bit of the sealed row changed
            changed = bytearray(stored[ref.pin_id])
            changed[-1] ^= 1
            con.execute("UPDATE page_pins SET pin = %s WHERE pin_id = %s", [bytes(changed), ref.pin_id])
        assert b.page_pins(lambda: now).get(token) is None
        assert b.page_pins(lambda: now).get(other) == pin
    finally:
        target.close_all()
