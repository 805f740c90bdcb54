"""Where a call's host context comes from (SPEC §2).

Three sources, chosen by the host configuration, never by the agent:

* **File binding** (stdio, or HTTP with a ``[binding]`` section): the adapter
  signs a fresh ``HostContext`` with the host key for every gRPC call it makes,
  right before sending it, for that call only (the tool call, ``tools/list`` for a
  listing, ``host`` for CheckGated and RecordRefusal), so the call that receives it
  spends its nonce and no signed context is left able to act; all carry the MCP
  call's one audit id, and the scope's current authorization epoch (re-read from the
  core after ``engram admin revoke``).
* **Header binding** (HTTP without ``[binding]``): a deployment in front of
  many agents sends ``X-Engram-Host-Context: base64(SignedEnvelope)`` on every
  HTTP request, a fresh ``HostContext`` signed by a key the core trusts. The
  adapter forwards those bytes unchanged; the core verifies them. The adapter only
  parses the body to learn the bound purpose and audit id (for its own purpose
  check and the envelope); it never trusts what it parsed for authorization.
* **Token binding** (HTTP with ``[http.oauth]``): the caller's verified access
  token goes to the binding policy (``adapters.mcp.oauth.caller_binding``), whose
  binding the adapter signs into every context of the call, as for a file binding;
  the tools the token's scopes open bound the tools the caller sees. No binding:
  memory is off for that caller.

Every way the result is a :class:`CallContext`; a missing or unusable one is
the protocol refusal -32603. Its ``asker`` names who authenticated the request
(the access token's client, issuer and subject), so a confirmation is accepted only
from the one who was asked (``adapters.mcp.confirmation_step``).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from adapters.mcp.config import BINDING_FIELDS, AgentBinding, HostConfig
from adapters.mcp.envelope import new_audit_id
from engram_core.api import context_pb2
from engram_core.trust.hostctx import HOST_CALL, TOOLS_LIST_CALL, make_context

if TYPE_CHECKING:
    from mcp.server.auth.provider import AccessToken

    from adapters.mcp.oauth.caller_binding import CallerBindings

CONTEXT_HEADER = "x-engram-host-context"  # ASGI header names are lowercase
# SPEC §2 allows ≤ 300 s. A context is signed right before the one gRPC call that
# uses it, so it only has to outlive transit, queueing at the core and clock skew;
# a captured one is useless once claimed, and dead soon after.
CONTEXT_TTL_MS = 15_000
_MAX_HEADER_BYTES = 16_384
HOST_AGENT_ID = "engram-mcp-adapter"


class ContextUnavailable(Exception):
    """No trusted host context for this request (maps to -32603)."""


@dataclass(frozen=True)
class CallContext:
    """The host context of one MCP call and what the adapter may read from it."""

    binding: AgentBinding
    audit_id: str
    memory_enabled: bool
    # A signed context for one gRPC call: freshly signed each time (file binding), or
    # the fronting host's bytes (header binding).
    _signer: Callable[[str], bytes]
    # True when the adapter signs (file binding): it may follow a new authorization epoch.
    resignable: bool
    # The authorization epoch the call's contexts carry now; a grant the adapter signs
    # for the call carries the same (a grant of an older epoch is refused).
    _epoch: Callable[[], int]
    # The tools the caller's credential opens (token binding); None: no limit besides the policy's.
    tools: frozenset[str] | None = None
    # Who authenticated the request: "" without a bearer token (stdio, header binding).
    asker: str = ""

    # What the MCP request is (a tool name, or TOOLS_LIST_CALL): the call its contexts are signed for.
    call: str = TOOLS_LIST_CALL

    def signed(self) -> bytes:
        """A context for the MCP request's own call (the tool call, or the listing of tools/list)."""
        return self._signer(self.call)

    def signed_for(self, call: str) -> bytes:
        """A context for one gRPC call that is not the request's own: ``TOOLS_LIST_CALL`` for the
        tool listing made before a tool call, ``HOST_CALL`` for CheckGated and RecordRefusal. Each
        of those calls spends what it is shown, and a context signed for them acts nowhere else,
        so nothing the adapter signs is left able to act (issue 57). A fronting host's header is
        the same bytes whatever it is sent to (the core leaves its nonce to its tool call)."""
        return self._signer(call)

    def authorization_epoch(self) -> int:
        return self._epoch()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def asker_of(token: AccessToken | None) -> str:
    """The authenticated identity of a request: the token's (client, issuer, subject), as the SDK
    binds sessions and request state (``principal_components``); "" without a token."""
    if token is None:
        return ""
    from mcp.server.auth.provider import principal_components

    return json.dumps(principal_components(token), separators=(",", ":"))


def _unsigned(_call: str) -> bytes:
    raise ContextUnavailable("no binding: memory is off for this caller")


class ContextSource:
    """Produces the host context of each request from the host configuration.

    Holds the authorization epoch the adapter signs with per scope (file and token
    binding): 0 until the core refuses a context as AUTHORIZATION_REVOKED, then whatever
    the core says the scope's epoch is (:meth:`host_context` signs the host-only question).
    """

    _MAX_EPOCHS = 4096  # scopes whose epoch is remembered (token binding serves many)

    def __init__(self, config: HostConfig, signing_key: Ed25519PrivateKey | None, *,
                 callers: CallerBindings | None = None) -> None:
        self._config = config
        self._key = signing_key
        self._callers = callers
        self._epochs: dict[tuple[str, str], int] = {}

    @property
    def header_mode(self) -> bool:
        return self._config.binding is None and self._callers is None

    @property
    def bound_purpose(self) -> str | None:
        """The purpose of the file binding; None when bound per request."""
        return None if self._config.binding is None else self._config.binding.purpose_ref

    def _file_scope(self) -> tuple[str, str]:
        b = self._config.binding
        return (b.tenant, b.workspace) if b is not None else ("", "")

    @property
    def authorization_epoch(self) -> int:
        """The file binding's epoch (what `engram doctor` follows)."""
        return self._epochs.get(self._file_scope(), 0)

    def follow_epoch(self, epoch: int, scope: tuple[str, str] | None = None) -> None:
        """Sign for ``scope`` (default: the file binding's) with its current epoch from now on
        (epochs only grow)."""
        scope = scope or self._file_scope()
        if scope not in self._epochs and len(self._epochs) >= self._MAX_EPOCHS:
            self._epochs.pop(next(iter(self._epochs)))  # forgotten: the next revoke refusal re-reads it
        self._epochs[scope] = max(self._epochs.get(scope, 0), epoch)

    def for_request(self, headers: Mapping[str, str] | None, token: AccessToken | None = None,
                    call: str = TOOLS_LIST_CALL) -> CallContext:
        """The host context of one MCP request: ``token`` is the access token the HTTP layer
        verified; ``call`` is the tool it calls, or ``TOOLS_LIST_CALL`` for a listing (a fronting
        host signed it for the same)."""
        if self._config.binding is not None:
            return self._signed_for(self._config.binding, call, asker=asker_of(token))
        if self._callers is not None:
            return self._token_bound(token, call)
        return self._from_header(headers, call, token)

    def _token_bound(self, token: AccessToken | None, call: str) -> CallContext:
        from adapters.mcp.oauth.caller_binding import CallerBindingUnavailable

        if token is None or self._callers is None:
            raise ContextUnavailable("no access token")
        try:
            caller = self._callers.resolve(token)
        except CallerBindingUnavailable:
            raise ContextUnavailable("binding policy unavailable") from None
        if caller.binding is None:
            # SPEC §2, memory off by default: a caller no rule binds sees no tool and reaches no scope.
            return CallContext(binding=AgentBinding("", "", ""), audit_id=new_audit_id(), memory_enabled=False,
                               _signer=_unsigned, resignable=False, _epoch=lambda: 0, tools=frozenset(),
                               asker=asker_of(token), call=call)
        return self._signed_for(caller.binding, call, tools=caller.tools, asker=asker_of(token),
                                credential_ref=f"oauth-binding:{caller.decision_id}")

    def _signed_for(self, binding: AgentBinding, call: str, *, asker: str, tools: frozenset[str] | None = None,
                    credential_ref: str = "") -> CallContext:
        if not binding.complete or self._key is None:
            raise ContextUnavailable("incomplete binding")
        audit_id = new_audit_id()
        key = self._key
        scope = (binding.tenant, binding.workspace)

        def sign(for_call: str) -> bytes:
            return self._make(key, binding, for_call, audit_id, agent_id=binding.agent_id,
                              purpose_ref=binding.purpose_ref, authorization_epoch=self._epochs.get(scope, 0),
                              credential_ref=credential_ref)

        return CallContext(binding=binding, audit_id=audit_id, memory_enabled=self._config.memory_enabled,
                           _signer=sign, resignable=True, _epoch=lambda: self._epochs.get(scope, 0),
                           tools=tools, asker=asker, call=call)

    def host_context(self, call: CallContext) -> bytes:
        """A host-principal context for the call's scope, to ask the core host-only
        questions (the scope's authorization epoch). File binding only: the adapter is
        the host there; it never turns a fronting host's agent context into one."""
        if not call.resignable or self._key is None:
            raise ContextUnavailable("not the signing host")
        return self._make(self._key, call.binding, HOST_CALL, call.audit_id, agent_id=HOST_AGENT_ID,
                          host_principal=True)

    def _make(self, key: Ed25519PrivateKey, binding: AgentBinding, call: str, audit_id: str, *, agent_id: str,
              purpose_ref: str = "", authorization_epoch: int = 0, credential_ref: str = "",
              host_principal: bool = False) -> bytes:
        """A context signed now for ``call`` in the binding's scope, principal and session, living
        ``CONTEXT_TTL_MS``."""
        return make_context(key, call=call, tenant=binding.tenant, workspace=binding.workspace,
                            principal=binding.principal, agent_id=agent_id, session=binding.session,
                            purpose_ref=purpose_ref, audit_id=audit_id, now_ms=now_ms(), ttl_ms=CONTEXT_TTL_MS,
                            memory_enabled=self._config.memory_enabled, host_principal=host_principal,
                            authorization_epoch=authorization_epoch, credential_ref=credential_ref)

    def _from_header(self, headers: Mapping[str, str] | None, call: str,
                     token: AccessToken | None = None) -> CallContext:
        raw = (headers or {}).get(CONTEXT_HEADER)
        if not raw or len(raw) > _MAX_HEADER_BYTES:
            raise ContextUnavailable("no context header")
        try:
            signed = base64.b64decode(raw.strip(), validate=True)
            envelope = context_pb2.SignedEnvelope.FromString(signed)
            ctx = context_pb2.HostContext.FromString(envelope.body)
        except (binascii.Error, ValueError, Exception):  # any decode/parse failure
            raise ContextUnavailable("undecodable context header") from None
        binding = AgentBinding(**{name: getattr(ctx, name) for name in BINDING_FIELDS})
        # The audit id must be known to the adapter to be the envelope's auditId,
        # and the host (not the agent) must have opted in to memory.
        if not binding.complete or not ctx.audit_id or not envelope.signature:
            raise ContextUnavailable("incomplete context header")
        # Host principals are for maintenance and never on the agent path (SPEC §1).
        if ctx.host_principal or ctx.maintenance_scopes:
            raise ContextUnavailable("host principal on the agent path")
        return CallContext(
            binding=binding,
            audit_id=ctx.audit_id,
            memory_enabled=ctx.memory_enabled and self._config.memory_enabled,
            _signer=lambda _call: signed,  # the fronting host signed it for its request (the core checks)
            resignable=False,
            _epoch=lambda: ctx.authorization_epoch,
            asker=asker_of(token),
            call=call,
        )


def encode_context_header(signed: bytes) -> str:
    """The header value for a signed context (what a fronting host sends)."""
    return base64.b64encode(signed).decode("ascii")
