"""Paging (SPEC §5) at the pin store's capacity: one tenant's searches cannot expire another's
cursor. Out of tests/search/test_paging.py (issue 58). Filling the default store (4,096 pins) took
4,112 real searches; the core here is started with a capacity of 64 (``page_pin_capacity``, which
the composition root passes), so the same fill takes 80, and the default is checked on its own."""

from __future__ import annotations

import inspect
from pathlib import Path

from engram_core.app.composition import open_core, start_core
from engram_core.contract.errors import Code
from engram_core.services.core import Core
from engram_core.services.paging import MAX_PINS
from engram_core.store.kernel import StoreKernel
from tests.support.core_engines import EngineStores
from tests.support.search_support import Client, activate

CAPACITY = 64  # below the per-scope bound (1,024): the flood meets the total bound first


def test_one_tenants_searches_do_not_expire_another_tenants_cursor(stores: EngineStores, tmp_path: Path) -> None:
    """Page pins are kept per scope (docs/security.md, "Smaller exposures"): more searches from
    one tenant than the core keeps pins in total must not turn another tenant's open cursor
    into STALE_PAGE; the scope holding the most pins gives its oldest up."""
    running = stores.start_core(tmp_path / "core", page_pin_capacity=CAPACITY)
    try:
        activate(running)
        activate(running, "globex", "alpha")
        ana, eve = Client(running), Client(running, tenant="globex")
        for i in range(3):
            ana.remember(f"Avocet survey note {i}.")
            eve.remember(f"Godwit survey note {i}.")
        cursor = ana.search("avocet", limit=1)["next_page_cursor"]
        eves_first = eve.search("godwit", limit=1)["next_page_cursor"]
        for _ in range(CAPACITY + 16):
            assert "next_page_cursor" in eve.search("godwit", limit=1)
        assert running.memory is not None
        assert len(running.memory.reading.pins) == CAPACITY, "the searches did not fill the core's pins"
        page = ana.search("avocet", limit=1, page_cursor=cursor)
        assert [p["rank"] for p in page["records"]] == [2]
        # The flood's own oldest pin was the one given up: gone from memory. Where cores share the
        # store, it is still in the database, so the cursor pages there (and on any core).
        eves_page = eve.search_args("godwit", limit=1, page_cursor=eves_first)
        if stores.is_postgresql:
            assert [p["rank"] for p in eve.call("search", eves_page)["records"]] == [2]
        else:
            assert eve.fails("search", eves_page) == Code.STALE_PAGE
    finally:
        running.stop()


def test_a_core_keeps_4096_pins_unless_its_composition_root_says_otherwise() -> None:
    """The default the test above lowers: every step that passes the capacity on defaults to it."""
    assert MAX_PINS == 4_096
    defaults = {f.__qualname__: inspect.signature(f).parameters["page_pin_capacity"].default
                for f in (start_core, open_core, Core)}
    defaults["StoreKernel.page_pins"] = inspect.signature(StoreKernel.page_pins).parameters["capacity"].default
    assert defaults == dict.fromkeys(defaults, MAX_PINS)
