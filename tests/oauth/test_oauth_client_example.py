"""tools/mcp_oauth_client.py, the complete client docs/mcp-clients.md §3a points to, against the
tests' real OpenID provider and a real `engram mcp --http` resource server: a person signs in
through the browser (here a scripted one that follows the provider's pages), the code comes back on
the example's own loopback listener, tokens are kept in a 0600 file, and a second run signs in no
more (issue 60 item 15)."""

from __future__ import annotations

import stat
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx2
import pytest

from engram_core.contract.schemas import TOOL_NAMES
from tests.support.idp_support import PASSWORDS, PUBLIC_CLIENT
from tools.mcp_oauth_client import CALLBACK_PATH, connect

pytestmark = pytest.mark.anyio


class ScriptedBrowser:
    """What a person does in the browser: sign in as ``login``, consent, and land on the
    redirect, which this browser really requests (the example's listener answers it)."""

    def __init__(self, login: str) -> None:
        self.login = login
        self.sign_ins = 0

    async def open(self, url: str) -> None:
        self.sign_ins += 1
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as browser:
            response = await browser.get(url)
            for _ in range(12):
                location = response.headers.get("location")
                assert location is not None, f"sign-in stopped at {response.status_code}: {response.text[-500:]}"
                target = urljoin(str(response.url), location)
                if urlsplit(target).path == CALLBACK_PATH and urlsplit(target).hostname == "127.0.0.1":
                    landed = await browser.get(target)
                    assert landed.status_code == 200 and "Signed in" in landed.text
                    return
                if "/interaction/" in urlsplit(target).path:
                    details = (await browser.get(target)).json()
                    if details["prompt"] == "login":
                        response = await browser.post(target + "/login",
                                                      json={"login": self.login, "password": PASSWORDS[self.login]})
                    else:
                        response = await browser.post(target + "/consent", json={"reject": []})
                else:
                    response = await browser.get(target)
        raise AssertionError("too many redirects")


async def test_the_example_client_signs_in_keeps_its_tokens_and_reuses_them(world, tmp_path: Path) -> None:
    tokens = tmp_path / "config" / "oauth-tokens.json"
    person = ScriptedBrowser("alice")
    async with connect(world.jwt.url, tokens=tokens, client_id=PUBLIC_CLIENT, open_url=person.open) as client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
    assert person.sign_ins == 1
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    kept = tokens.read_text()
    assert '"access_token"' in kept and '"refresh_token"' in kept and PUBLIC_CLIENT in kept

    async with connect(world.jwt.url, tokens=tokens, client_id=PUBLIC_CLIENT, open_url=person.open) as client:
        assert [t.name for t in (await client.list_tools()).tools] == list(TOOL_NAMES)
    assert person.sign_ins == 1  # the kept tokens served the second run: no new sign-in
