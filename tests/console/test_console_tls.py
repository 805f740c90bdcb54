"""`engram console` over TLS (no browser): the session cookie is `__Host-` prefixed and Secure
besides HttpOnly and SameSite=Strict, and every answer carries HSTS. The console contacts the core
only for scope pages, so sign-in and the home page need no core here."""

from __future__ import annotations

import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from engram_core.trust.hostkeys import load_or_create_private_key
from tests.support.console_support import ENGRAM, ConsoleProc, free_port, wait_ready
from tests.support.tls_support import Authority


def _request(url: str, ctx: ssl.SSLContext, *, cookie: str = "", form: dict[str, str] | None = None
             ) -> tuple[int, Any, str]:
    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:
            return None

    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx), _NoRedirect)
    data = None if form is None else urllib.parse.urlencode(form).encode()
    req = urllib.request.Request(url, data=data, headers={"Cookie": cookie} if cookie else {})
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode()


def test_session_cookie_under_tls(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    server = ca.issue("console", server=True)
    key = tmp_path / "console-host.key"
    load_or_create_private_key(key)
    token = tmp_path / "host.token"
    token.write_text("tls-test-token\n")
    port = free_port()
    log = tmp_path / "console.log"
    proc = subprocess.Popen([str(ENGRAM), "console", "--core", "127.0.0.1:1", "--host-key", str(key), "--listen",
                             f"127.0.0.1:{port}", "--tls-cert", str(server.cert), "--tls-key", str(server.key),
                             "--token-file", str(token), "--scope", "acme/main"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    url = f"https://127.0.0.1:{port}"
    console: ConsoleProc | None = None
    try:
        console = wait_ready(proc, url, log, ssl_context=ctx)
        status, headers, _ = _request(url + "/signin", ctx)
        assert status == 200 and headers["Strict-Transport-Security"].startswith("max-age=")
        pre = next(c for c in headers.get_all("Set-Cookie") if c.startswith("engram_console_pre="))
        assert "Secure" in pre and "HttpOnly" in pre
        pre_value = pre.split(";", 1)[0].split("=", 1)[1]
        status, headers, _ = _request(url + "/signin", ctx, cookie=f"engram_console_pre={pre_value}",
                                      form={"csrf": pre_value, "token": "tls-test-token"})
        assert status == 303
        session = next(c for c in headers.get_all("Set-Cookie") if c.startswith("__Host-engram_console="))
        attributes = {a.strip().lower() for a in session.split(";")[1:]}
        assert {"httponly", "secure", "samesite=strict", "path=/"} <= attributes
        assert not any(a.startswith("domain=") for a in attributes)  # a __Host- cookie names no domain
        status, _, body = _request(url + "/", ctx, cookie=session.split(";", 1)[0])
        assert status == 200 and "local:owner" in body
    finally:
        (console.stop() if console else proc.kill())
