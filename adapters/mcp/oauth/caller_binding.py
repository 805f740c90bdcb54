"""Who an OAuth caller is, as the binding policy (``policies/engram/binding``) decides.

The adapter verifies the token (``verifier.py``); this module hands the verified claims to the
``engram/binding/decision`` rule and turns its answer into a :class:`CallerBinding`: the host
binding the adapter signs into every context of that caller's calls, the tools the token's
scopes open, and the scope each other tool would need (``step_up``). A caller no rule binds gets
no binding: no tools, memory off, never a default scope. The policy engine failing is the same
as no binding for this request (fail closed), and is not remembered.

A decision is reused for the same token (keyed by its SHA-256 digest) for at most
``binding_cache_s`` and never past the token's ``exp``, so a tool call does not wait for a policy
evaluation; a policy change reaches a caller within ``binding_cache_s``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.auth.provider import AccessToken

from adapters.mcp.config import AgentBinding
from engram_core.contract.errors import EngramError
from engram_core.contract.schemas import TOOL_NAMES
from engram_core.policy.port import BINDING, BINDING_SCOPES, PolicyEngine

logger = logging.getLogger("engram.mcp.binding")

POLICY_TIMEOUT_S = 2.0
_CACHE_ENTRIES = 4096
_MAX_CLAIMS = 64
_MAX_CLAIM_BYTES = 1024
_MAX_LIST_ITEMS = 64
_MAX_FIELD_BYTES = 512  # a binding field beyond this is refused (an opaque ref's bound, SPEC §4)


class CallerBindingUnavailable(Exception):
    """The binding policy gave no usable answer for this caller (nothing is cached)."""


@dataclass(frozen=True)
class CallerBinding:
    """What the binding policy decided for one access token."""

    binding: AgentBinding | None  # None: no rule binds this caller (memory off)
    tools: frozenset[str] = frozenset()
    step_up: Mapping[str, str] = field(default_factory=dict)  # tool -> the scope that would grant it
    decision_id: str = ""
    revision: str = ""
    reasons: tuple[str, ...] = ()


def _policy_value(value: Any) -> Any:
    """A claim value as the policy may see it: strings, numbers, booleans and short lists of those;
    nested objects and oversized values are left out (identifiers only, SPEC §9)."""
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value if len(value.encode()) <= _MAX_CLAIM_BYTES else None
    if isinstance(value, list) and len(value) <= _MAX_LIST_ITEMS:
        if any(isinstance(v, list | dict) for v in value):
            return None
        items = [_policy_value(v) for v in value]
        return items if None not in items else None
    return None


def policy_input(token: AccessToken, *, now_ms: int) -> dict[str, Any]:
    claims: dict[str, Any] = {}
    for name, value in sorted((token.claims or {}).items())[: _MAX_CLAIMS * 2]:
        kept = _policy_value(value)
        if isinstance(name, str) and len(name) <= 64 and kept is not None and len(claims) < _MAX_CLAIMS:
            claims[name] = kept
    issuer = (token.claims or {}).get("iss")
    return {
        "issuer": issuer if isinstance(issuer, str) else "",
        "subject": token.subject or "",
        "client_id": token.client_id,
        "scopes": sorted(set(token.scopes)),
        "audience": token.resource or "",
        "claims": claims,
        "now_ms": now_ms,
    }


def _agent_binding_of(result: Mapping[str, Any], session: str) -> AgentBinding | None:
    fields = result.get("binding")
    if not result.get("allow") or not isinstance(fields, Mapping):
        return None
    values = {name: fields.get(name, "") for name in ("tenant", "workspace", "principal", "agent_id", "purpose_ref")}
    if not all(isinstance(v, str) and len(v.encode()) <= _MAX_FIELD_BYTES for v in values.values()):
        return None
    binding = AgentBinding(session=session, **values)
    return binding if binding.complete else None


class CallerBindings:
    """The binding policy's answers per access token, cached as the module docstring says."""

    def __init__(self, engine: PolicyEngine, *, cache_s: int, clock: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._cache_s = cache_s
        self._clock = clock
        self._cache: OrderedDict[str, tuple[float, CallerBinding]] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, token: AccessToken) -> CallerBinding | None:
        key = hashlib.sha256(token.token.encode()).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            if hit[0] <= self._clock():
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            return hit[1]

    def resolve(self, token: AccessToken) -> CallerBinding:
        """The caller's binding (sync: at most one policy evaluation, ~0.5 ms). Raises
        CallerBindingUnavailable when the policy engine gives no usable answer."""
        hit = self.cached(token)
        if hit is not None:
            return hit
        now = self._clock()
        try:
            decision = self._engine.decide(BINDING, policy_input(token, now_ms=int(now * 1000)),
                                           timeout_s=POLICY_TIMEOUT_S)
        except EngramError as exc:
            logger.warning("binding policy unavailable: %s", exc.detail)
            raise CallerBindingUnavailable(exc.detail) from None
        result = decision.result
        # The session is the client's (an MCP client is an agent platform): one per token's client and subject.
        binding = _agent_binding_of(result, session=f"oauth:{token.client_id}")
        tools = frozenset(result.get("tools", ())) & frozenset(TOOL_NAMES) if binding else frozenset()
        step_up = {t: s for t, s in dict(result.get("step_up", {})).items() if t in TOOL_NAMES} if binding else {}
        resolved = CallerBinding(
            binding=binding, tools=tools, step_up=step_up, decision_id=decision.decision_id,
            revision=decision.revision, reasons=tuple(r.get("code", "") for r in result.get("reasons", ())))
        b = binding
        issuer = policy_input(token, now_ms=0)["issuer"]
        if b is None or not tools:
            # A signed-in person with no tools must be able to learn why from the text log too
            # (issue 60 item 14): a refusal, at warning, with the policy's reason codes.
            logger.warning("caller refused: the binding policy gave this caller %s: issuer=%s client=%s "
                           "decision_id=%s revision=%s reasons=%s",
                           "no binding" if b is None else "no tools", issuer, token.client_id,
                           decision.decision_id, decision.revision, ",".join(resolved.reasons) or "-")
        else:
            logger.info("caller bound: issuer=%s client=%s principal=%s tenant=%s workspace=%s tools=%s "
                        "decision_id=%s revision=%s reasons=%s",
                        issuer, token.client_id, b.principal, b.tenant, b.workspace, ",".join(sorted(tools)),
                        decision.decision_id, decision.revision, ",".join(resolved.reasons) or "-")
        if self._cache_s > 0:
            until = now + self._cache_s
            if token.expires_at is not None:
                until = min(until, float(token.expires_at))
            with self._lock:
                self._cache[hashlib.sha256(token.token.encode()).hexdigest()] = (until, resolved)
                while len(self._cache) > _CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return resolved

    async def aresolve(self, token: AccessToken) -> CallerBinding:
        """:meth:`resolve` off the event loop when it has to ask the policy."""
        hit = self.cached(token)
        if hit is not None:
            return hit
        return await anyio.to_thread.run_sync(self.resolve, token)

    def scopes_supported(self) -> list[str]:
        """Every scope the policy maps tools to (``engram/binding/scopes``); raises CallerBindingUnavailable."""
        try:
            decision = self._engine.decide(BINDING_SCOPES, {}, timeout_s=30)
        except EngramError as exc:
            raise CallerBindingUnavailable(exc.detail) from None
        return [s for s in decision.result.get("scopes", []) if isinstance(s, str) and s]
