"""The checks of what one store keeps: journals, insert-if-absent keys, reads, transactions,
projections and search, audit chains, the key ledger, tombstones and links, metadata and host
keys (``engine.py``'s guarantees, one check each)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.contract.tools import CAPTURE_TOOL, FORGET_TOOL
from engram_core.store.chain import check_audit, scope_chain
from engram_core.store.conformance.support import (
    OTHER,
    T,
    W,
    admit,
    audit_row,
    candidate,
    check_journal,
    each,
    event,
    race,
    record,
    search,
    writers,
)
from engram_core.store.engine import TxEffects
from engram_core.store.port import (
    HostKeyRow,
    IdempotencyRow,
)


def check_journal_cursors_stay_dense_under_racing_writers(target: Any) -> None:
    store = target.open()

    def appends(writer: Any, k: int) -> None:
        for n in range(25):
            with writer.write(batched=bool(n % 2)) as tx:
                event(tx, f"w{k}-{n}")

    assert race(each(writers(target, store, 4), appends)) == []
    with store.read() as tx:
        scope = tx.scope(Scope(T, W))
        events = tx.events(Scope(T, W), 0, None)
    assert [e.cursor for e in events] == list(range(1, 101))
    assert scope is not None and scope.last_cursor == 100 and check_journal(scope, events) == []


def check_the_scope_head_is_read_from_storage_not_remembered(target: Any) -> None:
    """A write transaction allocates the next cursor from the head as committed, whoever committed it:
    cursors from a copy another writer moved past would repeat."""
    store = target.open()
    with store.write() as tx:
        event(tx, "first")
    with store.write() as tx:
        assert event(tx, "second") == 2
    store = target.reopen(store)
    with store.write() as tx:
        assert event(tx, "third") == 3
    with store.read() as tx:
        assert [e.target for e in tx.events(Scope(T, W), 0, None)] == ["first", "second", "third"]


def check_an_idempotency_key_is_any_text_nul_included(target: Any) -> None:
    """SPEC §4: a key is 16-256 bytes of NFC text, a NUL as good as any character (PostgreSQL's
    text holds none: its engine stores such a key in a form of its own, one to one)."""
    store = target.open()
    keys = ["key-with-\x00-nul-inside", "key-with-\x00-nul-other", "\x01engram-hex:6b6579", "key-plain-0000001"]
    rows = {k: IdempotencyRow(CAPTURE_TOOL, f"cand_{n}", "sha256:" + str(n) * 64, {"n": n})
            for n, k in enumerate(keys)}
    with store.write() as tx:
        for k, row in rows.items():
            tx.idempotency_put(Scope(T, W), "user:ana", k, row, 1)
    with store.read() as tx:
        assert {k: tx.idempotency_get(Scope(T, W), "user:ana", k) for k in keys} == rows
        assert tx.idempotency_get(Scope(T, W), "user:ana", "key-with-\x00-nul-absent") is None


def check_one_effect_per_idempotency_key_under_racing_writers(target: Any) -> None:
    store = target.open()
    effects: list[str] = []
    row = IdempotencyRow(CAPTURE_TOOL, "cand_x", "sha256:" + "0" * 64, {"status": "committed_pending"})

    def attempt(writer: Any, k: int) -> None:
        with writer.write(batched=True) as tx:
            if tx.idempotency_get(Scope(T, W), "user:ana", "key-raced-0001") is not None:
                return  # a replay: no second effect
            event(tx, f"effect-{k}")
            tx.idempotency_put(Scope(T, W), "user:ana", "key-raced-0001", row, 1)
        effects.append(f"effect-{k}")

    assert race(each(writers(target, store, 6), attempt)) == []
    with store.read() as tx:
        events = tx.events(Scope(T, W), 0, None)
        assert tx.idempotency_get(Scope(T, W), "user:ana", "key-raced-0001") == row
    assert len(effects) == 1 and [e.target for e in events] == effects


def check_a_key_written_is_found_again_after_reopening(target: Any) -> None:
    """Negative-lookup caches only ever save a read: every key, grant and payload written is found
    by a store opened afterwards (and by the same one)."""
    store = target.open()
    row = IdempotencyRow(FORGET_TOOL, "mem_x", "sha256:" + "1" * 64, {"receipt": {}})
    with store.write() as tx:
        for i in range(20):
            tx.idempotency_put(Scope(T, W), "user:ana", f"key-reopened-{i:04d}", row, 1)
        assert tx.use_confirmation("grant-reopened", Scope(T, W), 1)
        tx.add_tombstone(Scope(T, W), "sha256:" + "e" * 64, "mem_gone", 1, 1)
    with store.read() as tx:
        assert all(tx.idempotency_get(Scope(T, W), "user:ana", f"key-reopened-{i:04d}") == row for i in range(20))
    store = target.reopen(store)
    with store.write() as tx:
        assert all(tx.idempotency_get(Scope(T, W), "user:ana", f"key-reopened-{i:04d}") == row for i in range(20))
        assert not tx.use_confirmation("grant-reopened", Scope(T, W), 2)
        assert tx.payload_standing(Scope(T, W), "sha256:" + "e" * 64) == (None, True)
        assert tx.idempotency_get(Scope(T, W), "user:ana", "key-never-written") is None


def check_an_answered_batched_write_is_seen_by_every_kind_of_read(target: Any) -> None:
    """A batched write's answer is its visibility: the writer's own checks before a transaction
    (``read(snapshot=False, as_writer=True)``), a read of the latest state, a snapshot, and a
    store opened afterwards all see it, however the engine made it durable (DuckDB: a lone
    writer's batch answered from its intent log, committed later)."""
    store = target.open()
    row = IdempotencyRow(CAPTURE_TOOL, "cand_answered", "sha256:" + "2" * 64, {"status": "committed_pending"})
    keys = [f"key-answered-{i:04d}" for i in range(3)]
    for i, key in enumerate(keys):
        with store.write(batched=True) as tx:
            event(tx, f"answered-{i}")
            tx.idempotency_put(Scope(T, W), "user:ana", key, row, 1)

    def sees_all(tx: Any) -> None:
        assert [tx.idempotency_get(Scope(T, W), "user:ana", k) for k in keys] == [row] * 3
        assert [e.target for e in tx.events(Scope(T, W), 0, None)] == [f"answered-{i}" for i in range(3)]

    with store.read(snapshot=False, as_writer=True) as tx:
        sees_all(tx)
    with store.read(snapshot=False) as tx:
        sees_all(tx)
    with store.read() as tx:
        sees_all(tx)
    store = target.reopen(store)
    with store.read() as tx:
        sees_all(tx)


def check_a_grant_is_used_once_under_racing_writers(target: Any) -> None:
    store = target.open()
    won: list[int] = []

    def use(writer: Any, k: int) -> None:
        with writer.write(batched=True) as tx:
            if tx.use_confirmation("grant-raced", Scope(T, W), 1):
                won.append(k)

    assert race(each(writers(target, store, 6), use)) == []
    assert len(won) == 1


def check_rows_of_another_scope_are_unknown(target: Any) -> None:
    store = target.open()
    rec = record(store, "mem_scoped")
    with store.write() as tx:
        event(tx, "c-scoped")
        tx.insert_candidate(candidate("cand_scoped"))
        tx.insert_record(rec)
    with store.read() as tx:
        assert tx.candidate(Scope(T, W), "cand_scoped") is not None and tx.record(Scope(T, W), "mem_scoped") is not None
        assert tx.candidate(OTHER, "cand_scoped") is None and tx.record(OTHER, "mem_scoped") is None
        assert tx.records(OTHER, ["mem_scoped"]) == {} and tx.scope_records(OTHER) == []
    with store.read(snapshot=False) as tx:
        assert tx.record(OTHER, "mem_scoped") is None


def check_a_snapshot_sees_one_state_and_a_latest_read_sees_each_commit(target: Any) -> None:
    store = target.open()
    with store.write() as tx:
        event(tx, "before")
    with store.read() as snap:
        assert [e.target for e in snap.events(Scope(T, W), 0, None)] == ["before"]
        done = threading.Event()

        def commit_later() -> None:
            with store.write() as tx:
                event(tx, "after")
            done.set()

        t = threading.Thread(target=commit_later)
        t.start()
        assert done.wait(30)
        t.join()
        assert [e.target for e in snap.events(Scope(T, W), 0, None)] == ["before"]  # still its own state
    with store.read(snapshot=False) as latest:
        assert [e.target for e in latest.events(Scope(T, W), 0, None)] == ["before", "after"]


def check_a_failed_transaction_leaves_nothing(target: Any) -> None:
    store = target.open()
    for batched in (False, True):
        try:
            with store.write(batched=batched) as tx:
                event(tx, f"doomed-{batched}")
                tx.insert_candidate(candidate(f"cand_doomed_{batched}"))
                tx.append_audit(audit_row(1))
                raise EngramError(Code.POLICY_STALE, "the check changed its mind")
        except EngramError:
            pass
    with store.read() as tx:
        assert tx.events(Scope(T, W), 0, None) == [] and tx.candidate(Scope(T, W), "cand_doomed_False") is None
        assert tx.candidate(Scope(T, W), "cand_doomed_True") is None
        assert tx.audit_rows(None, 0, None) == []
    with store.write() as tx:
        assert event(tx, "next") == 1  # no cursor was spent


def check_committed_projections_are_searchable_and_a_forget_removes_them(target: Any) -> None:
    store = target.open()
    admit(store, "mem_kept", [11, 12])
    admit(store, "mem_forgotten", [11, 13])
    assert sorted(search(store, [11])) == ["mem_forgotten", "mem_kept"]
    with store.read() as tx:
        assert tx.postings_count("mem_forgotten") == 2
    with store.write() as tx:
        tx.set_record_state("mem_forgotten", "tombstoned", state_cursor=2, drop_body=True)
        assert tx.unindex_record(Scope(T, W), "mem_forgotten") == 2
        slot = tx.drop_data_key("record:mem_forgotten", 2, "tombstone")
    assert tx.keys_zeroed and slot is not None
    assert search(store, [11]) == ["mem_kept"] and search(store, [13]) == []
    with store.read() as tx:
        assert tx.projection("mem_forgotten") is None and tx.data_key_slot("record:mem_forgotten") is None
        destruction = tx.key_destruction("record:mem_forgotten")
        assert destruction is not None and destruction.generation == store.vault.active_generation()
    assert store.vault.data_key(slot, "record:mem_forgotten") is None
    store = target.reopen(store)  # and so it stays for a store opened afterwards
    assert search(store, [11]) == ["mem_kept"] and search(store, [13]) == []
    assert search(store, [12]) == ["mem_kept"] and search(store, [11], tenant=OTHER.tenant, workspace=OTHER.workspace) == []


def check_a_state_change_shows_in_search_after_its_commit(target: Any) -> None:
    store = target.open()
    admit(store, "mem_state", [21])
    assert search(store, [21]) == ["mem_state"]
    with store.write() as tx:
        tx.set_record_state("mem_state", "historical", state_cursor=2)
        assert search(store, [21]) == ["mem_state"]  # not before its commit
    assert search(store, [21]) == []
    with store.read(snapshot=False) as tx:
        assert tx.record(Scope(T, W), "mem_state").state == "historical"  # type: ignore[union-attr]


def check_audit_chains_stay_dense_under_racing_writers_and_readers(target: Any) -> None:
    store = target.open()
    stores = writers(target, store, 3)

    def mutations(writer: Any, k: int) -> None:
        for n in range(15):
            tenant, workspace = (T, W) if n % 2 else (OTHER.tenant, OTHER.workspace)
            with writer.write(batched=True) as tx:
                event(tx, f"a{k}-{n}", tenant=tenant, workspace=workspace)
                tx.append_audit(audit_row(1000 * k + n, tenant=tenant, workspace=workspace))

    def reads(writer: Any, k: int) -> None:
        for n in range(40):
            writer.append_audit(audit_row(100_000 + 1000 * k + n))

    assert race(each(stores, mutations) + each(stores, reads)) == []
    with store.read() as tx:
        rows = tx.audit_rows(None, 0, None)
        heads = tx.audit_heads()
    assert len(rows) == 3 * 15 + 3 * 40
    assert check_audit(rows, heads) == []
    per_chain = Counter(r["chain"] for r in rows)
    assert per_chain[scope_chain(T, W)] + per_chain[scope_chain(OTHER.tenant, OTHER.workspace)] == 45
    assert {c for c in per_chain if c.startswith("writer:")} == {s.writer_chain for s in set(stores)}


def check_spooled_rows_moved_twice_are_stored_once(target: Any) -> None:
    store = target.open()
    for n in range(3):
        store.append_audit(audit_row(n))
    with store.read() as tx:
        rows = tx.audit_rows(None, 0, None)
    # The same documents again, as a move that a crash cut short repeats.
    with store.engine.write(effects=TxEffects(spooled_audit=rows)):
        pass
    with store.read() as tx:
        assert tx.audit_rows(None, 0, None) == rows


def check_the_data_key_ledger(target: Any) -> None:
    store = target.open()
    slot, _ = store.vault.new_data_key("candidate:cand_keys")
    with store.write() as tx:
        tx.put_data_key("candidate:cand_keys", slot, 5)
        assert tx.data_key_slot("candidate:cand_keys") == slot
    with store.read() as tx:
        assert tx.live_key_slots() == {slot: "candidate:cand_keys"}
    with store.write() as tx:
        assert tx.drop_data_key("candidate:cand_keys", 6, "withdraw") == slot
        assert tx.drop_data_key("candidate:cand_keys", 7, "withdraw") is None  # gone already
    assert tx.key_destruction_outcome == "pending"  # the generation that wrapped it is still in the ring
    with store.read() as tx:
        assert tx.live_key_slots() == {}
        d = tx.key_destruction("candidate:cand_keys")
        assert d is not None and (d.at_ms, d.reason) == (6, "withdraw")


def check_payload_standing_tombstones_and_families(target: Any) -> None:
    store = target.open()
    a, b = record(store, "mem_fam_a", payload="1"), record(store, "mem_fam_b", payload="2")
    with store.write() as tx:
        tx.insert_record(a)
        tx.insert_record(b)
        tx.add_record_links(Scope(T, W), "mem_fam_a", family_refs=["fam:queue"], primary_kind="decision", source_ids=[])
        tx.add_record_links(Scope(T, W), "mem_fam_b", family_refs=["fam:queue", "fam:other"], primary_kind="decision",
                            source_ids=["mem_fam_a"])
        tx.add_tombstone(Scope(T, W), "sha256:" + "3" * 64, "mem_fam_c", 1, 1)
    with store.read() as tx:
        assert tx.payload_standing(Scope(T, W), a.payload_digest) == ("mem_fam_a", False)
        assert tx.payload_standing(Scope(T, W), "sha256:" + "3" * 64) == (None, True)
        assert tx.payload_standing(OTHER, a.payload_digest) == (None, False)
        members = tx.family_members(Scope(T, W), ["fam:queue"], ("accepted_current",))
        assert [(m[0].record_id, m[1], m[2]) for m in members] == [
            ("mem_fam_a", "decision", ["fam:queue"]), ("mem_fam_b", "decision", ["fam:queue"])]
        assert [r.record_id for r in tx.derivatives(Scope(T, W), "mem_fam_a")] == ["mem_fam_b"]
        assert tx.family_members(OTHER, ["fam:queue"], ("accepted_current",)) == []
    with store.write() as tx:
        tx.drop_record_links("mem_fam_b")
    with store.read() as tx:
        assert [m[0].record_id for m in tx.family_members(Scope(T, W), ["fam:queue"], ("accepted_current",))] == ["mem_fam_a"]
        assert tx.derivatives(Scope(T, W), "mem_fam_a") == []


def check_metadata_trusted_keys_and_emptiness(target: Any) -> None:
    store = target.open()
    with store.read() as tx:
        assert tx.is_empty()
    with store.write() as tx:
        tx.set_meta("conformance.a", "1")
        tx.set_meta("conformance.a", "2")
        tx.set_meta("other.b", "3")
        tx.add_trusted_host_key("hk_1", "PEM-1", 1)
        tx.add_trusted_host_key("hk_1", "PEM-1", 2)  # again: nothing changes
    with store.read() as tx:
        assert tx.is_empty()  # metadata and trusted keys do not make a store a non-restore target
        assert tx.meta("conformance.a") == "2" and tx.meta_with_prefix("conformance.") == {"conformance.a": "2"}
        assert tx.trusted_host_keys() == [("hk_1", "PEM-1")]
    with store.write() as tx:
        assert tx.remove_trusted_host_key("hk_1") and not tx.remove_trusted_host_key("hk_1")
        event(tx, "not-empty")
    with store.read() as tx:
        assert tx.trusted_host_keys() == [] and not tx.is_empty()


def check_trusted_host_key_bindings(target: Any) -> None:
    """Issue 26.3 (migration 13 on DuckDB): a key stored by ``add_trusted_host_key`` serves nothing;
    ``bind_trusted_host_key`` stores a key with its binding or replaces a stored key's binding,
    keeping its PEM and the time it was first trusted; a later ``add`` leaves a binding alone."""
    store = target.open()
    with store.write() as tx:
        tx.add_trusted_host_key("hk_plain", "PEM-plain", 5)
        tx.bind_trusted_host_key(HostKeyRow("hk_bound", "PEM-bound", 7, ("acme", "globex"), False, ("read",)))
    with store.read() as tx:
        assert tx.host_key_rows() == [HostKeyRow("hk_bound", "PEM-bound", 7, ("acme", "globex"), False, ("read",)),
                                      HostKeyRow("hk_plain", "PEM-plain", 5, (), False, ())]
    with store.write() as tx:
        tx.bind_trusted_host_key(HostKeyRow("hk_plain", "PEM-other", 9, (), True, ("maintain", "read")))
        tx.add_trusted_host_key("hk_bound", "PEM-bound", 11)  # again: its binding stays
    target.close(store)
    store = target.open()  # as stored, not as remembered
    with store.read() as tx:
        assert tx.host_key_rows() == [HostKeyRow("hk_bound", "PEM-bound", 7, ("acme", "globex"), False, ("read",)),
                                      HostKeyRow("hk_plain", "PEM-plain", 5, (), True, ("maintain", "read"))]
        assert tx.trusted_host_keys() == [("hk_bound", "PEM-bound"), ("hk_plain", "PEM-plain")]
    with store.write() as tx:
        assert tx.remove_trusted_host_key("hk_bound")
    with store.read() as tx:
        assert [row.key_id for row in tx.host_key_rows()] == ["hk_plain"]


def check_scrubbed_candidate_facts_are_empty_and_the_rest_stays(target: Any) -> None:
    """Issue 26.7: ``scrub_candidate_facts`` empties one candidate's facts, with the state change in
    the same transaction, and leaves every other column and candidate as it was."""
    store = target.open()
    with store.write() as tx:
        tx.insert_candidate(candidate("cand_scrub", cursor=1))
        tx.insert_candidate(candidate("cand_kept", cursor=2))
    with store.write() as tx:
        tx.set_candidate_state("cand_scrub", "withdrawn", drop_envelope=True)
        tx.scrub_candidate_facts("cand_scrub")
    with store.read() as tx:
        scrubbed, kept = tx.candidate(Scope(T, W), "cand_scrub"), tx.candidate(Scope(T, W), "cand_kept")
    assert scrubbed is not None and kept is not None
    assert (scrubbed.facts, scrubbed.state, scrubbed.sealed_envelope) == ({}, "withdrawn", None)
    assert (scrubbed.payload_digest, scrubbed.trust_class, scrubbed.cursor) == ("sha256:" + "a" * 64, "asserted", 1)
    assert kept.facts == {"n": 1} and kept.state == "pending"


ROW_CHECKS: list[Callable[[Any], None]] = [
    check_journal_cursors_stay_dense_under_racing_writers,
    check_the_scope_head_is_read_from_storage_not_remembered,
    check_one_effect_per_idempotency_key_under_racing_writers,
    check_an_idempotency_key_is_any_text_nul_included,
    check_a_key_written_is_found_again_after_reopening,
    check_an_answered_batched_write_is_seen_by_every_kind_of_read,
    check_a_grant_is_used_once_under_racing_writers,
    check_rows_of_another_scope_are_unknown,
    check_a_snapshot_sees_one_state_and_a_latest_read_sees_each_commit,
    check_a_failed_transaction_leaves_nothing,
    check_committed_projections_are_searchable_and_a_forget_removes_them,
    check_a_state_change_shows_in_search_after_its_commit,
    check_audit_chains_stay_dense_under_racing_writers_and_readers,
    check_spooled_rows_moved_twice_are_stored_once,
    check_the_data_key_ledger,
    check_payload_standing_tombstones_and_families,
    check_metadata_trusted_keys_and_emptiness,
    check_trusted_host_key_bindings,
    check_scrubbed_candidate_facts_are_empty_and_the_rest_stays,
]
