"""What a person may do on a scope, asked of the Rego family ``engram/console``.

Python never decides a role: it asks the policy with the person's subject, issuer and verified
claims and the scope, and checks the *action* the page needs against the actions the policy
answers. An unanswerable policy (no bundle, undefined, malformed) grants nothing: no rule, no
access.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engram_core.contract.errors import EngramError
from engram_core.contract.scope import Scope
from engram_core.policy.embedded import EmbeddedPolicyEngine

CONSOLE = "engram/console/decision"
ACTIONS = ("review.view", "review.decide", "audit.view", "keys.view", "policy.view", "policy.replay", "memory.view",
           "confirm.view", "confirm.decide")

logger = logging.getLogger("engram.console")


@dataclass(frozen=True)
class Grant:
    """The policy's answer for one person on one scope."""

    roles: tuple[str, ...] = ()
    actions: frozenset[str] = field(default_factory=frozenset)
    memory_purpose: str = ""  # the purpose the Memory page reads under (the core redacts per purpose)

    def may(self, action: str) -> bool:
        return action in self.actions


NOTHING = Grant()


class RoleOracle:
    """The embedded OPA engine over the console's bundle (the same bundle directory the core
    serves, or any other the operator names)."""

    def __init__(self, bundle_dir: Path) -> None:
        self._engine = EmbeddedPolicyEngine(bundle_dir)
        self._engine.reload()  # a bundle that does not load stops the console at start, not at sign-in

    def grant(self, *, subject: str, issuer: str, claims: Mapping[str, Any], scope: Scope) -> Grant:
        policy_input = {"subject": subject, "issuer": issuer, "claims": dict(claims), "tenant": scope.tenant,
                        "workspace": scope.workspace}
        try:
            result = self._engine.decide(CONSOLE, policy_input, timeout_s=5).result
        except EngramError as exc:
            logger.warning("console policy unavailable: %s", exc)
            return NOTHING
        roles, actions = result.get("roles"), result.get("actions")
        if not (isinstance(roles, list) and isinstance(actions, list)):
            return NOTHING  # malformed: fail closed
        purpose = result.get("memory_purpose")
        return Grant(tuple(str(r) for r in roles), frozenset(str(a) for a in actions if a in ACTIONS),
                     purpose if isinstance(purpose, str) else "")

    def revision(self) -> str:
        """The revision of the bundle the console's roles come from."""
        return self._engine.revision()

    def close(self) -> None:
        self._engine.close()
