"""The operation digest a confirmation is bound to (SPEC §8).

Digest of tool, target, scope, principal and the arguments except the
idempotency key. The MCP adapter computes it to ask for a grant; the core
recomputes it from the request it received and compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engram_core.contract.canonical import digest
from engram_core.contract.tools import TARGET_FIELD


def target_of(tool: str, arguments: Mapping[str, Any]) -> str:
    field = TARGET_FIELD.get(tool)
    return str(arguments.get(field, "")) if field else ""


def operation_digest(*, tool: str, tenant: str, workspace: str, principal: str, arguments: Mapping[str, Any]) -> str:
    return digest(
        "operation",
        {
            "tool": tool,
            "target": target_of(tool, arguments),
            "scope": {"tenant": tenant, "workspace": workspace},
            "principal": principal,
            "arguments": {k: v for k, v in arguments.items() if k != "idempotency_key"},
        },
    )
