"""Where a call's host context comes from (SPEC §2).

Two sources, chosen by the host configuration, never by the agent:

* **File binding** (stdio, or HTTP with a ``[binding]`` section): the adapter
  signs a fresh ``HostContext`` per call with the host key, carrying a new
  audit id, and sends it to the core.
* **Header binding** (HTTP without ``[binding]``): a deployment in front of
  many agents sends ``X-Engram-Host-Context: base64(SignedEnvelope)`` on every
  HTTP request, a ``HostContext`` signed by a key the core trusts. The adapter
  forwards those bytes unchanged; the core verifies them. The adapter only
  parses the body to learn the bound purpose and audit id (for its own purpose
  check and the envelope); it never trusts what it parsed for authorization.

Either way the result is a :class:`CallContext`; a missing or unusable one is
the protocol refusal -32603.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from adapters.mcp.config import Binding, HostConfig
from adapters.mcp.envelope import new_audit_id
from engram_core.api import context_pb2
from engram_core.hostctx import make_context

CONTEXT_HEADER = "x-engram-host-context"  # ASGI header names are lowercase
CONTEXT_TTL_MS = 60_000  # SPEC §2 allows ≤ 300 s; one call needs far less
_MAX_HEADER_BYTES = 16_384


class ContextUnavailable(Exception):
    """No trusted host context for this request (maps to -32603)."""


@dataclass(frozen=True)
class CallContext:
    """The signed host context of one call and what the adapter may read from it."""

    signed: bytes  # SignedEnvelope bytes for the gRPC metadata
    binding: Binding
    audit_id: str
    memory_enabled: bool


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ContextSource:
    """Produces the host context of each request from the host configuration."""

    def __init__(self, config: HostConfig, signing_key: Ed25519PrivateKey | None) -> None:
        self._config = config
        self._key = signing_key

    @property
    def header_mode(self) -> bool:
        return self._config.binding is None

    @property
    def bound_purpose(self) -> str | None:
        """The purpose of the file binding; None when bound per request."""
        return None if self._config.binding is None else self._config.binding.purpose_ref

    def for_request(self, headers: Mapping[str, str] | None) -> CallContext:
        if self._config.binding is not None:
            return self._sign(self._config.binding)
        return self._from_header(headers)

    def _sign(self, binding: Binding) -> CallContext:
        if not binding.complete or self._key is None:
            raise ContextUnavailable("incomplete binding")
        audit_id = new_audit_id()
        signed = make_context(
            self._key,
            tenant=binding.tenant,
            workspace=binding.workspace,
            principal=binding.principal,
            agent_id=binding.agent_id,
            session=binding.session,
            purpose_ref=binding.purpose_ref,
            audit_id=audit_id,
            now_ms=now_ms(),
            ttl_ms=CONTEXT_TTL_MS,
            memory_enabled=self._config.memory_enabled,
        )
        return CallContext(
            signed=signed, binding=binding, audit_id=audit_id, memory_enabled=self._config.memory_enabled
        )

    def _from_header(self, headers: Mapping[str, str] | None) -> CallContext:
        raw = (headers or {}).get(CONTEXT_HEADER)
        if not raw or len(raw) > _MAX_HEADER_BYTES:
            raise ContextUnavailable("no context header")
        try:
            signed = base64.b64decode(raw.strip(), validate=True)
            envelope = context_pb2.SignedEnvelope.FromString(signed)
            ctx = context_pb2.HostContext.FromString(envelope.body)
        except (binascii.Error, ValueError, Exception):  # any decode/parse failure
            raise ContextUnavailable("undecodable context header") from None
        binding = Binding(
            tenant=ctx.tenant,
            workspace=ctx.workspace,
            principal=ctx.principal,
            agent_id=ctx.agent_id,
            session=ctx.session,
            purpose_ref=ctx.purpose_ref,
        )
        # The audit id must be known to the adapter to be the envelope's auditId,
        # and the host (not the agent) must have opted in to memory.
        if not binding.complete or not ctx.audit_id or not envelope.signature:
            raise ContextUnavailable("incomplete context header")
        # Host principals are for maintenance and never on the agent path (SPEC §1).
        if ctx.host_principal or ctx.maintenance_scopes:
            raise ContextUnavailable("host principal on the agent path")
        return CallContext(
            signed=signed,
            binding=binding,
            audit_id=ctx.audit_id,
            memory_enabled=ctx.memory_enabled and self._config.memory_enabled,
        )


def encode_context_header(signed: bytes) -> str:
    """The header value for a signed context (what a fronting host sends)."""
    return base64.b64encode(signed).decode("ascii")
