"""Helpers for the console's browser tests: a real core, real `engram console` processes, a
headless Debian Chromium driven by Selenium through the system chromedriver, and agents that
capture through MemoryService exactly as the MCP adapter would.

Nothing of ours is mocked. A missing browser is a failure that names `tools/setup --tests`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from engram_core.api import admin_pb2, admin_pb2_grpc, memory_pb2, memory_pb2_grpc
from engram_core.policy import default_bundle_dir
from engram_core.rpc.convert import message_to_value, value_to_message
from engram_core.trust.hostctx import ADMIN_CALL, CONTEXT_METADATA_KEY, make_context
from engram_core.trust.hostkeys import load_private_key_file

PURPOSE = "purpose:eng"
TENANT, WORKSPACE, OTHER = "acme", "main", "globex"
ENGRAM = Path(sys.executable).with_name("engram")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def policies_copy(dest: Path, edit) -> Path:
    """The bundled policies with data.json changed by ``edit(data)``: a deployment's own data."""
    shutil.copytree(default_bundle_dir(), dest)
    data_path = dest / "data.json"
    data = json.loads(data_path.read_text())
    edit(data)
    data_path.write_text(json.dumps(data))
    return dest


class CoreHand:
    """A host and its agents against one running core (signed contexts, as in tests/admin)."""

    def __init__(self, address: str, host_key_path: str) -> None:
        self.key = load_private_key_file(host_key_path)
        self.channel = grpc.insecure_channel(address)
        self.admin_stub = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.memory_stub = memory_pb2_grpc.MemoryServiceStub(self.channel)
        self.epochs: dict[tuple[str, str], int] = {}

    def revoke(self, tenant: str, workspace: str) -> int:
        """`engram admin revoke`: the scope's contexts of older epochs are refused from now on."""
        epoch = int(self.admin("Revoke", admin_pb2.ScopeRequest(tenant=tenant, workspace=workspace))[
            "authorization_epoch"])
        self.epochs[(tenant, workspace)] = epoch
        return epoch

    def close(self) -> None:
        self.channel.close()

    def admin(self, rpc: str, request: Any) -> dict[str, Any]:
        ctx = make_context(self.key, call=ADMIN_CALL, tenant="_host", workspace="_admin", principal="host:test",
                           agent_id="test", session="s", now_ms=time.time_ns() // 1_000_000, host_principal=True,
                           maintenance_scopes=("read", "maintain"), memory_enabled=False)
        return json.loads(getattr(self.admin_stub, rpc)(request, metadata=[(CONTEXT_METADATA_KEY, ctx)],
                                                        timeout=30).json)

    def activate(self, tenant: str, workspace: str) -> None:
        self.admin("Activate", admin_pb2.ActivateRequest(tenant=tenant, workspace=workspace))

    def state_of(self, tenant: str, workspace: str, candidate_id: str) -> str:
        return self.admin("InspectCandidate", admin_pb2.InspectRequest(
            tenant=tenant, workspace=workspace, candidate_id=candidate_id))["state"]

    def _mem(self, tenant: str, workspace: str, tool: str, rpc: str, args: dict[str, Any], req_cls) -> dict[str, Any]:
        ctx = make_context(self.key, call=tool, tenant=tenant, workspace=workspace, principal="user:ana", agent_id="a",
                           session="s", purpose_ref=PURPOSE, now_ms=time.time_ns() // 1_000_000,
                           authorization_epoch=self.epochs.get((tenant, workspace), 0))
        resp = getattr(self.memory_stub, rpc)(value_to_message(args, req_cls()),
                                              metadata=[(CONTEXT_METADATA_KEY, ctx)], timeout=30)
        return message_to_value(resp)

    def capture_and_admit(self, tenant: str, workspace: str, text: str) -> tuple[str, str]:
        """(candidate id, admission status) of one capture an agent makes and asks to admit."""
        now = time.time_ns() // 1_000_000
        payload = {
            "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": now - 1000},
            "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["cit1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": now, "type_ref": "event:decision", "citation_id": "cit1"},
            "citations": [{"citation_id": "cit1", "source_ref": "doc:adr-7",
                           "locator": {"scheme": "path", "value": "docs/adr/7.md"},
                           "content_digest": "sha256:" + "a" * 64}],
        }
        args = {"idempotency_key": "key-" + secrets.token_hex(8), "payload": payload,
                "evidence": {"evidence_ref": "ev:1", "evidence_digest": "sha256:" + "b" * 64, "citation_ids": ["cit1"]}}
        cand = self._mem(tenant, workspace, "engram_memory_capture", "Capture", args,
                         memory_pb2.CaptureRequest)["candidate_id"]
        out = self._mem(tenant, workspace, "engram_memory_request_admission", "RequestAdmission",
                        {"candidate_id": cand, "idempotency_key": "adm-" + secrets.token_hex(8)},
                        memory_pb2.RequestAdmissionRequest)["outcome"]
        return cand, out["status"]


@dataclass
class ConsoleProc:
    """One `engram console` process (the installed console script) and its base URL."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class World:
    running: Any  # engram_core.app.composition.RunningCore
    hand: CoreHand
    console: ConsoleProc
    token: str
    token_file: Path
    root: Path


def start_console(address: str, host_key: str, token_file: Path, scopes: list[str], log: Path,
                  policies: Path | None = None, env: dict[str, str] | None = None) -> ConsoleProc:
    port = free_port()
    cmd = [str(ENGRAM), "console", "--core", address, "--host-key", host_key, "--listen", f"127.0.0.1:{port}",
           "--token-file", str(token_file)]
    for s in scopes:
        cmd += ["--scope", s]
    if policies is not None:
        cmd += ["--policies", str(policies)]
    out = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return wait_ready(proc, f"http://127.0.0.1:{port}", log)


def http(method: str, url: str, *, cookie: str = "", form: dict[str, str] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of one request, redirects not followed."""
    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:
            return None

    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={**({"Cookie": cookie} if cookie else {}), **(headers or {})})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


DOC_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
DOC_SHOT_MAX_BYTES = 150_000


def doc_shot(browser, name: str) -> None:
    """With ENGRAM_CONSOLE_DOC_SHOTS=1, the page as docs/console/NAME.png for docs/console.md, taken
    at a small window (the tests' scopes hold made-up data only) and refused over 150 KB."""
    if os.environ.get("ENGRAM_CONSOLE_DOC_SHOTS") != "1":
        return
    browser.set_window_size(1100, 820)
    try:
        png = browser.get_screenshot_as_png()
    finally:
        browser.set_window_size(1280, 900)
    assert len(png) < DOC_SHOT_MAX_BYTES, f"{name}.png is {len(png)} bytes"
    DOC_SHOTS.mkdir(exist_ok=True)
    (DOC_SHOTS / f"{name}.png").write_bytes(png)


def chrome():
    """A headless Chromium through the system chromedriver (Debian's chromium, chromium-driver)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        raise AssertionError("chromium and chromedriver are needed for the console's browser tests: "
                             "run tools/setup --tests (it installs Debian's chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    os.environ.setdefault("SE_AVOID_STATS", "true")
    os.environ.setdefault("SE_OFFLINE", "true")  # never a browser or driver download
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def submit(browser, button, timeout_s: float = 30) -> None:
    """Press a form's button and wait for the page it brings, fully loaded, so nothing is read
    from the page being left.

    Selenium's ``staleness_of`` asks the old button whether it is enabled and counts only
    StaleElementReferenceException as gone. While the old document is being replaced,
    chromedriver can instead answer "Node with given id does not belong to the document" (an
    inspector error, seen in CI): the node is in no current document, which is the same fact."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.wait import WebDriverWait

    def left(_driver) -> bool:
        try:
            button.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as e:
            if "does not belong to the document" in (e.msg or ""):
                return True
            raise
        return False

    button.click()
    WebDriverWait(browser, timeout_s).until(left)
    # The driver's own probe (DevTools, not page script: the console's CSP allows none).
    WebDriverWait(browser, timeout_s).until(lambda b: b.execute_script("return document.readyState") == "complete")


def start_console_toml(config: Path, log: Path) -> ConsoleProc:
    """`engram console --config FILE` (its [console] table names everything, the listen address too)."""
    import tomllib

    listen = tomllib.loads(config.read_text())["console"]["listen"]
    out = log.open("wb")
    proc = subprocess.Popen([str(ENGRAM), "console", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT)
    return wait_ready(proc, f"http://{listen}", log)


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, ssl_context: Any = None) -> ConsoleProc:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/signin", timeout=2, context=ssl_context).close()
            return ConsoleProc(proc, url, log)
        except (urllib.error.URLError, ConnectionError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"engram console did not start: {log.read_text(errors='replace')}") from None
            time.sleep(0.05)  # as the suite's other readiness polls: each start waits on this


def openid_authorize(console_url: str, issuer: str, login: str, password: str, next_page: str = "") -> tuple[str, str]:
    """What a person does at the tests' OpenID provider (its interaction is a JSON API, no pages):
    start at the console's sign-in link, sign in, consent. Returns (the console callback URL the
    provider redirects to, the state cookie the console set for it)."""
    import http.cookiejar
    from urllib.parse import urljoin, urlsplit

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:
            return None

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), _NoRedirect)

    def send(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
        try:
            with opener.open(req, timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read().decode()

    url = console_url + "/signin/oidc?" + urllib.parse.urlencode({"issuer": issuer, **({"next": next_page} if next_page else {})})
    for _ in range(12):
        status, headers, body = send(url)
        if "/interaction/" in urlsplit(url).path:
            prompt = json.loads(body)["prompt"]
            status, headers, body = send(url + ("/login" if prompt == "login" else "/consent"),
                                         {"login": login, "password": password} if prompt == "login" else {"reject": []})
        location = headers.get("Location") or headers.get("location")
        assert location, f"the sign-in stopped at {status} {url}: {body[-500:]}"
        url = urljoin(url, location)
        if url.startswith(console_url + "/oauth/callback"):
            state = next(c.value for c in jar if c.name == "engram_console_oidc")
            return url, state
    raise AssertionError("too many redirects")
