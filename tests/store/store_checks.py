"""The store contract, executable: one check per guarantee of ``engram_core/store/engine.py``
and ``port.py``, each run on every engine (test_store_conformance.py) and, for the guarantees a
careless engine breaks, shown to fail on a deliberately broken one (test_store_broken_engines.py).

A check takes a target (store_targets.py), opens stores on it, and asserts. Racing writers are
threads over one store and, where the engine allows several writers, threads over several
stores of one database and processes of their own.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pg_cluster import wait_until

from engram_core.errors import Code, EngramError
from engram_core.services.maintenance import check_audit, check_journal
from engram_core.store.chain import scope_chain
from engram_core.store.engine import TxEffects
from engram_core.store.page_pins import Binding, Pin
from engram_core.store.port import (
    AuditRow,
    CandidateRow,
    ContextClaim,
    HostKeyRow,
    IdempotencyRow,
    LexicalStats,
    RecordRow,
)

T, W = "acme", "alpha"
OTHER = ("globex", "beta")
WEIGHTS = {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5}


# -- small builders ---------------------------------------------------------------------------------------
def event(tx: Any, target: str, *, tenant: str = T, workspace: str = W, at_ms: int = 1) -> int:
    return tx.append_event(tenant, workspace, event_id=f"evt_{target}", operation="capture", target=target,
                           from_state="", to_state="pending", at_ms=at_ms, body={"n": target}).cursor


def audit_row(n: int, *, tenant: str = T, workspace: str = W) -> AuditRow:
    return AuditRow(at_ms=1_800_000_000_000 + n, audit_id=f"aud_conformance_{n:06d}", tenant=tenant,
                    workspace=workspace, principal="user:ana", agent_id="agent", operation="engram_memory_search",
                    outcome="ok", target_digest="", decisions=[])


def candidate(cid: str, *, tenant: str = T, workspace: str = W, cursor: int = 1) -> CandidateRow:
    return CandidateRow(candidate_id=cid, tenant=tenant, workspace=workspace, principal="user:ana", agent_id="agent",
                        session="s1", state="pending", payload_digest="sha256:" + "a" * 64,
                        record_digest="sha256:" + "b" * 64, trust_class="asserted", facts={"n": 1},
                        sealed_envelope=b"\x01sealed", captured_at_ms=1, cursor=cursor)


def record(store: Any, rid: str, *, tenant: str = T, workspace: str = W, payload: str = "c",
           valid_t: int = 1) -> RecordRow:
    slot, _ = store.vault.new_data_key(f"record:{rid}")
    return RecordRow(record_id=rid, tenant=tenant, workspace=workspace, candidate_id="cand_" + rid,
                     record_digest="sha256:" + "d" * 64, payload_digest="sha256:" + payload * 64,
                     state="accepted_current", trust_class="asserted", principal="user:ana", agent_id="agent",
                     valid_t=valid_t, valid_t_end=None, expires_at_ms=None, derivative_rule="make-ineligible",
                     accepted_at_ms=1, accepted_cursor=1, state_cursor=1, successor_id=None, sealed_body=b"\x02body",
                     key_slot=slot)


def admit(store: Any, rid: str, terms: list[int], **kw: Any) -> None:
    """A record with its sealed projection, in one write transaction (as an admission writes it)."""
    row = record(store, rid, **kw)
    with store.write() as tx:
        tx.insert_record(row)
        tx.put_data_key(f"record:{rid}", row.key_slot, 1)
        tx.index_record(row.tenant, row.workspace, rid, {"primary": Counter(terms)})


def admit_row(store: Any, row: RecordRow, terms: list[int]) -> None:
    with store.write() as tx:
        tx.insert_record(row)
        tx.put_data_key(f"record:{row.record_id}", row.key_slot, 1)
        tx.index_record(row.tenant, row.workspace, row.record_id, {"primary": Counter(terms)})


def admit_journaled(store: Any, rid: str, terms: list[int], *, event_id: str, at_ms: int = 2) -> None:
    """A record captured, admitted and journaled as the services do it: its capture event, the
    record with its projection, then the admission event naming it (which a catch-up follows)."""
    with store.write() as tx:
        event(tx, rid)
    admit(store, rid, terms)
    with store.write() as tx:
        tx.append_event(T, W, event_id=event_id, operation="admit", target=rid, from_state="",
                        to_state="accepted_current", at_ms=at_ms, body={"record_id": rid})


def search(store: Any, terms: list[int], *, tenant: str = T, workspace: str = W) -> list[str]:
    with store.read(snapshot=False) as tx:
        stats = tx.lexical_stats(tenant, workspace, terms)
        page = tx.rank_lexical(tenant, workspace, stats, WEIGHTS, k1=1.2, b=0.75, now_ms=10, half_life_ms=1000,
                               lexical_weight=0.85, max_accepted_cursor=2**62, best_bm25=None, after=None, limit=50)
    return [r[0] for r in page.rows]


def race(workers: list[Callable[[], None]]) -> list[BaseException]:
    """Run every worker at once (behind a barrier); the exceptions they raised."""
    barrier = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            barrier.wait(30)
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the check
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def writers(target: Any, store: Any, n: int) -> list[Any]:
    """``n`` stores to write through: ``store`` itself, and more over the same database where the
    engine allows several writers (each a core of its own)."""
    if not target.several_writers:
        return [store] * n
    return [store] + [target.open() for _ in range(n - 1)]


# -- the checks ---------------------------------------------------------------------------------------------
def check_journal_cursors_stay_dense_under_racing_writers(target: Any) -> None:
    store = target.open()
    stores = writers(target, store, 4)

    def appends(k: int) -> Callable[[], None]:
        def go() -> None:
            for n in range(25):
                with stores[k].write(batched=bool(n % 2)) as tx:
                    event(tx, f"w{k}-{n}")
        return go

    assert race([appends(k) for k in range(4)]) == []
    with store.read() as tx:
        scope = tx.scope(T, W)
        events = tx.events(T, W, 0, None)
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
        assert [e.target for e in tx.events(T, W, 0, None)] == ["first", "second", "third"]


def check_an_idempotency_key_is_any_text_nul_included(target: Any) -> None:
    """SPEC §4: a key is 16-256 bytes of NFC text, a NUL as good as any character (PostgreSQL's
    text holds none: its engine stores such a key in a form of its own, one to one)."""
    store = target.open()
    keys = ["key-with-\x00-nul-inside", "key-with-\x00-nul-other", "\x01engram-hex:6b6579", "key-plain-0000001"]
    rows = {k: IdempotencyRow("engram_memory_capture", f"cand_{n}", "sha256:" + str(n) * 64, {"n": n})
            for n, k in enumerate(keys)}
    with store.write() as tx:
        for k, row in rows.items():
            tx.idempotency_put(T, W, "user:ana", k, row, 1)
    with store.read() as tx:
        assert {k: tx.idempotency_get(T, W, "user:ana", k) for k in keys} == rows
        assert tx.idempotency_get(T, W, "user:ana", "key-with-\x00-nul-absent") is None


def check_one_effect_per_idempotency_key_under_racing_writers(target: Any) -> None:
    store = target.open()
    stores = writers(target, store, 6)
    effects: list[str] = []
    row = IdempotencyRow("engram_memory_capture", "cand_x", "sha256:" + "0" * 64, {"status": "committed_pending"})

    def attempt(k: int) -> Callable[[], None]:
        def go() -> None:
            with stores[k].write(batched=True) as tx:
                if tx.idempotency_get(T, W, "user:ana", "key-raced-0001") is not None:
                    return  # a replay: no second effect
                event(tx, f"effect-{k}")
                tx.idempotency_put(T, W, "user:ana", "key-raced-0001", row, 1)
            effects.append(f"effect-{k}")
        return go

    assert race([attempt(k) for k in range(6)]) == []
    with store.read() as tx:
        events = tx.events(T, W, 0, None)
        assert tx.idempotency_get(T, W, "user:ana", "key-raced-0001") == row
    assert len(effects) == 1 and [e.target for e in events] == effects


def check_a_key_written_is_found_again_after_reopening(target: Any) -> None:
    """Negative-lookup caches only ever save a read: every key, grant and payload written is found
    by a store opened afterwards (and by the same one)."""
    store = target.open()
    row = IdempotencyRow("engram_memory_forget", "mem_x", "sha256:" + "1" * 64, {"receipt": {}})
    with store.write() as tx:
        for i in range(20):
            tx.idempotency_put(T, W, "user:ana", f"key-reopened-{i:04d}", row, 1)
        assert tx.use_confirmation("grant-reopened", T, W, 1)
        tx.add_tombstone(T, W, "sha256:" + "e" * 64, "mem_gone", 1, 1)
    with store.read() as tx:
        assert all(tx.idempotency_get(T, W, "user:ana", f"key-reopened-{i:04d}") == row for i in range(20))
    store = target.reopen(store)
    with store.write() as tx:
        assert all(tx.idempotency_get(T, W, "user:ana", f"key-reopened-{i:04d}") == row for i in range(20))
        assert not tx.use_confirmation("grant-reopened", T, W, 2)
        assert tx.payload_standing(T, W, "sha256:" + "e" * 64) == (None, True)
        assert tx.idempotency_get(T, W, "user:ana", "key-never-written") is None


def check_a_grant_is_used_once_under_racing_writers(target: Any) -> None:
    store = target.open()
    stores = writers(target, store, 6)
    won: list[int] = []

    def use(k: int) -> Callable[[], None]:
        def go() -> None:
            with stores[k].write(batched=True) as tx:
                if tx.use_confirmation("grant-raced", T, W, 1):
                    won.append(k)
        return go

    assert race([use(k) for k in range(6)]) == []
    assert len(won) == 1


def check_rows_of_another_scope_are_unknown(target: Any) -> None:
    store = target.open()
    rec = record(store, "mem_scoped")
    with store.write() as tx:
        event(tx, "c-scoped")
        tx.insert_candidate(candidate("cand_scoped"))
        tx.insert_record(rec)
    with store.read() as tx:
        assert tx.candidate(T, W, "cand_scoped") is not None and tx.record(T, W, "mem_scoped") is not None
        assert tx.candidate(*OTHER, "cand_scoped") is None and tx.record(*OTHER, "mem_scoped") is None
        assert tx.records(*OTHER, ["mem_scoped"]) == {} and tx.scope_records(*OTHER) == []
    with store.read(snapshot=False) as tx:
        assert tx.record(*OTHER, "mem_scoped") is None


def check_a_snapshot_sees_one_state_and_a_latest_read_sees_each_commit(target: Any) -> None:
    store = target.open()
    with store.write() as tx:
        event(tx, "before")
    with store.read() as snap:
        assert [e.target for e in snap.events(T, W, 0, None)] == ["before"]
        done = threading.Event()

        def commit_later() -> None:
            with store.write() as tx:
                event(tx, "after")
            done.set()

        t = threading.Thread(target=commit_later)
        t.start()
        assert done.wait(30)
        t.join()
        assert [e.target for e in snap.events(T, W, 0, None)] == ["before"]  # still its own state
    with store.read(snapshot=False) as latest:
        assert [e.target for e in latest.events(T, W, 0, None)] == ["before", "after"]


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
        assert tx.events(T, W, 0, None) == [] and tx.candidate(T, W, "cand_doomed_False") is None
        assert tx.candidate(T, W, "cand_doomed_True") is None
        assert tx.audit_rows(None, None, 0, None) == []
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
        assert tx.unindex_record(T, W, "mem_forgotten") == 2
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
    assert search(store, [12]) == ["mem_kept"] and search(store, [11], tenant=OTHER[0], workspace=OTHER[1]) == []


def check_a_state_change_shows_in_search_after_its_commit(target: Any) -> None:
    store = target.open()
    admit(store, "mem_state", [21])
    assert search(store, [21]) == ["mem_state"]
    with store.write() as tx:
        tx.set_record_state("mem_state", "historical", state_cursor=2)
        assert search(store, [21]) == ["mem_state"]  # not before its commit
    assert search(store, [21]) == []
    with store.read(snapshot=False) as tx:
        assert tx.record(T, W, "mem_state").state == "historical"  # type: ignore[union-attr]


def check_audit_chains_stay_dense_under_racing_writers_and_readers(target: Any) -> None:
    store = target.open()
    stores = writers(target, store, 3)

    def mutations(k: int) -> Callable[[], None]:
        def go() -> None:
            for n in range(15):
                with stores[k].write(batched=True) as tx:
                    event(tx, f"a{k}-{n}", tenant=T if n % 2 else OTHER[0], workspace=W if n % 2 else OTHER[1])
                    tx.append_audit(audit_row(1000 * k + n, tenant=T if n % 2 else OTHER[0],
                                              workspace=W if n % 2 else OTHER[1]))
        return go

    def reads(k: int) -> Callable[[], None]:
        def go() -> None:
            for n in range(40):
                stores[k].append_audit(audit_row(100_000 + 1000 * k + n))
        return go

    assert race([mutations(k) for k in range(3)] + [reads(k) for k in range(3)]) == []
    with store.read() as tx:
        rows = tx.audit_rows(None, None, 0, None)
        heads = tx.audit_heads()
    assert len(rows) == 3 * 15 + 3 * 40
    assert check_audit(rows, heads) == []
    per_chain = Counter(r["chain"] for r in rows)
    assert per_chain[scope_chain(T, W)] + per_chain[scope_chain(*OTHER)] == 45
    assert {c for c in per_chain if c.startswith("writer:")} == {s.writer_chain for s in set(stores)}


def check_spooled_rows_moved_twice_are_stored_once(target: Any) -> None:
    store = target.open()
    for n in range(3):
        store.append_audit(audit_row(n))
    with store.read() as tx:
        rows = tx.audit_rows(None, None, 0, None)
    # The same documents again, as a move that a crash cut short repeats.
    with store.engine.write(effects=TxEffects(spooled_audit=rows)):
        pass
    with store.read() as tx:
        assert tx.audit_rows(None, None, 0, None) == rows


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
        tx.add_record_links(T, W, "mem_fam_a", family_refs=["fam:queue"], primary_kind="decision", source_ids=[])
        tx.add_record_links(T, W, "mem_fam_b", family_refs=["fam:queue", "fam:other"], primary_kind="decision",
                            source_ids=["mem_fam_a"])
        tx.add_tombstone(T, W, "sha256:" + "3" * 64, "mem_fam_c", 1, 1)
    with store.read() as tx:
        assert tx.payload_standing(T, W, a.payload_digest) == ("mem_fam_a", False)
        assert tx.payload_standing(T, W, "sha256:" + "3" * 64) == (None, True)
        assert tx.payload_standing(*OTHER, a.payload_digest) == (None, False)
        members = tx.family_members(T, W, ["fam:queue"], ("accepted_current",))
        assert [(m[0].record_id, m[1], m[2]) for m in members] == [
            ("mem_fam_a", "decision", ["fam:queue"]), ("mem_fam_b", "decision", ["fam:queue"])]
        assert [r.record_id for r in tx.derivatives(T, W, "mem_fam_a")] == ["mem_fam_b"]
        assert tx.family_members(*OTHER, ["fam:queue"], ("accepted_current",)) == []
    with store.write() as tx:
        tx.drop_record_links("mem_fam_b")
    with store.read() as tx:
        assert [m[0].record_id for m in tx.family_members(T, W, ["fam:queue"], ("accepted_current",))] == ["mem_fam_a"]
        assert tx.derivatives(T, W, "mem_fam_a") == []


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
        scrubbed, kept = tx.candidate(T, W, "cand_scrub"), tx.candidate(T, W, "cand_kept")
    assert scrubbed is not None and kept is not None
    assert (scrubbed.facts, scrubbed.state, scrubbed.sealed_envelope) == ({}, "withdrawn", None)
    assert (scrubbed.payload_digest, scrubbed.trust_class, scrubbed.cursor) == ("sha256:" + "a" * 64, "asserted", 1)
    assert kept.facts == {"n": 1} and kept.state == "pending"


def check_a_second_process_writes_safely_or_is_fenced_off(target: Any) -> None:
    """An engine of one writer refuses a second process (FENCE_LOST) while a store is open; an
    engine of several lets both write, and cursors stay dense."""
    store = target.open()
    with store.write() as tx:
        event(tx, "main-0")
    body = """
        for n in range(20):
            with store.write() as tx:
                tx.append_event("acme", "alpha", event_id=f"evt_proc_{n}", operation="capture", target=f"proc-{n}",
                                from_state="", to_state="pending", at_ms=1, body={})
        print("wrote")
    """
    if not target.several_writers:
        done = target.run_process(body)
        assert done.returncode != 0 and "FENCE_LOST" in done.stderr, done.stderr[-2000:]
        target.close(store)
        done = target.run_process(body)  # once the first has closed, the second may open
        assert done.returncode == 0 and "wrote" in done.stdout, done.stderr[-2000:]
        store = target.open()
        with store.read() as tx:
            assert [e.cursor for e in tx.events(T, W, 0, None)] == list(range(1, 22))
        return
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.setdefault("done", target.run_process(body)))
    t.start()
    for n in range(1, 21):
        with store.write() as tx:
            event(tx, f"main-{n}")
    t.join(180)
    assert result["done"].returncode == 0, result["done"].stderr[-2000:]
    with store.read() as tx:
        scope = tx.scope(T, W)
        events = tx.events(T, W, 0, None)
    assert [e.cursor for e in events] == list(range(1, 42)) and check_journal(scope, events) == []  # type: ignore[arg-type]


def check_records_keep_their_capture_session_and_instant(target: Any) -> None:
    """A record's capture session and instant (DuckDB migration 12, PostgreSQL 3) are stored as
    written, absent ones as absent, and read back by every read of a record."""
    store = target.open()
    live = replace(record(store, "mem_live"), session="sess_1", captured_at_ms=1_800_000_000_123)
    old = record(store, "mem_old", payload="e")
    for row in (live, old):
        admit_row(store, row, [1])
    store = target.reopen(store)
    with store.read() as tx:
        rows = tx.records(T, W, ["mem_live", "mem_old"])
        scoped = {r.record_id: r for r in tx.scope_records(T, W)}
    assert (rows["mem_live"].session, rows["mem_live"].captured_at_ms) == ("sess_1", 1_800_000_000_123)
    assert (rows["mem_old"].session, rows["mem_old"].captured_at_ms) == (None, None)
    assert scoped == rows


def check_audit_rows_keep_the_context_nonce_their_call_claimed(target: Any) -> None:
    """The nonce a call claimed is in its audit row's digest and read back by time (a restarted
    core refuses the context: context_nonces.py); rows that claimed none have no such field."""
    store = target.open()
    with store.write() as tx:
        event(tx, "nonce-1")
        tx.append_audit(replace(audit_row(1), context_nonce="k1:lane0:n1"))
    store.append_audit(replace(audit_row(2), context_nonce="k1:lane0:n2"))
    store.append_audit(audit_row(3))
    store = target.reopen(store)
    found = sorted(store.recent_context_nonces(1_800_000_000_000))
    assert found == [("k1:lane0:n1", 1_800_000_000_001), ("k1:lane0:n2", 1_800_000_000_002)]
    assert store.recent_context_nonces(1_800_000_000_002) == [("k1:lane0:n2", 1_800_000_000_002)]
    with store.read() as tx:
        rows = tx.audit_rows(None, None, 0, None)
        heads = tx.audit_heads()
    assert check_audit(rows, heads) == []
    assert sorted(r.get("context_nonce", "") for r in rows) == ["", "k1:lane0:n1", "k1:lane0:n2"]


def check_what_cores_share_is_shared(target: Any) -> None:
    """Nonce claims, page pins and usage counters: one core's are every core's where several
    share the database; a sole writer keeps them in its memory (its claims always succeed: its
    process's ledger is exact)."""
    now = [1_800_000_000_000]
    a = target.open()
    b = target.open() if target.several_writers else a
    assert a.claim_context_nonce("k1:lane0:shared", now[0] + 60_000)
    assert b.claim_context_nonce("k1:lane0:shared", now[0] + 60_000) is not target.several_writers
    pin = Pin(binding=Binding("user:ana", T, W, "sha256:req", "sha256:prof"), system_as_of=7, valid_as_of=8,
              candidate_count=2, created_ms=now[0], lexical_stats=LexicalStats(3, 2.5, {11: 2}), best_bm25=1.5,
              window=(1, 2), ordered=[("mem_a", 0.9, 5)])
    pins_a = a.page_pins(lambda: now[0])
    pins_b = b.page_pins(lambda: now[0]) if target.several_writers else pins_a  # another core's
    pin_id = pins_a.put(pin)
    assert pins_b.get(pin_id) == pin
    counters_a = a.usage_counters(lambda: now[0])
    counters_b = b.usage_counters(lambda: now[0]) if target.several_writers else counters_a
    counters_a.add(T, W, "user:ana", "searches", 2)
    counters_b.add(T, W, "user:ana", "searches", 1)
    # A core reads its own adds at once, another core's within FLUSH_AFTER_S (they ride on that
    # core's next read of the counts, or are sent on their own by then).
    assert counters_a.usage(T, W, "user:ana")["principal"]["minute"]["searches"] >= 2  # type: ignore[index]
    assert wait_until(lambda: counters_b.usage(T, W, "user:ana")["scope"]["hour"]["searches"] == 3, 5)  # type: ignore[index]
    assert wait_until(lambda: counters_a.usage(T, W, "user:ana")["principal"]["minute"]["searches"] == 3, 5)  # type: ignore[index]
    now[0] += 61 * 60_000  # past the longest window
    assert counters_a.usage(T, W, "user:ana")["principal"]["hour"]["searches"] == 0  # type: ignore[index]


class _Abandoned(Exception):
    """Raised inside a write transaction to roll it back."""


def check_the_trust_version_moves_with_every_host_key_change(target: Any) -> None:
    """``Store.host_keys_version``: where several cores share the store, every change to the
    trusted host keys (a key stored, re-bound or removed, by any core) moves it in its own
    transaction, one that changes nothing leaves it, and a context's claim reads it in the same
    statement; a sole writer has none (its copy of the keys is exact) and claims without a query."""
    expires = 1_800_000_060_000
    a = target.open()
    if not target.several_writers:
        assert a.host_keys_version() is None
        assert a.claim_context("k1:lane0:trust", expires) == ContextClaim(claimed=True, host_keys_version=None)
        return
    b = target.open()
    seen = [b.host_keys_version()]

    def moved() -> bool:
        now = b.host_keys_version()
        assert now is not None and now >= seen[-1]
        seen.append(now)
        return seen[-1] > seen[-2]

    with a.write() as tx:
        tx.add_trusted_host_key("hk_new", "PEM-new", 5)
    assert moved()
    with a.write() as tx:
        tx.add_trusted_host_key("hk_new", "PEM-new", 6)  # stored already: nothing changes
    assert not moved()
    with a.write() as tx:
        tx.bind_trusted_host_key(HostKeyRow("hk_new", "PEM-new", 5, ("acme",), False, ()))
    assert moved()
    claim = b.claim_context("k1:lane0:trust", expires)
    assert claim == ContextClaim(claimed=True, host_keys_version=seen[-1])
    with a.write() as tx:
        assert tx.remove_trusted_host_key("hk_new")
    assert moved()
    with a.write() as tx:
        assert not tx.remove_trusted_host_key("hk_new")
    assert not moved()
    assert b.claim_context("k1:lane0:trust", expires) == ContextClaim(claimed=False, host_keys_version=seen[-1])
    try:
        with a.write() as tx:
            tx.add_trusted_host_key("hk_gone", "PEM-gone", 7)
            raise _Abandoned
    except _Abandoned:
        pass
    assert not moved()  # a change rolled back moves nothing


def check_a_job_lease_has_one_holder_at_a_time(target: Any) -> None:
    """``Store.leader_lease``: a sole writer holds every lease; where several cores share the
    store, one core holds a job's lease at a time and keeps it from tick to tick, another job's
    lease is independent, and a core that closes gives its leases up to the next core that asks."""
    a = target.open()
    for _ in range(2):
        with a.leader_lease("key-ring") as held:
            assert held
    if not target.several_writers:
        return
    b = target.open()
    with b.leader_lease("key-ring") as held:
        assert not held
    with b.leader_lease("another-job") as held:
        assert held
    with a.leader_lease("another-job") as held:
        assert not held
    with a.leader_lease("key-ring") as held:
        assert held  # still a's
    target.close(a)
    with b.leader_lease("key-ring") as held:
        assert held


def check_a_read_sees_what_another_core_committed(target: Any) -> None:
    """Read-your-writes across cores: a core's committed scope row is read from the database and its
    search index caught up to that head, so a record another core admitted (or forgot) shows (or
    no longer shows) in this core's search once that core's commit returned."""
    if not target.several_writers:
        return  # one writer: its own commits publish to its index (check_committed_projections...)
    a, b = target.open(), target.open()
    search(a, [5])  # a's index built before b writes
    admit_journaled(b, "mem_other", [5, 6], event_id="evt_adm")
    assert a.committed_scope(T, W) is not None
    assert search(a, [5]) == ["mem_other"]
    with b.write() as tx:
        tx.unindex_record(T, W, "mem_other")
        tx.set_record_state("mem_other", "forgotten", state_cursor=4, drop_body=True)
        tx.append_event(T, W, event_id="evt_fgt", operation="forget", target="mem_other",
                        from_state="accepted_current", to_state="forgotten", at_ms=3, body={})
    assert a.committed_scope(T, W) is not None
    assert search(a, [5]) == []


def check_latest_scope_is_the_row_any_core_committed(target: Any) -> None:
    """``latest_scope``: the row as last committed by any core (a write's authorization reads
    the revocation epoch from it), without the index caught up; a core that then commits a
    write of its own still finds the other core's record at its next read (its index is not
    marked current past the events it skipped)."""
    a = target.open()
    b = target.open() if target.several_writers else a
    search(a, [5])
    admit_journaled(b, "mem_other", [5, 6], event_id="evt_adm")
    with b.write() as tx:
        epoch = tx.bump_epoch(T, W)
        head = tx.scope(T, W).last_cursor
    seen = a.latest_scope(T, W)
    assert seen is not None and seen.authorization_epoch == epoch and seen.last_cursor == head
    admit_journaled(a, "mem_own", [5], event_id="evt_adm_own", at_ms=3)  # a's index still behind b's events
    row = a.committed_scope(T, W)
    assert row is not None and row.authorization_epoch == epoch and row.last_cursor == head + 2
    assert sorted(search(a, [5])) == ["mem_other", "mem_own"]
    assert a.latest_scope("nobody", "nowhere") is None


def check_changes_since_a_cursor_name_the_records_they_touched(target: Any) -> None:
    """``Engine.changes_since``: the scope row, the journal after the cursor, and the rows and
    sealed projections of the records those events name (a record target, an admission's
    ``record_id``), none of another scope's; nothing after the head: the row alone."""
    store = target.open()
    admit(store, "mem_one", [5])
    with store.write() as tx:
        first = event(tx, "cand_one")
        tx.append_event(T, W, event_id="evt_adm", operation="admit", target="cand_one", from_state="pending",
                        to_state="accepted", at_ms=2, body={"record_id": "mem_one"})
        event(tx, "mem_gone")  # names a record that does not exist: no row
        event(tx, "cand_other", tenant=OTHER[0], workspace=OTHER[1])
    found = store.engine.changes_since(T, W, first - 1)
    assert found.row is not None and found.row.last_cursor == first + 2
    assert [e.cursor for e in found.events] == [first, first + 1, first + 2]
    assert set(found.rows) == {"mem_one"} and found.rows["mem_one"].tenant == T
    assert set(found.blobs) == {"mem_one"} and isinstance(found.blobs["mem_one"], bytes)
    # An engine that holds the key vault's rows reads the records' wrapped keys with them; the
    # vault opens them as it opens its own reads.
    slot = found.rows["mem_one"].key_slot
    assert set(found.keys) == ({slot} if target.name == "postgresql" else set())
    if found.keys:
        assert store.vault.data_keys([(slot, "record:mem_one")], stored=found.keys) == \
            {slot: store.vault.data_key(slot, "record:mem_one")}
    later = store.engine.changes_since(T, W, first + 1)
    assert [e.target for e in later.events] == ["mem_gone"] and later.rows == {} and later.blobs == {} \
        and later.keys == {}
    quiet = store.engine.changes_since(T, W, first + 2)
    assert quiet.row == found.row and quiet.events == [] and quiet.rows == {}
    assert store.engine.changes_since("nobody", "nowhere", 0).row is None


CHECKS: list[Callable[[Any], None]] = [
    check_journal_cursors_stay_dense_under_racing_writers,
    check_the_scope_head_is_read_from_storage_not_remembered,
    check_one_effect_per_idempotency_key_under_racing_writers,
    check_an_idempotency_key_is_any_text_nul_included,
    check_a_key_written_is_found_again_after_reopening,
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
    check_a_second_process_writes_safely_or_is_fenced_off,
    check_records_keep_their_capture_session_and_instant,
    check_audit_rows_keep_the_context_nonce_their_call_claimed,
    check_what_cores_share_is_shared,
    check_the_trust_version_moves_with_every_host_key_change,
    check_a_job_lease_has_one_holder_at_a_time,
    check_a_read_sees_what_another_core_committed,
    check_latest_scope_is_the_row_any_core_committed,
    check_changes_since_a_cursor_name_the_records_they_touched,
]
