"""Paging (SPEC §5): opaque MAC'd cursors bound to the search; exact pages of the pinned snapshot."""

from __future__ import annotations

import pytest

from engram_core.contract.errors import Code
from engram_core.rpc.server import RunningCore
from tests.support.search_support import PURPOSE, SEMANTIC, Client


@pytest.mark.parametrize("channels", [{}, {"capability_policy": SEMANTIC}], ids=["lexical", "semantic"])
def test_pages_are_exact_across_concurrent_admissions_and_forgets(core: RunningCore, channels: dict) -> None:
    word = "heronry" if not channels else "grebeline"
    ana = Client(core)
    ids = [ana.remember(f"The {word} job step {i} " + "retries " * (i % 4) + f"{word} " * (i % 3)) for i in range(14)]
    reference = ana.ids(word, limit=50, **channels)
    assert set(ids) <= set(reference)
    seen: list[str] = []
    forgotten: set[str] = set()
    added: set[str] = set()
    page = ana.search(word, limit=3, **channels)
    step = 0
    while True:
        seen += [p["record"]["record_id"] for p in page["records"]]
        if "next_page_cursor" not in page:
            break
        # Between pages: forget the best hit (moves BM25 statistics and the normalization),
        # forget one not yet seen, and admit new matching records with a strong match.
        victims = [reference[0]] if step == 0 else []
        unseen = [r for r in reference if r not in seen and r not in forgotten]
        victims += unseen[1:2]
        for rid in victims:
            if rid not in forgotten:
                ana.forget(rid)
                forgotten.add(rid)
        added.add(ana.remember(f"{word} {word} {word} new arrival {step}"))
        step += 1
        page = ana.search(word, limit=3, page_cursor=page["next_page_cursor"], **channels)
    assert len(seen) == len(set(seen)), "a record repeated across pages"
    assert not set(seen) & added, "a record admitted after the pin appeared"
    assert not (set(seen) - {reference[0]}) & forgotten, "a record forgotten after the pin appeared"
    expected = [r for r in reference if r not in forgotten or (r == reference[0] and r in seen)]
    assert seen == expected, "pages skipped or reordered records of the pinned snapshot"


def test_ranks_continue_across_pages(ana: Client) -> None:
    for i in range(5):
        ana.remember(f"Ptarmigan note {i}.")
    first = ana.search("ptarmigan", limit=2)
    second = ana.search("ptarmigan", limit=2, page_cursor=first["next_page_cursor"])
    assert [p["rank"] for p in first["records"]] == [1, 2]
    assert [p["rank"] for p in second["records"]] == [3, 4]
    assert first["rank_receipt"]["system_as_of"] == second["rank_receipt"]["system_as_of"]
    assert first["rank_receipt"]["valid_as_of"] == second["rank_receipt"]["valid_as_of"]


@pytest.fixture
def cursor(ana: Client) -> str:
    for i in range(4):
        ana.remember(f"Cormorant runbook section {i}.")
    return ana.search("cormorant", limit=2)["next_page_cursor"]


def _flip(token: str, at: int) -> str:
    c = token[at]
    return token[:at] + ("A" if c != "A" else "B") + token[at + 1:]


@pytest.mark.parametrize("at", [0, 10, -1, -5])
def test_tampered_cursor_is_stale_page(ana: Client, cursor: str, at: int) -> None:
    assert ana.fails("search", ana.search_args("cormorant", limit=2, page_cursor=_flip(cursor, at))) == Code.STALE_PAGE


@pytest.mark.parametrize("token", ["x", "AAAA", "not base64 !!"])
def test_garbage_cursor_is_stale_page(ana: Client, token: str) -> None:
    assert ana.fails("search", ana.search_args("cormorant", page_cursor=token)) == Code.STALE_PAGE


@pytest.mark.parametrize("change", [
    {"query": "cormorant runbook"}, {"limit": 3}, {"max_packet_bytes": 100_000},
    {"capability_policy": SEMANTIC}, {"capability_policy": {"minimum_channels": "lexical", "network": "allow"}},
])
def test_cursor_bound_to_query_parameters_and_profile(ana: Client, cursor: str, change: dict) -> None:
    args = {"query": "cormorant", "purpose_ref": PURPOSE, "limit": 2, "page_cursor": cursor, **change}
    assert ana.fails("search", args) == Code.STALE_PAGE


def test_cursor_bound_to_principal_and_scope(core: RunningCore, cursor: str) -> None:
    from tests.support.search_support import activate

    activate(core, "acme", "gamma")
    for other in (Client(core, principal="user:bob"), Client(core, workspace="gamma")):
        assert other.fails("search", other.search_args("cormorant", limit=2, page_cursor=cursor)) == Code.STALE_PAGE


def test_expired_pin_is_stale_page(clocked) -> None:
    running, clock = clocked
    ana = Client(running, clock=clock)
    for i in range(3):
        ana.remember(f"Dunlin note {i}.")
    token = ana.search("dunlin", limit=1)["next_page_cursor"]
    clock.advance(14 * 60_000)
    ana.search("dunlin", limit=1, page_cursor=token)
    clock.advance(2 * 60_000)
    assert ana.fails("search", ana.search_args("dunlin", limit=1, page_cursor=token)) == Code.STALE_PAGE


def test_cursor_from_a_restarted_core_is_stale_page(tmp_path, stores) -> None:
    from tests.support.search_support import activate

    running = stores.start_core(tmp_path / "d", semantic=False)
    activate(running)
    ana = Client(running)
    for i in range(3):
        ana.remember(f"Shearwater note {i}.")
    token = ana.search("shearwater", limit=1)["next_page_cursor"]
    running.stop()
    running = stores.start_core(tmp_path / "d", semantic=False)
    try:
        ana = Client(running)
        if stores.is_postgresql:
            # Pins are a table every core shares (docs/architecture.md, "several cores"): the
            # cursor pages on after a restart as it does on another core.
            page = ana.search("shearwater", limit=1, page_cursor=token)
            assert [p["rank"] for p in page["records"]] == [2]
        else:
            assert ana.fails("search", ana.search_args("shearwater", limit=1, page_cursor=token)) == Code.STALE_PAGE
        assert len(ana.ids("shearwater")) == 3
    finally:
        running.stop()

