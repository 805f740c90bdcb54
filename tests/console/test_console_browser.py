"""The console in a real browser (issue 61): sign in with the local token, clear held captures
through the review queue, find the adjudication in the audit under the person, and the security
properties a person relies on: CSP, cookies, CSRF, escaping, tenant isolation, no role no access.

One core, one console process and one headless Chromium for the module; the tests run in order
(the queue they clear is the one the first test filled)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from engram_core.api import admin_pb2
from tests.support.console_support import (
    OTHER,
    TENANT,
    WORKSPACE,
    World,
    doc_shot,
    free_port,
    http,
    openid_authorize,
    policies_copy,
    start_console,
    start_console_toml,
    submit,
)

SCOPE = f"/s/{TENANT}/{WORKSPACE}"
SCRIPT = "<script>alert('reason')</script>"


def _shot(browser, shots: Path, name: str) -> None:
    path = shots / f"{name}.png"
    browser.save_screenshot(str(path))
    print(f"screenshot: {path}")


def _no_alert(browser) -> None:
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 - the property raises when no alert is open


def _sign_in(browser, url: str, token: str) -> None:
    browser.get(url + "/signin")
    field = browser.find_element(By.ID, "token")
    field.send_keys(token)
    submit(browser, browser.find_element(By.ID, "signin"))


def _cookie_header(browser, world: World) -> str:
    return "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())


def _after_continue(browser):
    """The browser once the sign-in's continue page has moved on to / (a meta refresh, no script)."""
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.ID, "who"))
    return browser


def _csrf(browser) -> str:
    return browser.find_element(By.CSS_SELECTOR, "form.signout input[name=csrf]").get_attribute("value")


def test_sign_in_with_the_local_token(world: World, browser, shots: Path) -> None:
    browser.get(world.console.url + "/")
    assert browser.current_url.endswith("/signin")  # nothing without a session
    _shot(browser, shots, "01-signin")
    doc_shot(browser, "signin")
    _sign_in(browser, world.console.url, "not-the-token")
    assert "not this installation's" in browser.find_element(By.ID, "failed").text
    _sign_in(browser, world.console.url, world.token)
    assert browser.find_element(By.ID, "who").text == "local:owner"
    assert f"{TENANT}/{WORKSPACE}" in browser.find_element(By.TAG_NAME, "table").text
    cookie = browser.get_cookie("engram_console")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    _shot(browser, shots, "02-home")
    doc_shot(browser, "home")


def test_review_queue_accept_and_reject(world: World, browser, shots: Path) -> None:
    held = [world.hand.capture_and_admit(TENANT, WORKSPACE, f"decision {i}: cache tier {i} uses redis")
            for i in range(3)]
    assert {status for _, status in held} == {"pending_adjudication"}
    browser.get(world.console.url + SCOPE + "/review")
    listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#queue a.cid")]
    assert sorted(listed) == sorted(c for c, _ in held)
    assert "TRUST_CLASS_REQUIRES_ADJUDICATION" in browser.find_element(By.ID, "queue").text
    assert "redis" not in browser.page_source  # a held capture's text never reaches the page
    _shot(browser, shots, "03-review-queue")
    doc_shot(browser, "review-queue")

    accept, reject, keep = (c for c, _ in held)
    browser.find_element(By.ID, f"reason-{accept}").send_keys("reviewed: matches ADR 7")
    submit(browser, browser.find_element(By.CSS_SELECTOR, f"form[action$='/{accept}/decide'] button.accept"))
    assert browser.find_element(By.ID, "decided").text == "Decided: accepted."
    browser.find_element(By.ID, f"reason-{reject}").send_keys(SCRIPT)
    submit(browser, browser.find_element(By.CSS_SELECTOR, f"form[action$='/{reject}/decide'] button.reject"))
    assert browser.find_element(By.ID, "decided").text == "Decided: rejected."
    listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#queue a.cid")]
    assert listed == [keep]
    assert world.hand.state_of(TENANT, WORKSPACE, accept) == "accepted"
    assert world.hand.state_of(TENANT, WORKSPACE, reject) == "rejected"

    # The reason a person typed is shown as text, never run as markup.
    browser.get(world.console.url + f"{SCOPE}/candidates/{reject}")
    assert SCRIPT in [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#events td.reason-text")]
    assert browser.find_elements(By.TAG_NAME, "script") == []
    _no_alert(browser)
    _shot(browser, shots, "04-candidate")
    browser.get(world.console.url + f"{SCOPE}/candidates/{accept}")
    doc_shot(browser, "candidate")


def test_audit_shows_the_adjudication_under_the_person(world: World, browser, shots: Path) -> None:
    browser.get(world.console.url + SCOPE + "/audit")
    assert browser.find_element(By.ID, "verify").text.startswith("Verified:")
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr")]
    adjudications = [r for r in rows if r[3] == "admin.adjudicate"]
    assert len(adjudications) == 2 and {r[1] for r in adjudications} == {"local:owner"}
    assert {r[2] for r in adjudications} == {"engram-console"}
    _shot(browser, shots, "05-audit")
    doc_shot(browser, "audit")


def test_audit_pages_cover_the_timeline(world: World, browser) -> None:
    """Paged by sequence number, newest first, with a window of 4: following Older from the newest
    page reaches every row the scope had before the console verified, each once (the page views
    write rows of their own meanwhile)."""
    small = start_console(world.running.address, world.running.host_key_path, world.token_file,
                          [f"{TENANT}/{WORKSPACE}"], world.root / "small-console.log",
                          env={"ENGRAM_CONSOLE_AUDIT_PAGE": "4"})
    try:
        browser.delete_all_cookies()
        _sign_in(browser, small.url, world.token)
        before_ms = time.time_ns() // 1_000_000
        browser.get(small.url + SCOPE + "/audit")
        head = int(browser.find_element(By.ID, "verify").text.split("Verified: ", 1)[1].split(" ", 1)[0])
        seen: list[tuple[str, str]] = []
        for _ in range(200):
            seen += [tuple(tr.find_elements(By.TAG_NAME, "td")[5].text.rsplit(" ", 1))
                     for tr in browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr") if len(
                         tr.find_elements(By.TAG_NAME, "td")) == 6]
            older = browser.find_elements(By.LINK_TEXT, "Older")
            if not older:
                break
            submit(browser, older[0])
        assert browser.find_elements(By.LINK_TEXT, "Newer")
        rows = world.hand.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE, what="audit",
                                                                   to_cursor=str(head)))["items"]
        expected = {(r["chain"], r["seq"]) for r in rows if int(r["at_ms"]) < before_ms}
        assert expected <= set(seen) and len(seen) == len(set(seen))
    finally:
        small.stop()
        browser.delete_all_cookies()
        _sign_in(browser, world.console.url, world.token)


def test_keys_page(world: World, browser, shots: Path) -> None:
    browser.get(world.console.url + SCOPE + "/keys")
    assert "Active KEK generation" in browser.find_element(By.ID, "kek").text
    assert browser.find_elements(By.CSS_SELECTOR, "#generations tbody tr")
    # The title is the page's name alone (its block once swallowed the destroyed-keys table).
    assert browser.title == f"Keys · {TENANT}/{WORKSPACE}"
    _shot(browser, shots, "06-keys")
    doc_shot(browser, "keys")


def test_policy_page(world: World, browser, shots: Path) -> None:
    browser.get(world.console.url + SCOPE + "/policy")
    assert browser.find_element(By.ID, "console-revision").text
    rows = {tr.find_element(By.CSS_SELECTOR, "td.path").text: tr.text
            for tr in browser.find_elements(By.CSS_SELECTOR, "#decisions tbody tr")}
    assert "adjudication_required: 3" in rows["engram/admission/decision"], rows
    bars = browser.find_elements(By.CSS_SELECTOR, "#decision-chart rect")  # the same counts, drawn (no script)
    assert len(bars) == sum(len(r.split(": ")) - 1 for r in rows.values())
    _shot(browser, shots, "065-policy")
    doc_shot(browser, "policy")


def test_memory_page_searches_as_the_person(world: World, browser, shots: Path) -> None:
    markup = "<img src=x onerror=alert(1)> saffron pipeline decision"
    cand, status = world.hand.capture_and_admit(TENANT, WORKSPACE, markup)
    assert status == "pending_adjudication"
    world.hand.admin("Adjudicate", admin_pb2.AdjudicateRequest(
        tenant=TENANT, workspace=WORKSPACE, candidate_id=cand, decision="accept", reason_ref="r:test",
        event_id="evt_test_" + cand[-12:]))
    browser.get(world.console.url + SCOPE + "/memory")
    browser.find_element(By.ID, "q").send_keys("saffron")
    submit(browser, browser.find_element(By.ID, "search"))
    content = browser.find_element(By.CSS_SELECTOR, "#results td.content").text
    assert markup in content  # shown as text, never as markup
    assert browser.find_elements(By.CSS_SELECTOR, "#results img") == []
    _no_alert(browser)
    _shot(browser, shots, "066-memory")
    rows = world.hand.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE,
                                                               what="audit"))["items"]
    searches = [r for r in rows if r["operation"].endswith("engram_memory_search")]
    assert searches and searches[-1]["principal"] == "local:owner"
    # `engram admin revoke` moves the scope's epoch on: the console learns it and searches again.
    assert world.hand.revoke(TENANT, WORKSPACE) >= 1
    browser.get(world.console.url + SCOPE + "/memory?q=saffron")
    assert markup in browser.find_element(By.CSS_SELECTOR, "#results td.content").text


def test_another_tenants_ids_are_not_found(world: World, browser, shots: Path) -> None:
    theirs, _ = world.hand.capture_and_admit(OTHER, WORKSPACE, "globex decision: ship on fridays")
    before = world.hand.state_of(OTHER, WORKSPACE, theirs)
    browser.get(world.console.url + f"{SCOPE}/candidates/{theirs}")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
    browser.get(world.console.url + f"/s/{OTHER}/{WORKSPACE}/review")  # a scope this console does not serve
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
    _shot(browser, shots, "07-not-found")
    browser.get(world.console.url + SCOPE + "/review")
    cookie, csrf = _cookie_header(browser, world), _csrf(browser)
    for path in (f"{SCOPE}/candidates/{theirs}/decide", f"/s/{OTHER}/{WORKSPACE}/candidates/{theirs}/decide"):
        status, _, body = http("POST", world.console.url + path, cookie=cookie,
                               form={"csrf": csrf, "decision": "accept", "reason": "not mine"})
        assert status == 404 and "Not found" in body
    assert world.hand.state_of(OTHER, WORKSPACE, theirs) == before


def test_csrf_missing_or_wrong_is_refused_and_changes_nothing(world: World, browser) -> None:
    browser.get(world.console.url + SCOPE + "/review")
    keep = browser.find_element(By.CSS_SELECTOR, "#queue a.cid").text
    cookie = _cookie_header(browser, world)
    url = world.console.url + f"{SCOPE}/candidates/{keep}/decide"
    for form in ({"decision": "accept", "reason": "r"}, {"csrf": "forged", "decision": "accept", "reason": "r"}):
        status, _, body = http("POST", url, cookie=cookie, form=form)
        assert status == 403 and "nothing was changed" in body
    assert world.hand.state_of(TENANT, WORKSPACE, keep) == "pending_adjudication"
    status, _, _ = http("POST", url, form={"csrf": _csrf(browser), "decision": "accept", "reason": "r"})
    assert status == 303  # no session: to the sign-in page, nothing decided
    assert world.hand.state_of(TENANT, WORKSPACE, keep) == "pending_adjudication"


def test_every_page_carries_the_security_headers(world: World, browser) -> None:
    browser.get(world.console.url + SCOPE + "/review")
    cookie = _cookie_header(browser, world)
    keep = browser.find_element(By.CSS_SELECTOR, "#queue a.cid").text
    pages = ["/signin", "/", f"{SCOPE}/review", f"{SCOPE}/candidates/{keep}", f"{SCOPE}/audit", f"{SCOPE}/keys", f"{SCOPE}/policy", f"{SCOPE}/memory?q=redis",
             "/static/console.css", "/no/such/page"]
    for page in pages:
        status, headers, _ = http("GET", world.console.url + page, cookie=cookie)
        assert status in (200, 404), page
        csp = headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"
    # DNS rebinding: another site's name pointed at the console's address is not answered.
    status, _, _ = http("GET", world.console.url + "/signin", headers={"Host": "attacker.example"})
    assert status == 400


def test_a_person_without_a_role_gets_nothing(world: World, browser, shots: Path) -> None:
    def no_roles(data: dict) -> None:
        data["engram"]["config"]["console"]["local_owner_roles"] = []

    bare = start_console(world.running.address, world.running.host_key_path, world.token_file,
                         [f"{TENANT}/{WORKSPACE}"], world.root / "bare-console.log",
                         policies=policies_copy(world.root / "bare-policies", no_roles))
    try:
        browser.delete_all_cookies()
        _sign_in(browser, bare.url, world.token)
        assert browser.find_element(By.ID, "no-scopes").is_displayed()
        _shot(browser, shots, "08-no-role")
        for page in ("/review", "/audit", "/keys", "/policy", "/memory"):
            browser.get(bare.url + SCOPE + page)
            assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
    finally:
        bare.stop()


def test_sign_out_ends_the_session(world: World, browser) -> None:
    browser.delete_all_cookies()
    _sign_in(browser, world.console.url, world.token)
    browser.get(world.console.url + SCOPE + "/review")
    old = browser.get_cookie("engram_console")["value"]
    submit(browser, browser.find_element(By.CSS_SELECTOR, "form.signout button"))
    assert browser.current_url.endswith("/signin") and browser.get_cookie("engram_console") is None
    status, headers, _ = http("GET", world.console.url + SCOPE + "/review", cookie=f"engram_console={old}")
    # The old cookie is worth nothing now: sign in, then back to the page asked for.
    assert status == 303 and headers["location"] == "/signin?next=%2Fs%2Facme%2Fmain%2Freview"
    _sign_in(browser, world.console.url, world.token)


def test_a_console_key_bound_to_one_tenant(world: World, browser, shots: Path) -> None:
    """The team set-up of docs/console.md: the console's own key, trusted for acme with read and
    maintain. Pages work; what reads the whole store says so instead (verification), or asks for
    the scope alone (keys)."""
    from cryptography.hazmat.primitives import serialization

    from engram_core.trust.hostkeys import load_or_create_private_key

    key_path = world.root / "team-console.key"
    key = load_or_create_private_key(key_path)
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    world.hand.admin("TrustHostKey", admin_pb2.HostKeyRequest(public_key_pem=pem, tenants=[TENANT],
                                                              maintenance_scopes=["read", "maintain"]))
    bound = start_console(world.running.address, str(key_path), world.token_file, [f"{TENANT}/{WORKSPACE}"],
                          world.root / "bound-console.log")
    try:
        browser.delete_all_cookies()
        _sign_in(browser, bound.url, world.token)
        browser.get(bound.url + SCOPE + "/audit")
        assert "Verification unavailable (UNAUTHORIZED)" in browser.find_element(By.ID, "verify").text
        assert browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr td.op")
        browser.get(bound.url + SCOPE + "/keys")
        assert "Active KEK generation" in browser.find_element(By.ID, "kek").text
        _shot(browser, shots, "085-bound-key-keys")
        browser.get(bound.url + SCOPE + "/review")
        assert browser.find_element(By.TAG_NAME, "h1").text == "Review queue"
    finally:
        bound.stop()


def test_sign_in_with_openid_connect(world: World, browser, shots: Path) -> None:
    """A team's sign-in: authorization code + PKCE at the tests' real OpenID provider (public
    client mcp-client), roles from the policy data for that issuer's subjects: alice reviews
    acme/main (and her decision is audited under her), bob holds nothing."""

    from tests.support.idp_support import PASSWORDS, PUBLIC_CLIENT, start_idp

    idp = start_idp(world.root, resources={})
    port = free_port()
    try:
        def alice_reviews(data: dict) -> None:
            data["engram"]["config"]["console"]["issuers"] = {idp.issuer: {"groups_claim": "groups", "groups": {},
                "subjects": {"alice": [{"tenant": TENANT, "workspaces": [WORKSPACE], "roles": ["reviewer"]}]}}}

        policies = policies_copy(world.root / "team-policies", alice_reviews)
        config = world.root / "console.toml"
        config.write_text(
            f'[console]\ncore = "{world.running.address}"\nhost_key = "{world.running.host_key_path}"\n'
            f'listen = "127.0.0.1:{port}"\nscopes = ["{TENANT}/{WORKSPACE}"]\npolicies = "{policies}"\n'
            f'[[console.oidc]]\nissuer = "{idp.issuer}"\nclient_id = "{PUBLIC_CLIENT}"\nscopes = "openid"\n')
        team = start_console_toml(config, world.root / "team-console.log")
        try:
            browser.delete_all_cookies()
            browser.get(team.url + "/signin")
            assert browser.find_elements(By.LINK_TEXT, f"Sign in with {idp.issuer}")
            status, _, body = http("GET", team.url + "/oauth/callback?state=forged&code=forged")
            assert status == 403 and "could not be verified" in body  # no state of this browser's
            assert not browser.find_elements(By.ID, "token")  # no local token configured
            # Sent to sign in by the review queue, alice comes back to it: the return path is kept
            # with the state on the console (a relative path of its own), not carried by the provider.
            browser.get(team.url + SCOPE + "/review")
            assert browser.current_url == team.url + "/signin?next=%2Fs%2Facme%2Fmain%2Freview"
            link = browser.find_element(By.LINK_TEXT, f"Sign in with {idp.issuer}").get_attribute("href")
            assert link.endswith("&next=/s/acme/main/review")
            callback, state = openid_authorize(team.url, idp.issuer, "alice", PASSWORDS["alice"],
                                               next_page=SCOPE + "/review")
            assert "review" not in callback  # nothing of it reaches the provider's redirect
            browser.add_cookie({"name": "engram_console_oidc", "value": state, "path": "/oauth/callback",
                                "httpOnly": True, "sameSite": "Lax"})
            browser.get(callback)  # the provider's redirect back; the page continues without script
            WebDriverWait(browser, 30).until(lambda b: b.current_url == team.url + SCOPE + "/review")
            assert browser.find_element(By.TAG_NAME, "h1").text == "Review queue"
            principal = browser.find_element(By.ID, "who").text
            assert principal == f"oidc:alice@{idp.issuer.removeprefix('http://')}"
            browser.get(team.url + "/")
            assert "reviewer" in browser.find_element(By.TAG_NAME, "table").text
            _shot(browser, shots, "09-openid-home")
            browser.get(team.url + SCOPE + "/audit")  # a reviewer is no auditor
            assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
            keep, status = world.hand.capture_and_admit(TENANT, WORKSPACE, "decision: alice's queue item")
            assert status == "pending_adjudication"
            browser.get(team.url + SCOPE + "/review")
            browser.find_element(By.ID, f"reason-{keep}").send_keys("alice reviewed it")
            submit(browser, browser.find_element(By.CSS_SELECTOR, f"form[action$='/{keep}/decide'] button.accept"))
            assert browser.find_element(By.ID, "decided").text == "Decided: accepted."
            rows = world.hand.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE,
                                                                       what="audit"))["items"]
            assert [r["principal"] for r in rows if r["operation"] == "admin.adjudicate"][-1] == principal

            browser.delete_all_cookies()
            browser.get(team.url + "/signin")
            callback, state = openid_authorize(team.url, idp.issuer, "bob", PASSWORDS["bob"],
                                               next_page="//evil.example/")  # dropped: bob lands on /
            browser.add_cookie({"name": "engram_console_oidc", "value": state, "path": "/oauth/callback",
                                "httpOnly": True, "sameSite": "Lax"})
            browser.get(callback)
            assert _after_continue(browser).find_element(By.ID, "no-scopes").is_displayed()
            browser.get(team.url + SCOPE + "/review")
            assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
        finally:
            team.stop()
    finally:
        idp.stop()
