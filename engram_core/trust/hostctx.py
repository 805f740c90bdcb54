"""Signed host-bound context and confirmation grants (SPEC §2, §8).

Both travel as a ``SignedEnvelope`` (serialized protobuf bytes + Ed25519
signature + key id) in binary gRPC metadata. This module is used on both sides:
hosts and the MCP adapter sign, the core verifies.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engram_core.api import context_pb2
from engram_core.contract.errors import Code, EngramError
from engram_core.contract.scope import Scope
from engram_core.trust.context_nonces import CALLS_LANE, MAINTENANCE_LANE, ContextNonceLedger
from engram_core.trust.hostkeys import HostKeyBinding, TrustedHostKeys, key_id

CONTEXT_METADATA_KEY = "engram-host-context-bin"
CONFIRMATION_METADATA_KEY = "engram-confirmation-bin"

MAX_CONTEXT_TTL_MS = 300_000       # SPEC §2: expires_at ≤ issued_at + 300 s
# What a signer asks unless it says otherwise: a context is signed right before the one
# call that uses it, so it needs to outlive transit, queueing and clock skew, no more.
DEFAULT_CONTEXT_TTL_MS = 30_000
MAX_GRANT_TTL_MS = 300_000         # SPEC §8: a confirmation lives at most 300 s
GRANT_EXECUTION_WINDOW_MS = 30_000  # SPEC §8: executed within 30 s of approval
CLOCK_SKEW_MS = 5_000
# What a context can be signed for (``HostContext.call``), besides a tool name.
TOOLS_LIST_CALL = "tools/list"
HOST_CALL = "host"
ADMIN_CALL = "admin"

# Domain separation: a signed context can never be replayed as a grant.
_CONTEXT_DOMAIN = b"engram/host-context/v1\x00"
_GRANT_DOMAIN = b"engram/confirmation-grant/v1\x00"


@dataclass(frozen=True)
class BoundContext:
    """A verified host context; the only source of identity inside core."""

    tenant: str
    workspace: str
    principal: str
    agent_id: str
    session: str
    purpose_ref: str
    audit_id: str
    credential_ref: str
    issued_at_ms: int
    expires_at_ms: int
    memory_enabled: bool
    host_principal: bool
    maintenance_scopes: tuple[str, ...]
    authorization_epoch: int
    host_key_id: str
    # What the signing key is bound to serve, as trusted when the context verified (issue 26.3).
    host_key: HostKeyBinding | None = None
    call: str = ""  # what the host signed it for (HostContext.call)
    nonce: str = ""
    nonce_ref: str = ""  # set once this call claimed the nonce (context_nonces.nonce_ref): its audit rows name it
    # The shared usage counts read with the claim (``Core.claim_context``), as the authz policy
    # sees them (``input.usage``): this call is decided on the counts as they were when it began.
    usage: dict[str, object] | None = field(default=None, compare=False, repr=False)

    @property
    def nonce_lane(self) -> str:
        """The ledger lane of its nonce: maintenance contexts have capacity of their own."""
        return MAINTENANCE_LANE if self.host_principal and self.maintenance_scopes else CALLS_LANE

    @property
    def scope(self) -> Scope:
        return Scope(self.tenant, self.workspace)


def _sign(domain: bytes, body: bytes, key: Ed25519PrivateKey) -> bytes:
    env = context_pb2.SignedEnvelope(body=body, signature=key.sign(domain + body), key_id=key_id(key.public_key()))
    return env.SerializeToString()


def sign_context(ctx: context_pb2.HostContext, key: Ed25519PrivateKey) -> bytes:
    return _sign(_CONTEXT_DOMAIN, ctx.SerializeToString(deterministic=True), key)


def sign_grant(grant: context_pb2.ConfirmationGrant, key: Ed25519PrivateKey) -> bytes:
    return _sign(_GRANT_DOMAIN, grant.SerializeToString(deterministic=True), key)


def make_context(
    key: Ed25519PrivateKey,
    *,
    call: str,
    tenant: str,
    workspace: str,
    principal: str,
    agent_id: str = "",
    session: str = "",
    purpose_ref: str = "",
    audit_id: str | None = None,
    now_ms: int,
    ttl_ms: int = DEFAULT_CONTEXT_TTL_MS,
    memory_enabled: bool = True,
    host_principal: bool = False,
    maintenance_scopes: tuple[str, ...] = (),
    authorization_epoch: int = 0,
    credential_ref: str = "",
) -> bytes:
    """Build and sign a host context for ``call`` (a tool name, ``TOOLS_LIST_CALL``,
    ``HOST_CALL`` or ``ADMIN_CALL``); returns the metadata value."""
    ctx = context_pb2.HostContext(
        tenant=tenant,
        workspace=workspace,
        principal=principal,
        agent_id=agent_id,
        session=session,
        purpose_ref=purpose_ref,
        audit_id=audit_id or ("aud_" + secrets.token_hex(12)),
        credential_ref=credential_ref,
        issued_at_ms=now_ms,
        expires_at_ms=now_ms + ttl_ms,
        memory_enabled=memory_enabled,
        host_principal=host_principal,
        maintenance_scopes=list(maintenance_scopes),
        authorization_epoch=authorization_epoch,
        nonce=secrets.token_hex(8),
        call=call,
    )
    return sign_context(ctx, key)


def _open(domain: bytes, raw: bytes, trusted: TrustedHostKeys) -> tuple[bytes, str]:
    env = context_pb2.SignedEnvelope()
    env.ParseFromString(raw)
    # Key separation (SPEC §2): the core's confirmation key signs grants and nothing else.
    pub = trusted.context_key(env.key_id) if domain == _CONTEXT_DOMAIN else trusted.grant_key(env.key_id)
    if pub is None:
        raise ValueError("unknown host key")
    pub.verify(env.signature, domain + env.body)
    return env.body, env.key_id


def verify_context(raw: bytes | None, trusted: TrustedHostKeys, *, now_ms: int,
                   nonces: ContextNonceLedger | None = None,
                   calls: frozenset[str] | None = None) -> BoundContext:
    """Verify a signed context or raise TRUSTED_CONTEXT_UNAVAILABLE (SPEC §2).

    ``calls``: what the context must have been signed for (``HostContext.call``); None only
    for in-process callers that sign a context for themselves. With ``nonces`` the context
    is also single use: its nonce is claimed, and a second presentation is refused like a
    bad context. Over gRPC every call spends the nonce of the context it sees
    (``Core.claim_context``, ``rpc/call_handler.py`` ``CallHandler.bind``), so a context shown
    to any call cannot act afterwards; the one exception is a tool call's own context shown to
    the tool listing or CheckGated (a fronting host's one context per request), left for its
    tool call to spend.
    """
    if not raw:
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "no host context")
    try:
        body, kid = _open(_CONTEXT_DOMAIN, raw, trusted)
        ctx = context_pb2.HostContext()
        ctx.ParseFromString(body)
    except (InvalidSignature, ValueError, Exception) as exc:  # any parse/verify failure
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, f"context rejected: {type(exc).__name__}") from None
    if not (ctx.tenant and ctx.workspace and ctx.principal):
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "empty binding")
    if ctx.expires_at_ms - ctx.issued_at_ms > MAX_CONTEXT_TTL_MS or ctx.expires_at_ms <= ctx.issued_at_ms:
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context lifetime out of bounds")
    if now_ms >= ctx.expires_at_ms or ctx.issued_at_ms > now_ms + CLOCK_SKEW_MS:
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context expired or not yet valid")
    if calls is not None and ctx.call not in calls:
        raise EngramError(Code.TRUSTED_CONTEXT_UNAVAILABLE, "context not signed for this call",
                          reasons=("CONTEXT_CALL_MISMATCH",))
    bound = BoundContext(
        tenant=ctx.tenant,
        workspace=ctx.workspace,
        principal=ctx.principal,
        agent_id=ctx.agent_id,
        session=ctx.session,
        purpose_ref=ctx.purpose_ref,
        audit_id=ctx.audit_id or ("aud_" + secrets.token_hex(12)),
        credential_ref=ctx.credential_ref,
        issued_at_ms=ctx.issued_at_ms,
        expires_at_ms=ctx.expires_at_ms,
        memory_enabled=ctx.memory_enabled,
        host_principal=ctx.host_principal,
        maintenance_scopes=tuple(ctx.maintenance_scopes),
        authorization_epoch=ctx.authorization_epoch,
        host_key_id=kid,
        host_key=trusted.binding(kid),
        call=ctx.call,
        nonce=ctx.nonce,
    )
    if nonces is not None:
        ref = nonces.claim(kid, ctx.nonce, issued_at_ms=ctx.issued_at_ms, expires_at_ms=ctx.expires_at_ms,
                           now_ms=now_ms, lane=bound.nonce_lane)
        bound = replace(bound, nonce_ref=ref)
    return bound


def make_grant(
    key: Ed25519PrivateKey,
    *,
    tenant: str,
    workspace: str,
    principal: str,
    tool: str,
    target: str,
    operation_digest: str,
    approved_at_ms: int,
    ttl_ms: int = MAX_GRANT_TTL_MS,
    authorization_epoch: int = 0,
) -> bytes:
    grant = context_pb2.ConfirmationGrant(
        grant_id="cnf_" + secrets.token_hex(16),
        tenant=tenant,
        workspace=workspace,
        principal=principal,
        tool=tool,
        target=target,
        operation_digest=operation_digest,
        issued_at_ms=approved_at_ms,
        expires_at_ms=approved_at_ms + ttl_ms,
        authorization_epoch=authorization_epoch,
    )
    return sign_grant(grant, key)


def verify_grant(
    raw: bytes,
    trusted: TrustedHostKeys,
    *,
    ctx: BoundContext,
    tool: str,
    target: str,
    operation_digest: str,
    now_ms: int,
) -> context_pb2.ConfirmationGrant:
    """Verify a confirmation grant for this exact operation, else gate_failed.

    Single use is enforced by the store (used-confirmation ledger, same
    transaction as the effect), not here.
    """
    try:
        body, _ = _open(_GRANT_DOMAIN, raw, trusted)
        grant = context_pb2.ConfirmationGrant()
        grant.ParseFromString(body)
    except Exception:
        raise EngramError(Code.GATE_FAILED, "grant signature") from None
    checks = (
        grant.grant_id != "",
        grant.tenant == ctx.tenant,
        grant.workspace == ctx.workspace,
        grant.principal == ctx.principal,
        grant.tool == tool,
        grant.target == target,
        grant.operation_digest == operation_digest,
        0 < grant.expires_at_ms - grant.issued_at_ms <= MAX_GRANT_TTL_MS,
        now_ms < grant.expires_at_ms,
        grant.issued_at_ms <= now_ms + CLOCK_SKEW_MS,
        now_ms - grant.issued_at_ms <= GRANT_EXECUTION_WINDOW_MS,
    )
    if not all(checks):
        raise EngramError(Code.GATE_FAILED, "grant does not match operation")
    return grant
