"""The hash chains every engine keeps (SPEC §7, §10): the journal's events and the audit log.

Each event and each audit row carries the digest of its predecessor and its own
digest over everything else; ``GENESIS`` is the predecessor of the first. The
digests are defined on the canonical documents, not on any engine's rows, so a
store, a backup, a verifier and an audit device outside the data directory all
compute the same chain whatever engine wrote it.
"""

from __future__ import annotations

from typing import Any

from engram_core.canonical import digest
from engram_core.store.port import AuditRow

GENESIS = "sha256:" + "0" * 64


def event_digest_of(e: dict[str, Any]) -> str:
    return digest("event", {k: v for k, v in e.items() if k != "event_digest"})


def audit_digest_of(row: dict[str, Any]) -> str:
    return digest("audit", {k: v for k, v in row.items() if k != "row_digest"})


def audit_doc(row: AuditRow, head: tuple[int, str]) -> dict[str, Any]:
    """The audit row document that follows ``head`` (seq, row digest) in the chain."""
    doc = {
        "seq": head[0] + 1, "at_ms": row.at_ms, "audit_id": row.audit_id, "tenant": row.tenant,
        "workspace": row.workspace, "principal": row.principal, "agent_id": row.agent_id,
        "operation": row.operation, "outcome": row.outcome, "target_digest": row.target_digest,
        "decisions": row.decisions, "prev_digest": head[1],
    }
    doc["row_digest"] = audit_digest_of(doc)
    return doc
