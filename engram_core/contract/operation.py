"""The digests a tool call is known by: the request digest (SPEC §7, the mutation guard) and the
operation digest a confirmation is bound to (SPEC §8).

Request: digest of tool, target and the arguments except the idempotency key. Operation: the
same with the caller's scope {tenant, workspace} and principal. One function each, for every
caller: the MCP adapter computes the operation digest to ask for a grant, pending confirmations
check what a parked request binds, and the core's pipeline (``services/pipeline.prepare``)
recomputes both from the request it received. The pipeline passes the arguments' canonical form
(``Canonical``, from its one validation walk) so that their text is spliced, not serialized
again; raw arguments give the same bytes, hence the same digests
(tests/unit/test_operation_digest.py pins them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engram_core.contract.canonical import Canonical, digest
from engram_core.contract.tools import TARGET_FIELD

IDEMPOTENCY_KEY = "idempotency_key"

# A call's arguments as received (a JSON object), or their canonical form with its members
# kept (``validation.canonical_arguments``).
Arguments = Mapping[str, Any] | Canonical


def target_of(tool: str, arguments: Mapping[str, Any]) -> str:
    field = TARGET_FIELD.get(tool)
    return str(arguments.get(field, "")) if field else ""


def _bound(tool: str, arguments: Arguments) -> tuple[str, dict[str, Any]]:
    """The call's target, and the arguments a digest binds (all but the idempotency key)."""
    if isinstance(arguments, Canonical):
        assert arguments.members is not None, "canonical arguments keep their members"
        plain: Mapping[str, Any] = arguments.value
        members: Mapping[str, Any] = arguments.members
    else:
        plain = members = arguments
    return target_of(tool, plain), {k: v for k, v in members.items() if k != IDEMPOTENCY_KEY}


def request_digest(tool: str, arguments: Arguments) -> str:
    """SPEC §7: what an idempotency key is bound to (docs/digests.md, kind ``request``)."""
    target, unkeyed = _bound(tool, arguments)
    return digest("request", {"tool": tool, "target": target, "arguments": unkeyed})


def operation_digest(*, tool: str, tenant: str, workspace: str, principal: str, arguments: Arguments) -> str:
    """SPEC §8: what a confirmation is bound to (docs/digests.md, kind ``operation``)."""
    target, unkeyed = _bound(tool, arguments)
    return digest("operation", {"tool": tool, "target": target, "scope": {"tenant": tenant, "workspace": workspace},
                                "principal": principal, "arguments": unkeyed})
