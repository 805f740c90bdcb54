"""What one call did, gathered while it runs: who (the verified context's identifiers), the
contract code it ended with, and the policy decisions it took. Held in a context variable for
the duration of the call (gRPC runs each call on one worker thread), so the ports' wrappers and
the status mapping add to it without being handed it."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DecisionFact:
    """One policy decision as observability keeps it: never the input or the result body."""

    family: str
    revision: str
    outcome: str  # allow | deny | <decision value> | unavailable
    reason_codes: tuple[str, ...]
    seconds: float


@dataclass
class CallObservation:
    operation: str
    started: float = field(default_factory=time.perf_counter)
    tenant: str = ""
    workspace: str = ""
    principal: str = ""
    agent_id: str = ""
    audit_id: str = ""
    host_principal: bool = False
    code: str = ""  # "" while the call has not failed
    reasons: set[str] = field(default_factory=set)
    reason_class: str = ""  # the refusal's class (engram_core.contract.errors.REFUSALS), if any
    pointer: str = ""  # JSON pointer of a schema failure (schema names and indices only)
    decisions: list[DecisionFact] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return self.code or "OK"

    @property
    def scope_class(self) -> str:
        """Metrics label that never names a tenant: unbound (no verified context), host
        (maintenance principals) or workspace (agents)."""
        if not self.tenant:
            return "unbound"
        return "host" if self.host_principal else "workspace"

    def seconds(self) -> float:
        return time.perf_counter() - self.started


_CURRENT: ContextVar[CallObservation | None] = ContextVar("engram_call", default=None)


def current() -> CallObservation | None:
    return _CURRENT.get()


def begin(operation: str) -> tuple[CallObservation, Any]:
    obs = CallObservation(operation)
    return obs, _CURRENT.set(obs)


def end(token: Any) -> None:
    _CURRENT.reset(token)


def note_context(ctx: Any) -> None:
    """The verified host context of the current call (identifiers only)."""
    obs = _CURRENT.get()
    if obs is not None:
        obs.tenant, obs.workspace, obs.principal = ctx.tenant, ctx.workspace, ctx.principal
        obs.agent_id, obs.audit_id, obs.host_principal = ctx.agent_id, ctx.audit_id, ctx.host_principal


def note_error(error: Any) -> None:
    """The contract error the current call answers with (called by the one status mapping)."""
    obs = _CURRENT.get()
    if obs is not None:
        obs.code = error.code.value
        obs.reasons.update(getattr(error, "reasons", ()) or ())
        obs.reason_class = getattr(error, "reason_class", None) or ""
        obs.pointer = getattr(error, "pointer", "") or ""


def note_decision(fact: DecisionFact) -> None:
    obs = _CURRENT.get()
    if obs is not None:
        obs.decisions.append(fact)
        obs.reasons.update(fact.reason_codes)
