"""The OPA backend: an OPA server asked over its REST Data API (SPEC §9).

Requests go through ``opa-python-client``'s ``OpaClient.query_rule`` with
``?provenance=true`` so every answer names the bundle revision it came from.
The client's ``requests`` session is re-mounted with an adapter that sets
TCP_NODELAY (and no retries: a retry is the caller's decision, with the
retriable POLICY_UNAVAILABLE). Every transport error, HTTP error, timeout,
missing ``result`` or malformed answer is POLICY_UNAVAILABLE.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import requests
from opa_client import OpaClient
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection

from engram_core.contract.canonical import digest
from engram_core.contract.errors import Code, EngramError
from engram_core.policy.port import AUTHZ, LOG_MASK, LOG_PATH_MASK, Decision
from engram_core.policy.shapes import shape_error

# Without TCP_NODELAY a small POST whose headers and body go out in two writes
# waits for the peer's delayed ACK: ~40 ms per decision instead of ~1 ms.
_SOCKET_OPTIONS = [*HTTPConnection.default_socket_options, (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class _NoDelayAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = _SOCKET_OPTIONS
        super().init_poolmanager(*args, **kwargs)


_UNDEFINED = object()  # a mask function the server's bundle does not define


def _unavailable(detail: str) -> EngramError:
    return EngramError(Code.POLICY_UNAVAILABLE, detail)


def _revision_of(body: Mapping[str, Any], expected: str | None) -> str:
    """The bundle revision an answer's provenance names ("" when none).

    OPA keys ``provenance.bundles`` by bundle name (which depends on how the
    server was started), so the expected revision is looked up among all of them.
    """
    provenance = body.get("provenance")
    if not isinstance(provenance, Mapping):
        return ""
    revisions = [
        b.get("revision") for b in (provenance.get("bundles") or {}).values() if isinstance(b, Mapping)
    ]
    if isinstance(provenance.get("revision"), str):  # legacy single-bundle field
        revisions.append(provenance["revision"])
    revisions = [r for r in revisions if isinstance(r, str) and r]
    if expected is not None and expected in revisions:
        return expected
    return revisions[0] if revisions else ""


class OpaRestPolicyEngine:
    """PolicyEngine asking an OPA server (``opa run --server --bundle …``).

    Not guaranteed: that the server's bundle is the one on this host's disk;
    pass ``expected_revision`` to refuse answers from any other revision.
    """

    def __init__(self, url: str, *, expected_revision: str | None = None, timeout_s: float = 0.5) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an OPA server URL: {url!r}")
        self._expected_revision = expected_revision
        self._timeout_s = timeout_s
        self._client = OpaClient(
            host=parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl=parts.scheme == "https",
            retries=0,
            timeout=timeout_s,
        )
        adapter = _NoDelayAdapter(max_retries=0)
        self._client._session.mount("http://", adapter)
        self._client._session.mount("https://", adapter)
        self._lock = threading.Lock()
        self._revision = ""
        self._closed = False
        self._base = f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        self._path_masks: dict[tuple[str, str], Any] = {}  # (revision, path) -> path_mask's answer
        self._event_mask_defined: dict[str, bool] = {}

    def decide(self, path: str, input: Mapping[str, Any], *, timeout_s: float | None = None) -> Decision:
        if self._closed:
            raise _unavailable("policy engine is closed")
        try:
            input_digest = digest("policy-input", input)
        except (TypeError, ValueError) as exc:
            raise _unavailable(f"policy input is not canonical JSON: {exc}") from exc
        body = self._query(path, dict(input), timeout_s if timeout_s is not None else self._timeout_s)
        if "result" not in body:
            raise _unavailable(f"{path}: undefined decision")
        result = body["result"]
        problem = shape_error(path, result)
        if problem is not None:
            raise _unavailable(f"{path}: {problem}")
        revision = _revision_of(body, self._expected_revision)
        if self._expected_revision is not None and revision != self._expected_revision:
            raise _unavailable(f"{path}: answered by bundle revision {revision!r}, not the expected one")
        with self._lock:
            self._revision = revision
        decision_id = body.get("decision_id")
        return Decision(
            path=path,
            result=result,
            decision_id=decision_id if isinstance(decision_id, str) and decision_id else f"core-{uuid.uuid4()}",
            revision=revision,
            input_digest=input_digest,
        )

    def decide_all(self, requests: Sequence[tuple[str, Mapping[str, Any]]], *,
                   timeout_s: float | None = None) -> list[Decision]:
        """One Data API request per decision (the Data API answers one document per request);
        all must come from one bundle revision."""
        decisions = [self.decide(path, input, timeout_s=timeout_s) for path, input in requests]
        if len({d.revision for d in decisions}) > 1:
            raise _unavailable("decisions answered by different bundle revisions")
        return decisions

    def _query(self, path: str, input: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        started = time.monotonic()
        self._client.timeout = timeout_s
        try:
            body = self._client.query_rule(input, path.strip("/"), query_params={"provenance": "true"})
        except (requests.RequestException, ValueError) as exc:  # transport, HTTP status, bad JSON
            raise _unavailable(f"{path}: OPA request failed: {type(exc).__name__}") from exc
        if time.monotonic() - started > timeout_s:
            raise _unavailable(f"{path}: OPA answered after {timeout_s}s")
        if not isinstance(body, dict):
            raise _unavailable(f"{path}: OPA answer is not an object")
        return body

    def evaluate_mask(self, event: Mapping[str, Any], revision: str = "") -> Any:
        """The decision-log masks' operations for ``event`` (``{"path", "input", "result"}``),
        by OPA's Query API (a decision's own request cannot carry them): ``path_mask(path)``,
        asked once per path and revision, and ``mask(event)`` when the server's bundle defines
        it. None when it defines neither; POLICY_UNAVAILABLE when the server cannot say."""
        path = str(event.get("path", ""))
        key = (revision, path)
        if key not in self._path_masks:
            if len(self._path_masks) > 256:
                self._path_masks.clear()
            self._path_masks[key] = self._ask_mask(f"data.{LOG_PATH_MASK.replace('/', '.')}(input.path)", {"path": path})
        if revision not in self._event_mask_defined:
            self._event_mask_defined[revision] = self._ask_mask(
                f"data.{LOG_MASK.replace('/', '.')}(input)", {"path": "", "input": {}, "result": {}}) is not _UNDEFINED
        path_ops = self._path_masks[key]
        event_ops = self._ask_mask(f"data.{LOG_MASK.replace('/', '.')}(input)", dict(event)) \
            if self._event_mask_defined[revision] else _UNDEFINED
        parts = [ops for ops in (path_ops, event_ops) if ops is not _UNDEFINED and ops is not None]
        if not parts:
            return None
        if not all(isinstance(ops, list) for ops in parts):
            return {"error": "a mask answered something other than a set of operations"}
        return [op for ops in parts for op in ops]

    def _ask_mask(self, call: str, input: Mapping[str, Any]) -> Any:
        """A mask function's answer, None when it answers nothing, _UNDEFINED when the server's
        bundle does not define it."""
        url = f"{self._base}/v1/query"
        try:
            response = self._client._session.post(url, json={"query": f"m := [x | x := {call}]", "input": input},
                                                  timeout=self._timeout_s * 4)
        except requests.RequestException as exc:
            raise _unavailable(f"decision-log mask: OPA request failed: {type(exc).__name__}") from exc
        if response.status_code == 400 and "undefined function" in response.text:
            return _UNDEFINED
        if response.status_code != 200:
            raise _unavailable(f"decision-log mask: OPA answered HTTP {response.status_code}")
        try:
            rows = response.json().get("result")
        except ValueError as exc:
            raise _unavailable("decision-log mask: OPA answer is not JSON") from exc
        answers = rows[0].get("m") if isinstance(rows, list) and rows and isinstance(rows[0], dict) else None
        return answers[0] if isinstance(answers, list) and answers else None

    def revision(self) -> str:
        with self._lock:
            return self._revision if not self._closed else ""

    def active(self) -> bool:
        """Probe the authz decision with an empty input: active when it answers (from the expected revision)."""
        try:
            self.decide(AUTHZ, {})
        except EngramError:
            return False
        return True

    def reload(self) -> str:
        """The OPA server owns its bundle; this re-checks that it answers and returns its revision."""
        self.decide(AUTHZ, {})
        return self.revision()

    def close(self) -> None:
        self._closed = True
        self._client.close_connection()
