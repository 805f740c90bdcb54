"""The console's web application: Starlette routes over server-rendered Jinja templates.

Every page is rendered on the server with autoescaping (no memory text, reason or identifier
reaches the page unescaped), served with a strict Content-Security-Policy (no script at all,
styles from our one CSS file), and answers "not found" for any scope the console does not serve
or on which the policy grants the person nothing: another tenant's ids in a URL are not found,
never forbidden, so a URL reveals nothing.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from engram_core.console import replaying
from engram_core.console.auth import (
    LOCAL_ISSUER,
    LOCAL_SUBJECT,
    OpenIdSignIn,
    Session,
    Sessions,
    SignInFailed,
    local_token_matches,
    same,
)
from engram_core.console.core_client import Actor, CoreClient, CoreError
from engram_core.console.roles import NOTHING, Grant, RoleOracle
from engram_core.console.settings import ConsoleSettings
from engram_core.contract.scope import Scope
from engram_core.policy.bundle import BundleError
from engram_core.rpc.tls import is_loopback_listen, split_listen

HERE = Path(__file__).resolve().parent
CSP = ("default-src 'self'; script-src 'none'; style-src 'self'; img-src 'self'; font-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# Audit rows (by sequence number) per page; ENGRAM_CONSOLE_AUDIT_PAGE overrides it (tests page a
# small timeline with a tiny window).
AUDIT_WINDOW = int(os.environ.get("ENGRAM_CONSOLE_AUDIT_PAGE", "500"))
TOO_LARGE = "INVALID_SCHEMA"  # the code of an answer over gRPC's message bound (engram_core.rpc.status)
# Journal events per page of the Memory page's browsing (each names at most one record read).
MEMORY_WINDOW = int(os.environ.get("ENGRAM_CONSOLE_MEMORY_PAGE", "25"))
PRE_COOKIE = "engram_console_pre"
STATE_COOKIE = "engram_console_oidc"
logger = logging.getLogger("engram.console")


class _Headers(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if request.app.state.console.settings.tls:
            response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
        return response


def _when(ms: Any) -> str:
    try:
        return datetime.fromtimestamp(int(ms) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ms)


class Console:
    """The application's state: settings, the core client, the policy, sessions."""

    def __init__(self, settings: ConsoleSettings, core: CoreClient, roles: RoleOracle) -> None:
        self.settings = settings
        self.core = core
        self.roles = roles
        self.sessions = Sessions()
        self.oidc = OpenIdSignIn(settings.providers, settings.base_url() + "/oauth/callback")
        self.cookie = ("__Host-" if settings.tls else "") + "engram_console"
        self.templates = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                            undefined=jinja2.StrictUndefined)
        self.templates.filters["when"] = _when
        self.templates.filters["clock"] = lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        # The highest audit sequence number / journal cursor a newest page has read, per scope.
        self.seen: dict[tuple[str, str, str], int] = {}
        self.readers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="console-read")  # Memory's reads
        # The last verification per scope: (report or None, refusal code, when), see _verified.
        self.verified: dict[tuple[str, str], tuple[dict[str, Any] | None, str, float]] = {}

    # -- rendering and cookies -----------------------------------------------------------------
    def page(self, name: str, http_status: int = 200, **values: Any) -> HTMLResponse:
        values.setdefault("session", None)
        values.setdefault("scope", None)
        values.setdefault("grant", NOTHING)
        values.setdefault("tab", "")
        return HTMLResponse(self.templates.get_template(name).render(**values), status_code=http_status)

    def not_found(self, session: Session | None) -> HTMLResponse:
        return self.page("error.html", 404, session=session, title="Not found",
                         message="There is nothing here for you.")

    def set_cookie(self, response: Response, name: str, value: str, *, path: str = "/", same_site: str = "strict",
                   max_age: int | None = None) -> None:
        response.set_cookie(name, value, path=path, httponly=True, samesite=same_site, secure=self.settings.tls,
                            max_age=max_age)

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(self.cookie))

    def grant(self, session: Session, scope: Scope) -> Grant:
        if scope not in self.settings.scopes:
            return NOTHING  # a scope the console does not serve is nobody's
        return self.roles.grant(subject=session.subject, issuer=session.issuer, claims=session.claims, scope=scope)

    @staticmethod
    def actor(session: Session) -> Actor:
        return Actor(session.principal, session.audit_session)


def _console(request: Request) -> Console:
    return request.app.state.console


def _signin_redirect() -> RedirectResponse:
    return RedirectResponse("/signin", status_code=303)


# -- sign-in ---------------------------------------------------------------------------------------
async def signin_form(request: Request) -> Response:
    c = _console(request)
    pre = request.cookies.get(PRE_COOKIE) or _new_token()
    response = c.page("signin.html", pre=pre, local=bool(c.settings.token_file),
                      issuers=sorted(c.oidc.providers), failed=request.query_params.get("failed") == "1",
                      next=_next_page(request.query_params.get("next", "")))
    c.set_cookie(response, PRE_COOKIE, pre, max_age=3600)
    return response


# A path of this console and its query: one or more non-empty segments of unreserved characters
# (so no "//host", no scheme, no backslash, no dot-segment tricks beyond what the router resolves
# itself), a query of plain characters. Anything else signs in to /.
_NEXT = re.compile(r"/(?:[A-Za-z0-9_~-][A-Za-z0-9._~-]*(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*)?"
                   r"(?:\?[A-Za-z0-9._~=&%+-]{0,400})?")


def _next_page(path: str) -> str:
    """Where to go after signing in: a same-origin relative path of this console (the page that
    sent the person to sign in, e.g. a confirmation link an MCP client opened), never an address a
    link could choose; "" (then /) for anything else, and for the sign-in pages themselves."""
    if len(path) > 512 or not _NEXT.fullmatch(path) or path.startswith(("/signin", "/oauth", "/signout")):
        return ""
    return path


def _signin_to_return(request: Request) -> RedirectResponse:
    """Sign in first, then come back here (a GET's own path and query)."""
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    page = _next_page(here) if request.method == "GET" else ""
    return RedirectResponse("/signin" + (f"?{urlencode({'next': page})}" if page and page != "/" else ""),
                            status_code=303)


def _new_token() -> str:
    return secrets.token_urlsafe(32)


async def signin(request: Request) -> Response:
    c = _console(request)
    form = await request.form()
    cookie, field = request.cookies.get(PRE_COOKIE, ""), str(form.get("csrf", ""))
    if not cookie or not same(cookie, field):
        return c.page("error.html", 403, title="Refused", message="The form was not this browser's. Reload and try again.")
    path = Path(c.settings.token_file) if c.settings.token_file else None
    if not await run_in_threadpool(local_token_matches, path, str(form.get("token", ""))):
        return RedirectResponse("/signin?failed=1", status_code=303)
    return _signed_in(c, c.sessions.create(LOCAL_SUBJECT, LOCAL_ISSUER, {}),
                      RedirectResponse(_next_page(str(form.get("next", ""))) or "/", status_code=303))


def _signed_in(c: Console, session: Session, response: Response) -> Response:
    c.set_cookie(response, c.cookie, session.sid, max_age=int(8 * 3600))
    response.delete_cookie(PRE_COOKIE, path="/")
    logger.info("console sign-in: %s", session.principal)
    return response


async def oidc_begin(request: Request) -> Response:
    c = _console(request)
    try:
        url, state = await c.oidc.begin(request.query_params.get("issuer", ""),
                                        _next_page(request.query_params.get("next", "")))
    except Exception as exc:  # discovery failures of any kind: the page says so, the log says why
        logger.warning("console OpenID sign-in cannot start: %s", exc)
        return c.page("error.html", 502, title="Sign-in unavailable", message="The identity provider cannot be reached.")
    response = RedirectResponse(url, status_code=303)
    # Lax, not Strict: the provider's redirect back is a cross-site navigation, which must carry it.
    c.set_cookie(response, STATE_COOKIE, state, path="/oauth/callback", same_site="lax", max_age=600)
    return response


async def oidc_callback(request: Request) -> Response:
    c = _console(request)
    q = request.query_params
    try:
        subject, issuer, claims, next_page = await c.oidc.complete(q.get("state", ""), request.cookies.get(STATE_COOKIE, ""),
                                                        q.get("code", ""))
    except SignInFailed as exc:
        logger.warning("console OpenID sign-in refused: %s", exc)
        return c.page("error.html", 403, title="Sign-in refused", message="The sign-in could not be verified.")
    except Exception as exc:  # the provider's token endpoint or key set unreachable, too slow, too big
        logger.warning("console OpenID sign-in cannot complete: %s", exc)
        return c.page("error.html", 502, title="Sign-in unavailable", message="The identity provider cannot be reached.")
    # A page, not a redirect: the browser arrived cross-site, and a SameSite=Strict cookie set now
    # is sent from the next same-site navigation on (which this page makes, without script).
    response = c.page("continue.html", next=_next_page(next_page) or "/")
    response.delete_cookie(STATE_COOKIE, path="/oauth/callback")
    return _signed_in(c, c.sessions.create(subject, issuer, claims), response)


async def signout(request: Request) -> Response:
    c = _console(request)
    session = c.session_of(request)
    form = await request.form()
    if session is None or not same(session.csrf, str(form.get("csrf", ""))):
        return c.page("error.html", 403, session=session, title="Refused", message="Missing or wrong form token.")
    c.sessions.drop(session.sid)
    logger.info("console sign-out: %s", session.principal)
    response = _signin_redirect()
    response.delete_cookie(c.cookie, path="/")
    return response


# -- pages -----------------------------------------------------------------------------------------
async def home(request: Request) -> Response:
    c = _console(request)
    session = c.session_of(request)
    if session is None:
        return _signin_redirect()
    scopes = []
    for served in c.settings.scopes:
        g = await run_in_threadpool(c.grant, session, served)
        if g.actions:
            scopes.append({"tenant": served.tenant, "workspace": served.workspace, "grant": g})
    return c.page("home.html", session=session, scopes=scopes)


def _scoped(action: str):
    """A page of one scope: signed in, served scope, the action granted; else sign-in or not found."""

    def wrap(fn: Callable[..., Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            c = _console(request)
            session = c.session_of(request)
            if session is None:
                return _signin_to_return(request)
            tenant, workspace = request.path_params["tenant"], request.path_params["workspace"]
            g = await run_in_threadpool(c.grant, session, Scope(tenant, workspace))
            if not g.may(action):
                return c.not_found(session)
            scope = {"tenant": tenant, "workspace": workspace}
            try:
                return await fn(request, c, session, g, scope)
            except CoreError as err:
                if err.code == "NOT_FOUND":
                    return c.not_found(session)
                http_status = 409 if err.code in ("ILLEGAL_TRANSITION", "CONFLICT") else 502
                return c.page("error.html", http_status, session=session, scope=scope, grant=g, title="The core refused",
                              message=f"{err.code}: {err.message}")
        return endpoint
    return wrap


@_scoped("review.view")
async def review(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    items = await run_in_threadpool(c.core.adjudication_list, c.actor(session), Scope(scope["tenant"], scope["workspace"]))
    return c.page("review.html", session=session, scope=scope, grant=g, items=items, tab="review",
                  decided=request.query_params.get("decided", ""),
                  decided_id=request.query_params.get("candidate", ""))


@_scoped("review.view")
async def candidate(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    view = await run_in_threadpool(c.core.inspect, c.actor(session), Scope(scope["tenant"], scope["workspace"]),
                                   request.path_params["candidate"])
    return c.page("candidate.html", session=session, scope=scope, grant=g, c=view, tab="review")


@_scoped("review.decide")
async def decide(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    form = await request.form()
    if not same(session.csrf, str(form.get("csrf", ""))):
        return c.page("error.html", 403, session=session, scope=scope, grant=g, title="Refused",
                      message="Missing or wrong form token: nothing was changed.")
    decision, reason = str(form.get("decision", "")), str(form.get("reason", "")).strip()
    if decision not in ("accept", "reject") or not reason or len(reason.encode()) > 512:
        return c.page("error.html", 400, session=session, scope=scope, grant=g, title="Not sent",
                      message="Choose accept or reject and give a reason (1 to 512 bytes).")
    outcome = await run_in_threadpool(c.core.adjudicate, c.actor(session), Scope(scope["tenant"], scope["workspace"]),
                                      request.path_params["candidate"], decision, reason)
    url = request.url_for("review", tenant=scope["tenant"], workspace=scope["workspace"]).path
    query = urlencode({"decided": outcome.get("status", ""), "candidate": request.path_params["candidate"]})
    return RedirectResponse(url + "?" + query, status_code=303)


async def _verified(request: Request, c: Console, session: Session, scope: dict[str, str], *, again: bool = False
                    ) -> tuple[dict[str, Any] | None, str, float]:
    """(the scope's verification report or None, the refusal's code, when it was made).

    Verify reads every chain of the store, O(store): the console keeps the last report per scope
    and verifies again only when asked (``?verify=1``, the page's button) or when it has none, so
    paging the timeline stays fast at any size."""
    key = (scope["tenant"], scope["workspace"])
    cached = c.verified.get(key)
    if cached is not None and request.query_params.get("verify") != "1" and not again:
        return cached
    try:
        report: dict[str, Any] | None = await run_in_threadpool(c.core.verify, c.actor(session), Scope(*key))
        refusal = ""
    except CoreError as err:
        # A console key bound to some tenants only may not read the whole store (HOST_KEY_NOT_BOUND).
        report, refusal = None, err.code
    c.verified[key] = (report, refusal, time.time())
    return c.verified[key]


async def _audit_window(request: Request, c: Console, session: Session, scope: dict[str, str]) -> dict[str, Any]:
    """The verification report (None when the console key may not verify the store, with the
    refusal's code) and the page of the scope's audit rows ``?before=SEQ`` asks for, newest first.
    The newest page reads from the last known head on without an upper bound, so rows written since
    the last verification are shown too."""
    actor = c.actor(session)
    report, refusal, verified_at = await _verified(request, c, session, scope)
    tenant, workspace = scope["tenant"], scope["workspace"]
    facts = {"report": report, "refusal": refusal, "verified_at": verified_at}
    if report is None:  # no head known: the scope's whole timeline, newest AUDIT_WINDOW shown
        rows = await run_in_threadpool(c.core.audit, actor, Scope(tenant, workspace), 1, 0)
        rows.sort(key=lambda r: (int(r["at_ms"]), int(r["seq"])), reverse=True)
        return {**facts, "rows": rows[:AUDIT_WINDOW], "older": None, "newer": None}  # one page: all there is
    # No chain's sequence number exceeded the row count at the verification; a newest page read
    # since may have seen higher numbers, which the next newest page starts from.
    head = max(int(report["audit"]["rows"]), c.seen.get((tenant, workspace, "audit"), 0))
    raw = request.query_params.get("before", "")
    before = int(raw) if raw.isdigit() and 1 <= int(raw) <= head else 0  # 0: the newest page
    if before:
        low = max(1, before - AUDIT_WINDOW)
        rows = await run_in_threadpool(c.core.audit, actor, Scope(tenant, workspace), low, before - 1)
    else:
        low = max(1, head + 1 - AUDIT_WINDOW)
        try:
            rows = await run_in_threadpool(c.core.audit, actor, Scope(tenant, workspace), low, 0)
        except CoreError as err:
            if err.code != TOO_LARGE:
                raise
            # More rows since the last verification than one answer may carry (every read a person
            # or agent makes is audited): verify again, once, for a newer head, and read from there.
            report, refusal, verified_at = await _verified(request, c, session, scope, again=True)
            if report is None:
                raise
            facts = {"report": report, "refusal": refusal, "verified_at": verified_at}
            head = max(int(report["audit"]["rows"]), c.seen.get((tenant, workspace, "audit"), 0))
            low = max(1, head + 1 - AUDIT_WINDOW)
            rows = await run_in_threadpool(c.core.audit, actor, Scope(tenant, workspace), low, 0)
        # Every read is audited, so many rows may have come since: the page shows the newest
        # AUDIT_WINDOW sequence numbers, the rest are Older, and the next newest page reads from here.
        top = max((int(r["seq"]) for r in rows), default=head)
        if top > head:
            c.seen[(tenant, workspace, "audit")] = top
        if top + 1 - AUDIT_WINDOW > low:
            low = top + 1 - AUDIT_WINDOW
            rows = [r for r in rows if int(r["seq"]) >= low]
    rows.sort(key=lambda r: (int(r["at_ms"]), int(r["seq"])), reverse=True)
    newer = None if not before else (f"?before={before + AUDIT_WINDOW}" if before + AUDIT_WINDOW <= head else "?")
    return {**facts, "rows": rows, "older": low if low > 1 else None, "newer": newer}


@_scoped("audit.view")
async def audit(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    window = await _audit_window(request, c, session, scope)
    return c.page("audit.html", session=session, scope=scope, grant=g, tab="audit", **window)


@_scoped("policy.view")
async def policy(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    """What the core's policy decided in this scope, per decision path and bundle revision, over
    the same page of the audit the Audit page shows (the audit keeps each decision's path,
    revision and outcome, never its input)."""
    window = await _audit_window(request, c, session, scope)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for row in window["rows"]:
        for d in row.get("decisions") or []:
            if not isinstance(d, dict):
                continue
            result = d.get("result") or {}
            outcome = next((str(result[k]) for k in ("decision", "admission", "action") if k in result),
                           "allowed" if result.get("allow") is True else "denied" if "allow" in result else "-")
            per = counts.setdefault((str(d.get("path", "")), str(d.get("revision", ""))), {})
            per[outcome] = per.get(outcome, 0) + 1
    decisions = [{"path": p, "revision": r, "outcomes": sorted(o.items())} for (p, r), o in sorted(counts.items())]
    return c.page("policy.html", session=session, scope=scope, grant=g, tab="policy", decisions=decisions,
                  chart=bar_chart(decisions),
                  console_revision=c.roles.revision(), rows=len(window["rows"]), older=window["older"],
                  newer=window["newer"], **_replay_choices(c, g))


def _replay_choices(c: Console, g: Grant) -> dict[str, Any]:
    may = g.may("policy.replay") and bool(c.settings.replay_candidates)
    return {"may_replay": may, "replay_configured": bool(c.settings.replay_candidates),
            "candidates": replaying.candidates(c.settings.replay_candidates) if may else [],
            "windows": list(replaying.WINDOWS)}


@_scoped("policy.replay")
async def policy_replay(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    """What a candidate bundle from the configured directory would change in this scope's logged
    decisions: ``engram policy replay``'s computation, over this scope's events of the log."""
    form = await request.form()
    if not same(session.csrf, str(form.get("csrf", ""))):
        return c.page("error.html", 403, session=session, scope=scope, grant=g, title="Refused",
                      message="Missing or wrong form token: nothing was run.")
    if not c.settings.replay_candidates:
        return c.not_found(session)
    name, window = str(form.get("candidate", "")), str(form.get("window", "24h"))
    logger.info("console policy replay of %r over %s by %s on %s/%s", name, window, session.principal,
                scope["tenant"], scope["workspace"])
    try:
        report = await run_in_threadpool(
            replaying.run, candidates_dir=c.settings.replay_candidates, name=name, logs=c.settings.replay_logs,
            key_file=c.settings.replay_pseudonym_key, scope=Scope(scope["tenant"], scope["workspace"]),
            window=window)
    except replaying.ReplayBusy as exc:
        return c.page("error.html", 429, session=session, scope=scope, grant=g, title="Busy", message=str(exc))
    except replaying.ReplayRefused as exc:
        return c.page("error.html", 400, session=session, scope=scope, grant=g, title="Not run", message=str(exc))
    except (BundleError, ValueError, OSError) as exc:
        logger.warning("console policy replay failed: %s", exc)
        return c.page("error.html", 422, session=session, scope=scope, grant=g, title="Replay failed",
                      message=f"The candidate or the decision log could not be read: {exc}")
    return c.page("replay.html", session=session, scope=scope, grant=g, tab="policy", report=report,
                  candidate=name, window=window, **_replay_choices(c, g))


READABLE = ("accepted_current", "accepted_disputed")
MEMORY_STATES = ("accepted_current", "accepted_disputed", "historical", "expired", "withdrawn", "tombstoned",
                 "trust_invalid")


@_scoped("memory.view")
async def memory(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    """Search the scope as the person, under the purpose the policy gave their role: what the core's
    redaction policy leaves of each record for that purpose is what the page shows. Without a query,
    the scope's records newest first (see _browse)."""
    query = request.query_params.get("q", "").strip()
    state = request.query_params.get("state", "")
    state = state if state in MEMORY_STATES else ""
    values: dict[str, Any] = {"query": query, "state": state, "states": MEMORY_STATES, "results": [],
                              "next_page": "", "older": None, "newer": None}
    if query:
        found = await run_in_threadpool(c.core.search, c.actor(session), Scope(scope["tenant"], scope["workspace"]),
                                        g.memory_purpose, query[:1000], request.query_params.get("page", ""))
        values.update(results=found.get("records", []), next_page=found.get("next_page_cursor", ""))
    else:
        values.update(await _browse(request, c, session, g, scope, state))
    return c.page("memory.html", session=session, scope=scope, grant=g, tab="memory", **values)


async def _browse(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str],
                  state: str) -> dict[str, Any]:
    """The records the journal names in one window of MEMORY_WINDOW events, newest first (the
    newest window from the last verified head on, ``?before=CURSOR`` for older ones). Each record is
    read as the person under their purpose (``MemoryService.Get``, redacted and audited like an
    agent's read); one no longer readable shows the state the journal gives it, without content."""
    actor, tenant, workspace = c.actor(session), scope["tenant"], scope["workspace"]
    report, _, _ = await _verified(request, c, session, scope)
    head = next((int(s["head_cursor"]) for s in (report or {}).get("scopes", [])
                 if s.get("tenant") == tenant and s.get("workspace") == workspace), None)
    if head is not None:  # a newest page read since the verification may have seen further
        head = max(head, c.seen.get((tenant, workspace, "journal"), 0))
    raw = request.query_params.get("before", "")
    before = int(raw) if raw.isdigit() and int(raw) >= 1 else 0
    if head is None:  # no head known (the key may not verify): the scope's whole journal, windowed here
        events = await run_in_threadpool(c.core.journal, actor, Scope(tenant, workspace), 1, 0)
        events = [e for e in events if not before or int(e["cursor"]) < before]
    elif before:
        low = max(1, before - MEMORY_WINDOW)
        events = await run_in_threadpool(c.core.journal, actor, Scope(tenant, workspace), low, before - 1)
    else:
        try:
            events = await run_in_threadpool(c.core.journal, actor, Scope(tenant, workspace),
                                             max(1, head + 1 - MEMORY_WINDOW), 0)
        except CoreError as err:
            if err.code != TOO_LARGE:
                raise
            report, _, _ = await _verified(request, c, session, scope, again=True)  # a newer head, once
            head = next((int(s["head_cursor"]) for s in (report or {}).get("scopes", [])
                         if s.get("tenant") == tenant and s.get("workspace") == workspace), None)
            if head is None:
                raise
            events = await run_in_threadpool(c.core.journal, actor, Scope(tenant, workspace),
                                             max(1, head + 1 - MEMORY_WINDOW), 0)
    # Newest first, one window: the newest page read from the last verified head on may hold more
    # (events written since that verification); the rest are on the next pages.
    events = sorted(events, key=lambda e: int(e["cursor"]), reverse=True)[:MEMORY_WINDOW]
    if head is not None and not before and events and int(events[0]["cursor"]) > head:
        c.seen[(tenant, workspace, "journal")] = int(events[0]["cursor"])
    named: dict[str, str] = {}  # record id -> its state in the newest event of this window naming it
    for e in events:
        body = e.get("body") or {}
        rid = body.get("record_id", "") if e.get("operation") == "accept" else e.get("target", "")
        if isinstance(rid, str) and rid.startswith("mem_") and rid not in named:
            named[rid] = str(e.get("to_state", ""))

    def read(rid: str, logged: str) -> dict[str, Any]:
        try:
            return c.core.get(actor, Scope(tenant, workspace), g.memory_purpose, rid)
        except CoreError as err:
            if err.code != "NOT_FOUND":
                raise
            shown = logged if logged not in READABLE else "not readable now"
            return {"record": {"record_id": rid, "state": shown}, "unreadable": True}

    def read_all() -> list[dict[str, Any]]:
        # The filter needs no read of a record the journal already places in another state.
        wanted = [(rid, logged) for rid, logged in named.items()
                  if not state or logged == state or (state in READABLE and logged in READABLE)]
        # A few reads at a time (the channel is shared and thread-safe; the core serves them in parallel).
        rows = list(c.readers.map(lambda item: read(*item), wanted))
        return [r for r in rows if not state or r.get("record", {}).get("state") == state]

    low_cursor = min((int(e["cursor"]) for e in events), default=1)
    return {"results": await run_in_threadpool(read_all), "older": low_cursor if low_cursor > 1 else None,
            "newer": "?" if before else None}


@_scoped("keys.view")
async def keys(request: Request, c: Console, session: Session, g: Grant, scope: dict[str, str]) -> Response:
    # The store's KEK ring and counts, without the per-record list a scoped KeyStatus walks (every
    # record's key, O(records)). A console key bound to some tenants may not ask store-wide: then
    # the scope's own report, whose destroyed records are listed below the generations.
    try:
        report = await run_in_threadpool(c.core.key_status, c.actor(session), Scope("", ""))
    except CoreError as err:
        if err.code != "UNAUTHORIZED":
            raise
        report = await run_in_threadpool(c.core.key_status, c.actor(session), Scope(scope["tenant"], scope["workspace"]))
    destroyed = [r for r in report.get("scope", {}).get("records", []) if r.get("key") == "destroyed"]
    return c.page("keys.html", session=session, scope=scope, grant=g, status=report, destroyed=destroyed, tab="keys")


# -- confirmations (issue 61): a person approves an agent's withdraw or forget in the browser ------------
async def _confirming_scopes(c: Console, session: Session, action: str) -> list[tuple[dict[str, str], Grant]]:
    out = []
    for served in c.settings.scopes:
        g = await run_in_threadpool(c.grant, session, served)
        if g.may(action):
            out.append(({"tenant": served.tenant, "workspace": served.workspace}, g))
    return out


async def confirmations(request: Request) -> Response:
    """Every confirmation waiting for a person on the scopes where this person may see them."""
    c = _console(request)
    session = c.session_of(request)
    if session is None:
        return _signin_to_return(request)
    pending, refused = [], []
    for scope, g in await _confirming_scopes(c, session, "confirm.view"):
        try:
            items = await run_in_threadpool(c.core.confirmations, c.actor(session), Scope(scope["tenant"],
                                            scope["workspace"]))
        except CoreError as err:  # e.g. a console key the core does not let serve this tenant
            refused.append({**scope, "code": err.code})
            continue
        pending.extend({**item, "may_decide": g.may("confirm.decide")} for item in items)
    pending.sort(key=lambda p: int(p["requested_at_ms"]))
    return c.page("confirmations.html", session=session, pending=pending, refused=refused, tab="confirmations")


async def _find_confirmation(c: Console, session: Session, cid: str, action: str
                             ) -> tuple[dict[str, Any], dict[str, str], Grant] | None:
    """The confirmation ``cid`` in a scope where the person may ``action``, else None: another
    tenant's, an unknown or a swept id all look the same (not found)."""
    if not cid.startswith("cfm_") or len(cid) > 100:
        return None
    for scope, g in await _confirming_scopes(c, session, action):
        try:
            found = await run_in_threadpool(c.core.confirmations, c.actor(session), Scope(scope["tenant"],
                                            scope["workspace"]), cid)
        except CoreError as err:
            if err.code in ("NOT_FOUND", "UNAUTHORIZED"):  # not there, or not this console key's to see
                continue
            raise
        if found:
            return found[0], scope, g
    return None


async def confirmation(request: Request) -> Response:
    """One operation an agent asked for, as the core holds it; Approve and Deny for a person who may
    decide (the URL an MCP client without form elicitation opens: it carries only the id)."""
    c = _console(request)
    session = c.session_of(request)
    if session is None:
        return _signin_to_return(request)
    try:
        found = await _find_confirmation(c, session, request.path_params["confirmation"], "confirm.view")
    except CoreError as err:
        return c.page("error.html", 502, session=session, title="The core refused", message=f"{err.code}: {err.message}")
    if found is None:
        return c.not_found(session)
    item, scope, g = found
    return c.page("confirmation.html", session=session, scope=scope, grant=g, tab="confirmations", item=item,
                  done=request.query_params.get("done", ""))


async def confirmation_decide(request: Request) -> Response:
    c = _console(request)
    session = c.session_of(request)
    if session is None:
        return _signin_redirect()
    form = await request.form()
    if not same(session.csrf, str(form.get("csrf", ""))):
        return c.page("error.html", 403, session=session, title="Refused",
                      message="Missing or wrong form token: nothing was changed.")
    decision = str(form.get("decision", ""))
    if decision not in ("approve", "deny"):
        return c.page("error.html", 400, session=session, title="Not sent", message="Choose approve or deny.")
    cid = request.path_params["confirmation"]
    try:
        found = await _find_confirmation(c, session, cid, "confirm.decide")
    except CoreError as err:
        return c.page("error.html", 502, session=session, title="The core refused", message=f"{err.code}: {err.message}")
    if found is None:
        return c.not_found(session)
    _, scope, g = found
    try:
        outcome = await run_in_threadpool(c.core.decide_confirmation, c.actor(session), Scope(scope["tenant"],
                                          scope["workspace"]), cid, decision == "approve")
    except CoreError as err:
        if err.code == "NOT_FOUND":
            return c.not_found(session)
        if err.code == "ALREADY_TERMINAL":
            return c.page("error.html", 409, session=session, scope=scope, grant=g, title="Already answered",
                          message="This confirmation was already answered or has expired: nothing was changed.")
        return c.page("error.html", 502, session=session, scope=scope, grant=g, title="The core refused",
                      message=f"{err.code}: {err.message}")
    logger.info("console confirmation %s by %s", outcome.get("state", ""), session.principal)
    url = request.url_for("confirmation", confirmation=cid).path
    return RedirectResponse(url + "?" + urlencode({"done": outcome.get("state", "")}), status_code=303)


CHART_WIDTH, BAR_HEIGHT, LABEL_WIDTH = 640, 22, 260


def bar_chart(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Geometry of a server-rendered SVG bar chart (no script): one bar per decision path and
    revision, split by outcome, lengths relative to the largest total. The template draws it; the
    table beside it says the same in words for screen readers."""
    totals = [sum(n for _, n in d["outcomes"]) for d in decisions]
    top = max(totals, default=0) or 1
    bars = []
    for i, (d, total) in enumerate(zip(decisions, totals, strict=True)):
        x, parts = float(LABEL_WIDTH), []
        for k, (outcome, n) in enumerate(d["outcomes"]):
            w = (CHART_WIDTH - LABEL_WIDTH - 40) * n / top
            parts.append({"x": round(x, 1), "w": round(w, 1), "outcome": outcome, "n": n, "shade": k % 4})
            x += w
        bars.append({"y": i * (BAR_HEIGHT + 6), "label": d["path"], "total": total, "end": round(x + 4, 1),
                     "parts": parts})
    return bars


async def _not_found(request: Request, exc: Exception) -> Response:
    c = _console(request)
    return c.not_found(c.session_of(request))


async def _failed(request: Request, exc: Exception) -> Response:
    # Outside the header middleware (Starlette answers a 500 from its outermost layer): set them here.
    logger.exception("console page failed", exc_info=exc)
    response = HTMLResponse("<!doctype html><title>Error</title><h1>Something went wrong</h1>"
                            "<p>The console logged the error.</p>", status_code=500)
    response.headers.update(SECURITY_HEADERS)
    return response


def allowed_hosts(settings: ConsoleSettings) -> list[str]:
    """The Host headers the console answers (DNS rebinding: a page of another site that resolves
    its name to the console's address gets 400, not the sign-in form). A wildcard listen address
    without --public-url names no host, so any is answered."""
    from urllib.parse import urlsplit

    host, _ = split_listen(settings.listen)
    hosts = {"127.0.0.1", "localhost"} if is_loopback_listen(settings.listen) else set()
    if host not in ("", "0.0.0.0", "::"):
        hosts.add(host.lower())
    if settings.public_url:
        hosts.add((urlsplit(settings.public_url).hostname or "").lower())
    elif not is_loopback_listen(settings.listen) and host in ("", "0.0.0.0", "::"):
        return ["*"]
    return sorted(h for h in hosts if h)


def build_app(settings: ConsoleSettings, core: CoreClient, roles: RoleOracle) -> Starlette:
    scope = "/s/{tenant}/{workspace}"
    app = Starlette(
        routes=[
            Route("/", home, name="home"),
            Route("/signin", signin_form, methods=["GET"]),
            Route("/signin", signin, methods=["POST"]),
            Route("/signin/oidc", oidc_begin, methods=["GET"]),
            Route("/oauth/callback", oidc_callback, methods=["GET"]),
            Route("/signout", signout, methods=["POST"]),
            Route(scope + "/review", review, name="review"),
            Route(scope + "/candidates/{candidate}", candidate, name="candidate"),
            Route(scope + "/candidates/{candidate}/decide", decide, methods=["POST"], name="decide"),
            Route(scope + "/audit", audit, name="audit"),
            Route(scope + "/keys", keys, name="keys"),
            Route(scope + "/policy", policy, name="policy"),
            Route(scope + "/policy/replay", policy_replay, methods=["POST"], name="policy_replay"),
            Route(scope + "/memory", memory, name="memory"),
            Route("/confirmations", confirmations, name="confirmations"),
            Route("/confirmations/{confirmation}", confirmation, methods=["GET"], name="confirmation"),
            Route("/confirmations/{confirmation}", confirmation_decide, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(settings)), Middleware(_Headers)],
        exception_handlers={404: _not_found, 500: _failed},
    )
    app.state.console = Console(settings, core, roles)
    return app
