"""The PolicyEngine port (SPEC §9).

Core asks; Rego in ``policies/`` answers. Every decision is one rule returning
an object. A backend raises ``EngramError(POLICY_UNAVAILABLE)`` for anything
that is not a well-formed answer (undefined, malformed, failed, too slow, no
active bundle): callers fail closed and change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engram_core.contract.errors import Code, EngramError

# Decision paths under data. (slash form, as in OPA's REST Data API)
AUTHZ = "engram/authz/decision"
TOOLS = "engram/authz/tools"
CAPTURE = "engram/capture/decision"
ADMISSION = "engram/admission/decision"
REDACTION = "engram/redaction/decision"
RETENTION = "engram/retention/decision"
RECONCILIATION = "engram/reconciliation/decision"
# Asked by the MCP adapter, not the core: who an OAuth caller is (adapters/mcp/oauth/caller_binding.py).
BINDING = "engram/binding/decision"
BINDING_SCOPES = "engram/binding/scopes"

DECISION_PATHS: tuple[str, ...] = (AUTHZ, TOOLS, CAPTURE, ADMISSION, REDACTION, RETENTION, RECONCILIATION,
                                   BINDING, BINDING_SCOPES)
# The decision-log masks (OPA's ``system.log.mask``, under the bundle's own root): a function
# of the decision path, asked once per path and revision, and an optional function of the
# whole event, asked with every decision (docs/policies.md, "Decision logs").
LOG_PATH_MASK = "engram/log/path_mask"
LOG_MASK = "engram/log/mask"


@dataclass(frozen=True)
class Decision:
    """One answered decision, as recorded in receipts and the audit log."""

    path: str
    result: Mapping[str, Any]
    decision_id: str
    revision: str
    input_digest: str
    # The decision-log mask's answer for this decision (a list of OPA mask operations), when
    # the engine was asked to evaluate it beside the decision; None otherwise. Never affects
    # the decision, receipts or the audit row.
    log_mask: Any = field(default=None, compare=False, repr=False)

    def summary(self) -> dict[str, Any]:
        """What the audit log keeps of a decision: never the input, only its digest."""
        keys = ("allow", "decision", "tools", "action", "admission")
        return {
            "path": self.path,
            "decision_id": self.decision_id,
            "revision": self.revision,
            "input_digest": self.input_digest,
            "result": {k: self.result[k] for k in keys if k in self.result},
            "reason_codes": sorted({r.get("code", "") for r in self.result.get("reasons", [])}),
        }


class BundleRefused(EngramError):
    """A reload read a bundle it will not activate (unreadable, unsigned or tampered, failing
    to compile, of an unexpected revision). The previous revision stays active: retrying the
    same bundle cannot help, so callers say so instead of "retry later". ``problem`` is
    ``{"file", "line", "error"}``; ``active_revision`` is what keeps answering ("" if none)."""

    def __init__(self, problem: dict[str, Any], active_revision: str) -> None:
        where = f"{problem.get('file')}:{problem.get('line')}: " if problem.get("line") else (
            f"{problem.get('file')}: " if problem.get("file") else "")
        super().__init__(Code.POLICY_UNAVAILABLE, f"policy bundle refused: {where}{problem.get('error', '')}")
        self.problem = dict(problem)
        self.active_revision = active_revision


class PolicyEngine(Protocol):
    def decide(self, path: str, input: Mapping[str, Any], *, timeout_s: float | None = None) -> Decision:
        """Evaluate ``data.<path>`` with ``input``; raise POLICY_UNAVAILABLE on anything but a valid answer."""
        ...

    def decide_all(self, requests: Sequence[tuple[str, Mapping[str, Any]]], *,
                   timeout_s: float | None = None) -> list[Decision]:
        """Several decisions, each as ``decide`` would make it, all under one revision; raise
        POLICY_UNAVAILABLE unless every one is a valid answer. A backend may evaluate them
        together (the embedded one does: one engine call instead of one each)."""
        ...

    def revision(self) -> str:
        """The active bundle revision ("" when none is active)."""
        ...

    def active(self) -> bool:
        """True once the expected bundle is loaded and answering."""
        ...

    def reload(self) -> str:
        """Atomically load the bundle again; returns the new revision. Raises BundleRefused
        when the bundle was read and refused (the previous revision stays active), another
        POLICY_UNAVAILABLE when the backend cannot be reached."""
        ...

    def close(self) -> None: ...
