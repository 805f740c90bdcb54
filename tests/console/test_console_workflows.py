"""The console's workflows beyond the first pages (issue 61): the Policy page's replay of a
candidate bundle against the core's real decision log (a transition shown with its example; a
person without the replay action cannot run it), the Memory page browsing a scope without a query
(newest first, paged, filtered by state), and a return to the page that sent a person to sign in.

A real `engram serve --decision-log` process (the log the replay reads), real `engram console`
processes configured by TOML, one headless Chromium. The tests run in order."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from engram_core.api import admin_pb2
from tests.support.console_support import (
    OTHER,
    TENANT,
    WORKSPACE,
    ConsoleProc,
    CoreHand,
    doc_shot,
    free_port,
    http,
    policies_copy,
    start_console_toml,
    submit,
)
from tests.support.policy_support import serve

SCOPE = f"/s/{TENANT}/{WORKSPACE}"
TOKEN = "local-token-for-the-console-workflow-tests-0123"


@dataclass
class Served:
    core: object  # policy_support.Served
    hand: CoreHand
    console: ConsoleProc
    root: Path
    log: Path
    key: Path
    candidates: Path
    core_policies: Path


def _held(data: dict) -> None:
    data["engram"]["config"]["tenants"][TENANT] = {"adjudication_trust_classes": ["asserted"]}


def _console_toml(root: Path, name: str, address: str, host_key: Path, token_file: Path, policies: Path,
                  candidates: Path, log: Path, key: Path) -> ConsoleProc:
    config = root / f"{name}.toml"
    config.write_text(
        f'[console]\ncore = "{address}"\nhost_key = "{host_key}"\nlisten = "127.0.0.1:{free_port()}"\n'
        f'scopes = ["{TENANT}/{WORKSPACE}"]\npolicies = "{policies}"\ntoken_file = "{token_file}"\n'
        f'[console.replay]\ncandidates = "{candidates}"\ndecision_logs = ["{log}"]\npseudonym_key = "{key}"\n')
    return start_console_toml(config, root / f"{name}.log")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("console-workflows")
    log = root / "decisions.jsonl"
    core_policies = policies_copy(root / "core-policies", _held)
    core = serve(root / "data", "--decision-log", f"file:{log}", "--policies", str(core_policies))
    hand = CoreHand(core.address, str(root / "data" / "host.key"))
    console = None
    try:
        hand.activate(TENANT, WORKSPACE)
        hand.activate(OTHER, WORKSPACE)
        token_file = root / "host.token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        candidates = root / "candidates"
        candidates.mkdir()
        monkeypatch_module.setenv("ENGRAM_CONSOLE_MEMORY_PAGE", "4")
        console = _console_toml(root, "console", core.address, root / "data" / "host.key", token_file,
                                core_policies, candidates, log, root / "data" / "decision-log.key")
        yield Served(core, hand, console, root, log, root / "data" / "decision-log.key", candidates, core_policies)
    finally:
        if console is not None:
            console.stop()
        hand.close()
        core.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _sign_in(browser, url: str) -> None:
    browser.get(url + "/signin")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    submit(browser, browser.find_element(By.ID, "signin"), 60)


def _logged(log: Path, path: str, outcome_key: str, outcome: str, n: int) -> list[dict]:
    """The decision log's events of ``path`` whose result's ``outcome_key`` is ``outcome``, once
    the core's logger has written ``n`` of them (it writes off the call path)."""
    deadline = time.monotonic() + 60
    while True:
        events = [json.loads(line) for line in (log.read_text().splitlines() if log.exists() else []) if line]
        found = [e for e in events if e.get("path") == path and (e.get("result") or {}).get(outcome_key) == outcome]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_a_candidate_that_flips_a_decision_shows_the_transition(served: Served, browser, shots: Path) -> None:
    cand, status = served.hand.capture_and_admit(TENANT, WORKSPACE, "decision: the queue drains at night")
    assert status == "pending_adjudication"
    _, theirs = served.hand.capture_and_admit(OTHER, WORKSPACE, "decision: globex ships on fridays")
    assert theirs == "accepted"
    held = _logged(served.log, "engram/admission/decision", "decision", "adjudication_required", 1)
    assert held, "the core logged no held admission"
    assert _logged(served.log, "engram/admission/decision", "decision", "accept", 1)  # globex's, elsewhere
    # The candidate: the shipped defaults for acme (no held trust class), under a new revision.
    lenient = served.candidates / "lenient"
    shutil.copytree(served.core_policies, lenient)
    data = json.loads((lenient / "data.json").read_text())
    del data["engram"]["config"]["tenants"][TENANT]
    (lenient / "data.json").write_text(json.dumps(data))
    (lenient / ".manifest").write_text(json.dumps({"revision": "lenient-1", "roots": ["engram"]}))
    (served.candidates / "..hidden").mkdir()  # not a name the form may carry

    _sign_in(browser, served.console.url)
    browser.get(served.console.url + SCOPE + "/policy")
    options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#candidate option")]
    assert options == ["lenient"], browser.find_element(By.ID, "replay-section").text
    Select(browser.find_element(By.ID, "candidate")).select_by_value("lenient")
    Select(browser.find_element(By.ID, "window")).select_by_value("24h")
    submit(browser, browser.find_element(By.ID, "run-replay"), 60)
    assert browser.find_element(By.TAG_NAME, "h1").text == "Replay of lenient"
    rows = {(tr.find_element(By.CSS_SELECTOR, "td.path").text, tr.find_element(By.CSS_SELECTOR, "td.label").text):
            tr for tr in browser.find_elements(By.CSS_SELECTOR, "#transitions tr.transition")}
    flip = rows[("engram/admission/decision", "adjudication_required→accept")]
    assert flip.find_element(By.CSS_SELECTOR, "td.count").text == "1"
    assert "TRUST_CLASS_REQUIRES_ADJUDICATION" in flip.text  # the reason that disappears
    example = flip.find_element(By.CSS_SELECTOR, "p.example").text
    assert held[0]["audit_id"] in example
    # Only acme's decisions were replayed: globex's accepted admission is in the log, not here.
    summary = browser.find_element(By.ID, "replay-summary").text
    assert "globex" not in browser.page_source
    replayed = {tr.find_element(By.CSS_SELECTOR, "td.path").text: tr.text
                for tr in browser.find_elements(By.CSS_SELECTOR, "#replayed-paths tbody tr")}
    assert "accept: " not in replayed["engram/admission/decision"], replayed  # acme's one was held
    log_events = len([ln for ln in served.log.read_text().splitlines() if ln])
    assert f"({log_events} in the log)" in summary or "in the log" in summary
    _shot(browser, shots, "policy-replay")
    doc_shot(browser, "policy-replay")

    # A name the directory does not list (a path out of it) is refused, nothing run.
    csrf = browser.find_element(By.CSS_SELECTOR, "form.signout input[name=csrf]").get_attribute("value")
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
    for bad in ("../core-policies", "..hidden", "/etc", "lenient/../../core-policies"):
        status, _, body = http("POST", served.console.url + SCOPE + "/policy/replay", cookie=cookie,
                               form={"csrf": csrf, "candidate": bad, "window": "24h"})
        assert status == 400 and "Choose one of the candidate bundles listed" in body, bad
    status, _, _ = http("POST", served.console.url + SCOPE + "/policy/replay", cookie=cookie,
                        form={"csrf": "wrong", "candidate": "lenient", "window": "24h"})
    assert status == 403


def test_a_person_without_the_replay_action_cannot_run_it(served: Served, browser) -> None:
    def no_replay(data: dict) -> None:
        _held(data)
        data["engram"]["config"]["console"]["replay_roles"] = []

    policies = policies_copy(served.root / "no-replay-policies", no_replay)
    other = _console_toml(served.root, "no-replay", served.core.address, served.root / "data" / "host.key",
                          served.root / "host.token", policies, served.candidates, served.log, served.key)
    try:
        browser.delete_all_cookies()
        _sign_in(browser, other.url)
        browser.get(other.url + SCOPE + "/policy")
        assert browser.find_element(By.ID, "replay-not-granted").is_displayed()  # policy.view, not policy.replay
        assert not browser.find_elements(By.ID, "run-replay")
        csrf = browser.find_element(By.CSS_SELECTOR, "form.signout input[name=csrf]").get_attribute("value")
        cookie = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
        status, _, body = http("POST", other.url + SCOPE + "/policy/replay", cookie=cookie,
                               form={"csrf": csrf, "candidate": "lenient", "window": "24h"})
        assert status == 404 and "Replay of" not in body
    finally:
        other.stop()
        browser.delete_all_cookies()


def _accept(served: Served, text: str) -> str:
    cand, status = served.hand.capture_and_admit(TENANT, WORKSPACE, text)
    assert status == "pending_adjudication"
    out = served.hand.admin("Adjudicate", admin_pb2.AdjudicateRequest(
        tenant=TENANT, workspace=WORKSPACE, candidate_id=cand, decision="accept", reason_ref="r:test",
        event_id="evt_test_" + cand[-12:]))
    return out["outcome"]["record_id"]


def test_memory_browses_a_scope_newest_first_paged_and_by_state(served: Served, browser, shots: Path) -> None:
    markup = "<b>bold</b> browsing decision"
    records = [_accept(served, markup)]
    records += [_accept(served, f"decision {i}: shard {i} moves to the new cluster") for i in range(5)]
    _sign_in(browser, served.console.url)
    browser.get(served.console.url + SCOPE + "/memory")
    doc_shot(browser, "memory")
    shown: list[str] = []
    content: dict[str, str] = {}
    for _ in range(20):  # newest first, page after page (4 journal events a page), to the oldest
        for tr in browser.find_elements(By.CSS_SELECTOR, "#results tbody tr"):
            if not tr.find_elements(By.CSS_SELECTOR, "td.digest"):
                continue  # "No records.": a window of journal events naming none (captures, held admissions)
            rid = tr.find_element(By.CSS_SELECTOR, "td.digest").text
            shown.append(rid)
            content[rid] = tr.find_element(By.CSS_SELECTOR, "td.content").text
        assert browser.find_elements(By.CSS_SELECTOR, "#results b") == []  # markup shown as text only
        older = browser.find_elements(By.ID, "older")
        if not older:
            break
        submit(browser, older[0], 60)
    ours = [r for r in shown if r in records]
    assert ours == list(reversed(records)), shown  # every record once, newest first, over several pages
    assert markup in content[records[0]]
    assert "shard 4 moves" in content[records[-1]]
    browser.get(served.console.url + SCOPE + "/memory")
    first = browser.find_element(By.CSS_SELECTOR, "#results tbody tr")
    assert first.find_element(By.CSS_SELECTOR, "td.digest").text == records[-1]
    assert browser.find_elements(By.ID, "older")  # one page does not hold them all
    _shot(browser, shots, "memory-browse")
    # The reads are audited under the person, one engram_memory_get per record shown.
    rows = served.hand.admin("Export", admin_pb2.ExportRequest(tenant=TENANT, workspace=WORKSPACE,
                                                                what="audit"))["items"]
    gets = [r for r in rows if r["operation"].endswith("engram_memory_get") and r["principal"] == "local:owner"]
    assert gets and all(r["agent_id"] == "engram-console" for r in gets), gets[-1:]
    assert len(gets) >= len(shown) + 1  # every record of every page read, and the first page again
    # Withdrawn: none; accepted_current: only current records.
    Select(browser.find_element(By.ID, "state")).select_by_value("withdrawn")
    submit(browser, browser.find_element(By.ID, "filter"), 60)
    assert browser.find_elements(By.CSS_SELECTOR, "#results td.digest") == []
    assert "state=withdrawn" in browser.current_url
    browser.get(served.console.url + SCOPE + "/memory?state=accepted_current")
    states = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#results td.state")]
    assert states and set(states) == {"accepted_current"}
    older = browser.find_elements(By.ID, "older")
    assert older and "state=accepted_current" in older[0].get_attribute("href")


def test_a_forget_an_agent_asked_for_waits_on_the_confirmations_pages(served: Served, browser) -> None:
    """What an MCP client without form elicitation sends a person to: the adapter parks the forget
    in the core (HostService.ParkConfirmation, signed here with the host key as the adapter signs
    it), and the console lists it and shows what will happen. (The whole flow through the real
    adapter, approval included, is test_console_url_confirmation.py.)"""
    import grpc

    from engram_core.api import host_pb2, host_pb2_grpc
    from engram_core.contract.operation import operation_digest
    from engram_core.trust.hostctx import CONTEXT_METADATA_KEY, HOST_CALL, make_context

    record = _accept(served, "decision: the staging bucket is deleted after each release")
    args = {"record_id": record, "reason_ref": "reason:user-asked"}
    digest = operation_digest(tool="engram_memory_forget", tenant=TENANT, workspace=WORKSPACE, principal="user:ana",
                              arguments=args)
    ctx = make_context(served.hand.key, call=HOST_CALL, tenant=TENANT, workspace=WORKSPACE, principal="user:ana",
                       agent_id="a", session="s", purpose_ref="purpose:eng", now_ms=time.time_ns() // 1_000_000)
    with grpc.insecure_channel(served.core.address) as channel:
        parked = host_pb2_grpc.HostServiceStub(channel).ParkConfirmation(host_pb2.ParkConfirmationRequest(
            tool="engram_memory_forget", target=record, reason_ref="reason:user-asked", operation_digest=digest,
            ttl_ms=300_000), metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=30)
    browser.get(served.console.url + "/confirmations")
    assert parked.confirmation_id in browser.find_element(By.ID, "main").get_attribute("innerHTML")
    assert record in browser.find_element(By.ID, "main").text
    doc_shot(browser, "confirmations")
    browser.get(served.console.url + "/confirmations/" + parked.confirmation_id)
    page = browser.find_element(By.ID, "main").text
    assert record in page and "reason:user-asked" in page and "user:ana" in page
    assert browser.find_elements(By.CSS_SELECTOR, "button[value=approve]")
    doc_shot(browser, "confirmation")
    submit(browser, browser.find_element(By.CSS_SELECTOR, "button[value=deny]"), 60)  # nobody waits for it here
    assert "denied" in browser.find_element(By.ID, "main").text.lower()


def test_sign_in_returns_to_the_page_that_sent_the_person(served: Served, browser) -> None:
    browser.delete_all_cookies()
    browser.get(served.console.url + SCOPE + "/memory?state=accepted_current")
    assert "/signin?next=" in browser.current_url
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    submit(browser, browser.find_element(By.ID, "signin"), 60)
    assert browser.current_url == served.console.url + SCOPE + "/memory?state=accepted_current"
    # A next that leaves the console is dropped: the sign-in goes to /.
    for bad in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        browser.delete_all_cookies()
        browser.get(served.console.url + "/signin?" + __import__("urllib.parse").parse.urlencode({"next": bad}))
        assert not browser.find_elements(By.CSS_SELECTOR, "input[name=next]")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        submit(browser, browser.find_element(By.ID, "signin"), 60)
        assert browser.current_url == served.console.url + "/"


def _shot(browser, shots: Path, name: str) -> None:
    browser.save_screenshot(str(shots / f"{name}.png"))
