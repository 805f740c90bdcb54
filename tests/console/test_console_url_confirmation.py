"""Issue 61: a forget asked from an MCP client that has URL-mode elicitation only (no form) is
confirmed by a person in the console's "Confirmations" page.

All real parts: the core and `engram console` of tests/console/conftest.py, the installed `engram
mcp` adapter over stdio, the SDK's own `Client` (on both protocol versions), a headless Chromium.
The one thing changed in the SDK client is its capability ad: the SDK declares form and URL
elicitation together whenever an elicitation callback is given, and a client with URL mode only
(Claude Desktop-like, MCP 2025-11-25) is what this issue is about.
"""

from __future__ import annotations

import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import AsyncExitStack
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters
from selenium.webdriver.common.by import By

from engram_core.api import admin_pb2
from engram_core.console.core_client import Actor, CoreClient, CoreError
from engram_core.contract.scope import Scope
from engram_core.contract.tools import FORGET_TOOL
from tests.support.console_support import OTHER, TENANT, WORKSPACE, World, chrome, http, start_console, submit

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
ENGRAM = str(Path(__import__("sys").executable).with_name("engram"))
PRINCIPAL, AGENT = "user:ana", "agent-url-only"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class UrlOnlyClient(Client):
    """The SDK's own client, declaring elicitation in URL mode only."""

    async def _build_session(self, exit_stack: AsyncExitStack) -> ClientSession:
        session = await super()._build_session(exit_stack)
        full = session._build_capabilities

        def url_only(version: str) -> types.ClientCapabilities:
            caps = full(version)
            return caps.model_copy(update={"elicitation": types.ElicitationCapability(
                url=types.UrlElicitationCapability())})

        session._build_capabilities = url_only  # type: ignore[method-assign]
        return session


def _adapter_config(world: World, directory: Path, *, timeout_ms: int = 60_000) -> Path:
    path = directory / f"host-{secrets.token_hex(4)}.toml"
    path.write_text(
        "[core]\n"
        f'address = "{world.running.address}"\n'
        "[host]\n"
        f'signing_key = "{world.running.host_key_path}"\n'
        "memory_enabled = true\n"
        f"confirmation_timeout_ms = {timeout_ms}\n"
        f'console_url = "{world.console.url}"\n'
        "[binding]\n"
        f'tenant = "{TENANT}"\nworkspace = "{WORKSPACE}"\nprincipal = "{PRINCIPAL}"\n'
        f'agent_id = "{AGENT}"\nsession = "sess-url"\npurpose_ref = "purpose:eng"\n')
    return path


def _client(config: Path, mode: str, elicitation: Any, *, url_only: bool = True,
            notifications: list[Any] | None = None) -> Client:
    params = StdioServerParameters(command=ENGRAM, args=["mcp", "--host-config", str(config)], cwd=str(REPO))
    cls = UrlOnlyClient if url_only else Client

    async def keep(message: Any) -> None:
        if notifications is not None:
            notifications.append(message)

    return cls(params, mode=mode, elicitation_callback=elicitation, message_handler=keep)


def _record(world: World, text: str) -> str:
    """An accepted record of acme/main (its captures wait for a person: adjudicated here)."""
    candidate, status = world.hand.capture_and_admit(TENANT, WORKSPACE, text)
    assert status == "pending_adjudication"
    out = world.hand.admin("Adjudicate", admin_pb2.AdjudicateRequest(
        tenant=TENANT, workspace=WORKSPACE, candidate_id=candidate, decision="accept", reason_ref="reviewed",
        event_id="evt_test_" + secrets.token_hex(8)))
    return out["outcome"]["record_id"]


def _forget_args(record_id: str, reason: str = "reason:user-asked-to-forget") -> dict[str, Any]:
    return {"record_id": record_id, "idempotency_key": "forget-" + secrets.token_hex(8), "reason_ref": reason}


def _envelope(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None
    return result.structured_content


def _audit(world: World) -> list[dict[str, Any]]:
    return world.hand.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="audit",
                                                              from_cursor="1"))["items"]


def _open_signed_in(browser, url: str, token: str) -> None:
    """Open ``url`` as a person: a browser not signed in is sent to sign in, and back to it."""
    browser.get(url)
    if urlsplit(browser.current_url).path == "/signin":
        browser.find_element(By.ID, "token").send_keys(token)
        submit(browser, browser.find_element(By.ID, "signin"))
    assert urlsplit(browser.current_url).path == urlsplit(url).path, browser.current_url


def _browser_answers(browser, world: World, record_id: str, decision: str, seen: dict[str, Any]
                     ) -> Callable[..., Any]:
    """The elicitation callback: the person opens the URL, reads what will happen, and decides."""

    def in_browser(url: str) -> None:
        _open_signed_in(browser, url, world.token)
        # The Confirmations page lists it, and links to the same page.
        browser.get(world.console.url + "/confirmations")
        link = browser.find_element(By.CSS_SELECTOR, f"#pending a[href='{urlsplit(url).path}']")
        assert record_id in browser.find_element(By.ID, "pending").text
        submit(browser, link)
        page = {k: browser.find_element(By.ID, k).text for k in ("target", "reason", "agent", "tool", "scope", "state")}
        seen["page"] = page
        seen["csrf"] = browser.find_element(By.CSS_SELECTOR, "form.decide input[name=csrf]").get_attribute("value")
        seen["cookie"] = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
        submit(browser, browser.find_element(By.ID, decision))
        seen["done"] = browser.find_element(By.ID, "done").text

    async def answer(context: Any, params: Any) -> types.ElicitResult:
        seen["params"] = params
        assert isinstance(params, types.ElicitRequestURLParams)
        await anyio.to_thread.run_sync(in_browser, params.url)
        return types.ElicitResult(action="accept")  # "I opened the page": approves nothing by itself

    return answer


class _Person:
    """A person's plain HTTP session with one console (cookies kept, redirects not followed)."""

    def __init__(self, base: str) -> None:
        class _NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a: Any, **k: Any) -> None:
                return None

        self.base = base
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)

    def send(self, method: str, path: str, form: dict[str, str] | None = None) -> tuple[int, str]:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        try:
            with self.opener.open(urllib.request.Request(self.base + path, data=data, method=method), timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def sign_in(self, token: str) -> None:
        _, page = self.send("GET", "/signin")
        pre = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        status, _ = self.send("POST", "/signin", {"csrf": pre, "token": token})
        assert status == 303


@pytest.fixture(scope="module")
def person_browser() -> Any:
    driver = chrome()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_forget_confirmed_by_a_person_in_the_console(world: World, person_browser, tmp_path: Path,
                                                           mode: str) -> None:
    record_id = _record(world, f"decision: the {mode} cache tier uses redis cluster {secrets.token_hex(3)}")
    seen: dict[str, Any] = {}
    notes: list[Any] = []
    async with _client(_adapter_config(world, tmp_path), mode, _browser_answers(
            person_browser, world, record_id, "approve", seen), notifications=notes) as client:
        result = await client.call_tool(FORGET_TOOL, _forget_args(record_id))
    env = _envelope(result)
    assert env["ok"] is True, env
    assert env["output"]["value"]["receipt"]["to_state"] == "tombstoned"

    # The client got a URL-mode elicitation whose URL names only the confirmation's id.
    params = seen["params"]
    assert params.mode == "url"
    # 2025-11-25 carries an elicitationId (for notifications/elicitation/complete); 2026-07-28 has none.
    assert bool(params.elicitation_id) is (mode == "legacy")
    completed = [n.params.elicitation_id for n in notes if isinstance(n, types.ElicitCompleteNotification)]
    assert completed == ([params.elicitation_id] if mode == "legacy" else [])
    path = urlsplit(params.url).path
    assert params.url.startswith(world.console.url + "/confirmations/cfm_") and not urlsplit(params.url).query
    assert record_id not in params.url and "reason" not in params.url
    # The page showed the person what would happen.
    assert seen["page"] == {"target": record_id, "reason": "reason:user-asked-to-forget",
                            "agent": f"{AGENT} as {PRINCIPAL}", "tool": FORGET_TOOL,
                            "scope": f"{TENANT}/{WORKSPACE}", "state": "pending"}
    assert seen["done"].startswith("Approved")

    # The audit: the agent's request under the agent, the approval under the person, then the forget.
    # (On 2026-07-28 the request and the confirmed call are two MCP requests with two audit ids: the
    # rows are matched by the target's digest, which names this record only.)
    rows = _audit(world)
    forgot = [r for r in rows if r["operation"] == FORGET_TOOL and r["audit_id"] == env["auditId"]]
    assert [(r["principal"], r["outcome"]) for r in forgot] == [(PRINCIPAL, "tombstoned")]
    about = forgot[0]["target_digest"]
    parked = [r for r in rows if r["operation"] == "host.park_confirmation" and r["target_digest"] == about]
    assert [(r["principal"], r["agent_id"], r["outcome"]) for r in parked] == [(PRINCIPAL, AGENT, "pending")]
    assert (parked[0]["audit_id"] == env["auditId"]) is (mode == "legacy")
    decided = [r for r in rows if r["operation"] == "host.decide_confirmation" and r["target_digest"] == about]
    assert [(r["principal"], r["agent_id"], r["outcome"]) for r in decided] == [
        ("local:owner", "engram-console", "approved")]
    assert int(decided[0]["at_ms"]) <= int(forgot[0]["at_ms"])

    # Replayed: the same approval sent again changes nothing (the confirmation was claimed, once).
    status, _, _ = http("POST", world.console.url + path, cookie=seen["cookie"],
                        form={"csrf": seen["csrf"], "decision": "approve"})
    assert status == 404
    assert len([r for r in _audit(world) if r["operation"] == "host.decide_confirmation"
                and r["target_digest"] == parked[0]["target_digest"] and r["outcome"] == "approved"]) == 1


async def test_a_denied_confirmation_is_gate_failed(world: World, person_browser, tmp_path: Path) -> None:
    record_id = _record(world, f"decision: deny path keeps postgres {secrets.token_hex(3)}")
    seen: dict[str, Any] = {}
    async with _client(_adapter_config(world, tmp_path), "legacy", _browser_answers(
            person_browser, world, record_id, "deny", seen)) as client:
        result = await client.call_tool(FORGET_TOOL, _forget_args(record_id))
        env = _envelope(result)
        assert env["ok"] is False and env["error"]["code"] == "gate_failed", env
        assert seen["done"].startswith("Denied")
        # The record is still there: a form-less client cannot slip past a denial.
        still = await client.call_tool("engram_memory_get", {"record_id": record_id, "purpose_ref": "purpose:eng"})
        assert _envelope(still)["ok"] is True


async def test_an_approval_after_expiry_is_refused(world: World, person_browser, tmp_path: Path) -> None:
    record_id = _record(world, f"decision: expiry path keeps sqlite {secrets.token_hex(3)}")
    urls: list[str] = []

    async def opened_but_nobody_approves(context: Any, params: Any) -> types.ElicitResult:
        urls.append(params.url)
        return types.ElicitResult(action="accept")

    started = time.monotonic()
    async with _client(_adapter_config(world, tmp_path, timeout_ms=1_000), "auto",
                       opened_but_nobody_approves) as client:
        result = await client.call_tool(FORGET_TOOL, _forget_args(record_id))
    env = _envelope(result)
    assert env["ok"] is False and env["error"]["code"] == "gate_failed", env
    assert time.monotonic() - started < 30
    # Too late: the page no longer offers it, and an approval sent anyway is refused.
    _open_signed_in(person_browser, urls[0], world.token)
    assert person_browser.find_elements(By.ID, "approve") == []
    assert "Not found" in person_browser.title or "nothing here" in person_browser.page_source
    csrf = person_browser.find_element(By.CSS_SELECTOR, "form.signout input[name=csrf]").get_attribute("value")
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in person_browser.get_cookies())
    status, _, _ = http("POST", urls[0], cookie=cookie, form={"csrf": csrf, "decision": "approve"})
    assert status == 404
    rows = [r for r in _audit(world) if r["operation"] == "host.claim_confirmation" and r["outcome"] == "expired"]
    assert rows and not [r for r in _audit(world) if r["operation"] == FORGET_TOOL and r["audit_id"] == env["auditId"]
                         and r["outcome"] == "tombstoned"]


async def test_another_tenants_person_cannot_see_or_approve(world: World, tmp_path: Path) -> None:
    """A console serving only globex (its own owner) and a console key's context on globex: the
    acme confirmation is not found for either, and nothing they do approves it."""
    record_id = _record(world, f"decision: tenant isolation of confirmations {secrets.token_hex(3)}")
    other = start_console(world.running.address, world.running.host_key_path, world.token_file,
                          [f"{OTHER}/{WORKSPACE}"], tmp_path / "other-console.log")
    core = CoreClient(world.running.address, world.running.host_key_path)
    checked: dict[str, Any] = {}

    def as_the_other_tenant(url: str) -> None:
        path = urlsplit(url).path
        person = _Person(other.url)
        person.sign_in(world.token)
        checked["get"] = person.send("GET", path)[0]
        status, listing = person.send("GET", "/confirmations")
        checked["listed"] = path.rsplit("/", 1)[1] in listing
        csrf = listing.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        checked["post"] = person.send("POST", path, {"csrf": csrf, "decision": "approve"})[0]
        cid = path.rsplit("/", 1)[1]
        try:
            core.decide_confirmation(Actor("local:owner", "s"), Scope(OTHER, WORKSPACE), cid, True)
            checked["core"] = "decided"
        except CoreError as err:
            checked["core"] = err.code
        try:
            core.confirmations(Actor("local:owner", "s"), Scope(OTHER, WORKSPACE), cid)
            checked["core_get"] = "found"
        except CoreError as err:
            checked["core_get"] = err.code

    async def answer(context: Any, params: Any) -> types.ElicitResult:
        await anyio.to_thread.run_sync(as_the_other_tenant, params.url)
        return types.ElicitResult(action="decline")

    try:
        async with _client(_adapter_config(world, tmp_path), "legacy", answer) as client:
            result = await client.call_tool(FORGET_TOOL, _forget_args(record_id))
    finally:
        other.stop()
        core.close()
    assert checked == {"get": 404, "listed": False, "post": 404, "core": "NOT_FOUND", "core_get": "NOT_FOUND"}
    env = _envelope(result)
    assert env["ok"] is False and env["error"]["code"] == "gate_failed"
    assert not [r for r in _audit(world) if r["operation"] == FORGET_TOOL and r["audit_id"] == env["auditId"]
                and r["outcome"] == "tombstoned"]


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_client_with_neither_mode_still_gets_gate_failed(world: World, tmp_path: Path, mode: str) -> None:
    record_id = _record(world, f"decision: no elicitation at all {mode} {secrets.token_hex(3)}")
    async with _client(_adapter_config(world, tmp_path), mode, None, url_only=False) as client:
        result = await client.call_tool(FORGET_TOOL, _forget_args(record_id))
    env = _envelope(result)
    assert env["ok"] is False and env["error"]["code"] == "gate_failed"
    assert "cannot ask a human" in env["error"]["message"]
    rows = [r for r in _audit(world) if r["audit_id"] == env["auditId"]]
    assert "host.park_confirmation" not in {r["operation"] for r in rows}


async def test_a_form_client_still_gets_the_form(world: World, tmp_path: Path) -> None:
    """With a console URL configured, a client that can show a form is asked by form, as before."""
    record_id = _record(world, f"decision: form clients unchanged {secrets.token_hex(3)}")
    asked: list[Any] = []

    async def approve(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with _client(_adapter_config(world, tmp_path), "legacy", approve, url_only=False) as client:
        result = await client.call_tool(FORGET_TOOL, _forget_args(record_id))
    assert _envelope(result)["ok"] is True
    assert len(asked) == 1 and isinstance(asked[0], types.ElicitRequestFormParams)


def test_no_confirmation_page_without_signing_in(world: World) -> None:
    status, headers, _ = http("GET", world.console.url + "/confirmations/cfm_" + "a" * 43)
    assert status == 303 and headers["location"].startswith("/signin?next=")
    status, _, _ = http("POST", world.console.url + "/confirmations/cfm_" + "a" * 43,
                        form={"csrf": "x", "decision": "approve"})
    assert status == 303
