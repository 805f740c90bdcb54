"""The checks of what a store's cores and processes see of one another: a second process, what
cores share (nonce claims, pins, usage, the trust version, leases), reads across cores, and
``Engine.changes_since``; and the rows a reopened store keeps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.store.chain import check_audit
from engram_core.store.conformance.support import (
    OTHER,
    T,
    W,
    admit,
    admit_journaled,
    admit_row,
    audit_row,
    check_journal,
    event,
    record,
    search,
    wait_until,
)
from engram_core.store.page_pins import Binding, Pin
from engram_core.store.port import (
    ContextClaim,
    HostKeyRow,
    LexicalStats,
)


def check_a_second_process_writes_safely_or_is_fenced_off(target: Any) -> None:
    """An engine of one writer refuses a second process (FENCE_LOST) while a store is open; an
    engine of several lets both write, and cursors stay dense. An engine no other process can
    reach (``processes`` False: in memory) refuses a second engine on its database instead."""
    store = target.open()
    if not target.processes:
        try:
            target.open()
        except EngramError as exc:
            assert exc.code is Code.FENCE_LOST, exc
        else:
            raise AssertionError("a second store opened on a database of one writer")
        return
    with store.write() as tx:
        event(tx, "main-0")
    body = """
        from engram_core.contract.scope import Scope
        for n in range(20):
            with store.write() as tx:
                tx.append_event(Scope("acme", "alpha"), event_id=f"evt_proc_{n}", operation="capture", target=f"proc-{n}",
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
            assert [e.cursor for e in tx.events(Scope(T, W), 0, None)] == list(range(1, 22))
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
        scope = tx.scope(Scope(T, W))
        events = tx.events(Scope(T, W), 0, None)
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
        rows = tx.records(Scope(T, W), ["mem_live", "mem_old"])
        scoped = {r.record_id: r for r in tx.scope_records(Scope(T, W))}
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
        rows = tx.audit_rows(None, 0, None)
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
              candidate_count=2, created_ms=now[0], lexical_stats=LexicalStats(3, {"primary": 2.5}, {11: 2}), best_bm25=1.5,
              window=(1, 2), ordered=[("mem_a", 0.9, 5)])
    pins_a = a.page_pins(lambda: now[0])
    pins_b = b.page_pins(lambda: now[0]) if target.several_writers else pins_a  # another core's
    pin_id = pins_a.put(pin)
    assert pins_b.get(pin_id) == pin
    counters_a = a.usage_counters(lambda: now[0])
    counters_b = b.usage_counters(lambda: now[0]) if target.several_writers else counters_a
    counters_a.add(Scope(T, W), "user:ana", "searches", 2)
    counters_b.add(Scope(T, W), "user:ana", "searches", 1)
    # A core reads its own adds at once, another core's within FLUSH_AFTER_S (they ride on that
    # core's next read of the counts, or are sent on their own by then).
    assert counters_a.usage(Scope(T, W), "user:ana")["principal"]["minute"]["searches"] >= 2  # type: ignore[index]
    assert wait_until(lambda: counters_b.usage(Scope(T, W), "user:ana")["scope"]["hour"]["searches"] == 3, 5)  # type: ignore[index]
    assert wait_until(lambda: counters_a.usage(Scope(T, W), "user:ana")["principal"]["minute"]["searches"] == 3, 5)  # type: ignore[index]
    now[0] += 61 * 60_000  # past the longest window
    assert counters_a.usage(Scope(T, W), "user:ana")["principal"]["hour"]["searches"] == 0  # type: ignore[index]


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
    assert a.committed_scope(Scope(T, W)) is not None
    assert search(a, [5]) == ["mem_other"]
    with b.write() as tx:
        tx.unindex_record(Scope(T, W), "mem_other")
        tx.set_record_state("mem_other", "forgotten", state_cursor=4, drop_body=True)
        tx.append_event(Scope(T, W), event_id="evt_fgt", operation="forget", target="mem_other",
                        from_state="accepted_current", to_state="forgotten", at_ms=3, body={})
    assert a.committed_scope(Scope(T, W)) is not None
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
        epoch = tx.bump_epoch(Scope(T, W))
        head = tx.scope(Scope(T, W)).last_cursor
    seen = a.latest_scope(Scope(T, W))
    assert seen is not None and seen.authorization_epoch == epoch and seen.last_cursor == head
    admit_journaled(a, "mem_own", [5], event_id="evt_adm_own", at_ms=3)  # a's index still behind b's events
    row = a.committed_scope(Scope(T, W))
    assert row is not None and row.authorization_epoch == epoch and row.last_cursor == head + 2
    assert sorted(search(a, [5])) == ["mem_other", "mem_own"]
    assert a.latest_scope(Scope("nobody", "nowhere")) is None


def check_changes_since_a_cursor_name_the_records_they_touched(target: Any) -> None:
    """``Engine.changes_since``: the scope row, the journal after the cursor, and the rows and
    sealed projections of the records those events name (a record target, an admission's
    ``record_id``), none of another scope's; nothing after the head: the row alone."""
    store = target.open()
    admit(store, "mem_one", [5])
    with store.write() as tx:
        first = event(tx, "cand_one")
        tx.append_event(Scope(T, W), event_id="evt_adm", operation="admit", target="cand_one", from_state="pending",
                        to_state="accepted", at_ms=2, body={"record_id": "mem_one"})
        event(tx, "mem_gone")  # names a record that does not exist: no row
        event(tx, "cand_other", tenant=OTHER.tenant, workspace=OTHER.workspace)
    found = store.engine.changes_since(Scope(T, W), first - 1)
    assert found.row is not None and found.row.last_cursor == first + 2
    assert [e.cursor for e in found.events] == [first, first + 1, first + 2]
    assert set(found.rows) == {"mem_one"} and found.rows["mem_one"].tenant == T
    assert set(found.blobs) == {"mem_one"} and isinstance(found.blobs["mem_one"], bytes)
    # An engine that holds the key vault's rows reads the records' wrapped keys with them; the
    # vault opens them as it opens its own reads.
    slot = found.rows["mem_one"].key_slot
    assert set(found.keys) == ({slot} if store.capabilities.holds_key_vault else set())
    if found.keys:
        assert store.vault.data_keys([(slot, "record:mem_one")], stored=found.keys) == \
            {slot: store.vault.data_key(slot, "record:mem_one")}
    later = store.engine.changes_since(Scope(T, W), first + 1)
    assert [e.target for e in later.events] == ["mem_gone"] and later.rows == {} and later.blobs == {} \
        and later.keys == {}
    quiet = store.engine.changes_since(Scope(T, W), first + 2)
    assert quiet.row == found.row and quiet.events == [] and quiet.rows == {}
    assert store.engine.changes_since(Scope("nobody", "nowhere"), 0).row is None


CORE_CHECKS: list[Callable[[Any], None]] = [
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
