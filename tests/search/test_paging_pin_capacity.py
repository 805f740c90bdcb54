"""Paging (SPEC §5) at the pin store's capacity: one tenant's searches cannot expire another's
cursor. Out of tests/search/test_paging.py (issue 58): filling the store takes thousands of real
searches, the longest test of its directory, and a file of its own is handed to a test worker
first (``tests/support/file_costs.py``) instead of ending the run behind the rest of paging."""

from __future__ import annotations

from engram_core.rpc.server import RunningCore
from engram_core.services.paging import MAX_PINS
from tests.support.search_support import Client, activate


def test_one_tenants_searches_do_not_expire_another_tenants_cursor(lexical_core: RunningCore) -> None:
    """Page pins are kept per scope (docs/security.md, "Smaller exposures"): more searches from
    one tenant than the core keeps pins in total must not turn another tenant's open cursor
    into STALE_PAGE."""
    activate(lexical_core, "globex", "alpha")
    ana, eve = Client(lexical_core), Client(lexical_core, tenant="globex")
    for i in range(3):
        ana.remember(f"Avocet survey note {i}.")
        eve.remember(f"Godwit survey note {i}.")
    cursor = ana.search("avocet", limit=1)["next_page_cursor"]
    for _ in range(MAX_PINS + 16):
        assert "next_page_cursor" in eve.search("godwit", limit=1)
    page = ana.search("avocet", limit=1, page_cursor=cursor)
    assert [p["rank"] for p in page["records"]] == [2]
