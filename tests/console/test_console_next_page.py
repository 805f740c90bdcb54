"""Where a sign-in may return to (issue 61): a relative path of the console itself, never an
address a link could choose (an open redirect), and never the sign-in pages again."""

from __future__ import annotations

import pytest

from engram_core.console.app import _next_page


@pytest.mark.parametrize("path", [
    "/", "/confirmations", "/confirmations/cfm_lYAT2HEIWz1J_vMhH3_mKlAYk6d175lePTNBKzk3Hho",
    "/s/acme/main/review", "/s/acme/main/memory?state=accepted_current&before=120", "/s/acme/main/memory?q=a%2Fb",
])
def test_a_page_of_the_console_is_returned_to(path: str) -> None:
    assert _next_page(path) == path


@pytest.mark.parametrize("path", [
    "", "//evil.example/x", "/\\evil.example", "https://evil.example/", "http:/evil", "evil.example",
    "/s/../../etc", "/./x", "/a//b", "/s/acme/main/review#frag", "/x?next=//evil\n", "/signin",
    "/signin?next=/x", "/oauth/callback?code=x", "/signout", "/x y", "/%2F%2Fevil.example", "/" + "a" * 600,
    "/x?q=<script>",
])
def test_anything_else_signs_in_to_the_start(path: str) -> None:
    assert _next_page(path) == ""
