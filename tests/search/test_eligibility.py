"""Eligibility at read time (SPEC §5, §6): accepted_current, in scope, within valid time,
not expired (from expires_at on), and final revalidation after ranking."""

from __future__ import annotations

from engram_core.contract.errors import Code
from engram_core.contract.validation import format_instant
from tests.support.search_support import SEMANTIC, Client


def test_expires_at_exactly_now_is_ineligible(clocked) -> None:
    running, clock = clocked
    ana = Client(running, clock=clock)
    expires = clock.now_ms() + 10_000
    rid = ana.remember("The murrelet token lives ten seconds.",
                       retention={"derivative_rule": "make-ineligible", "expires_at": format_instant(expires)})
    clock.advance(expires - 1 - clock.now_ms())
    assert ana.ids("murrelet") == [rid] and ana.get(rid)["record"]["record_id"] == rid
    clock.advance(1)  # now == expires_at
    assert ana.ids("murrelet") == []
    assert ana.fails("get", {"record_id": rid, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND
    if running.core.embedder is not None:
        assert ana.ids("murrelet", capability_policy=SEMANTIC) == []


def test_valid_time_bounds(clocked) -> None:
    running, clock = clocked
    ana = Client(running, clock=clock)
    now = clock.now_ms()
    future = ana.remember("Auklet rule starts later.", t=now + 5_000,
                          primary_event={"at": now, "type_ref": "event:decision", "citation_id": "cit1"})
    ended = ana.remember("Auklet rule ended.", t=now - 10_000, valid_time={"t": now - 10_000, "t_end": now - 1})
    ends_now = ana.remember("Auklet rule ends now.", valid_time={"t": now - 10_000, "t_end": now})
    assert set(ana.ids("auklet")) == {ends_now}
    clock.advance(5_000)  # future starts (t == now is valid); ends_now has ended
    assert set(ana.ids("auklet")) == {future}
    assert ana.fails("get", {"record_id": ended, "purpose_ref": ana.purpose_ref}) == Code.NOT_FOUND


def test_out_of_scope_records_never_appear(core) -> None:
    from tests.support.search_support import activate

    activate(core, "acme", "delta")
    mine, theirs = Client(core), Client(core, workspace="delta")
    rid = theirs.remember("Guillemot secret plan for delta.")
    assert rid not in mine.ids("guillemot")
    assert rid not in mine.ids("guillemot plan", capability_policy=SEMANTIC)
    assert mine.fails("get", {"record_id": rid, "purpose_ref": mine.purpose_ref}) == Code.NOT_FOUND
    assert theirs.ids("guillemot") == [rid]


def test_pending_candidates_are_not_searchable(ana: Client) -> None:
    ana.capture_only("Razorbill pending candidate text.")
    assert ana.ids("razorbill") == []
    assert ana.ids("razorbill pending candidate", capability_policy=SEMANTIC) == []


def test_forgotten_records_never_come_back_on_any_channel(ana: Client) -> None:
    rid = ana.remember("The puffin migration key rotation happens monthly.")
    assert rid in ana.ids("puffin migration")
    ana.forget(rid)
    assert rid not in ana.ids("puffin migration")
    assert rid not in ana.ids("puffin migration key rotation monthly", capability_policy=SEMANTIC)


def test_revalidation_drops_without_refilling(core) -> None:
    """Ranked rows that fail final revalidation are dropped; the page is not topped up."""
    from engram_core.services.reading import ReadService, eligible

    ana = Client(core)
    ids = [ana.remember("Shag colony shag colony census, the strongest hit.")]
    ids += [ana.remember(f"Shag colony census {i}.") for i in range(3)]
    svc = ReadService(core.core)
    calls = []

    def flaky(rec, now):
        calls.append(rec.record_id)
        return eligible(rec, now) and rec.record_id != ids[0]

    import engram_core.services.reading as reading

    saved, reading.eligible = reading.eligible, flaky
    try:
        from engram_core.trust.hostctx import verify_context

        ctx = verify_context(ana.context("search"), core.core.trusted, now_ms=core.core.now_ms())
        res = svc.search(ctx, {"query": "shag colony", "purpose_ref": ana.purpose_ref, "limit": 2})
    finally:
        reading.eligible = saved
    got = [p["record"]["record_id"] for p in res["records"]]
    assert calls[0] == ids[0] and len(calls) == 2
    assert ids[0] not in got and len(got) == 1 and res["records"][0]["rank"] == 2
