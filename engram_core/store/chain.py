"""The hash chains every engine keeps (SPEC §7, §10): the journal's events and the audit log.

Each event and each audit row carries the digest of its predecessor and its own
digest over everything else; ``GENESIS`` is the predecessor of the first. The
digests are defined on the canonical documents, not on any engine's rows, so a
store, a backup, a verifier and an audit device outside the data directory all
compute the same chain whatever engine wrote it.

The journal has one chain per scope. The audit log has several chains, so that several
writers (the cores of one PostgreSQL store) extend it without one row every call must
lock (docs/architecture.md, "The audit log's chains"):

- ``scope:<json [tenant, workspace]>``: the rows written inside a write transaction about
  that scope (every mutation, and maintenance that changes the scope), chained under the
  transaction's hold on the scope, so a scope's chain is as dense as its journal;
- ``writer:<id>``: the rows of calls that change nothing (reads, refusals, confirmations
  issued), chained by the one process that writes them, with a new id each time a core opens
  the store (its head lives in that process only);
- the legacy chain (``""``, rows from before migration 9): the one chain all rows shared
  then. Its documents have no ``chain`` field, as their digests were computed without one.

Each chain is dense from seq 1 with ``prev_digest`` linking each row to the one before.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any

from engram_core.contract.canonical import digest
from engram_core.store.port import AuditRow

GENESIS = "sha256:" + "0" * 64
LEGACY_CHAIN = ""


def event_digest_of(e: dict[str, Any]) -> str:
    return digest("event", {k: v for k, v in e.items() if k != "event_digest"})


def audit_digest_of(row: dict[str, Any]) -> str:
    return digest("audit", {k: v for k, v in row.items() if k != "row_digest"})


def scope_chain(tenant: str, workspace: str) -> str:
    """The audit chain of the rows written in a scope's write transactions."""
    return "scope:" + json.dumps([tenant, workspace], ensure_ascii=False, separators=(",", ":"))


def new_writer_chain() -> str:
    """A fresh chain for one process's rows of calls that change nothing."""
    return "writer:" + secrets.token_hex(12)


def chain_of(doc: dict[str, Any]) -> str:
    return doc.get("chain", LEGACY_CHAIN)


# The legacy rule: an audit document has these fields only where they were part of its digest
# (rows of the one chain before DuckDB's migration 9 have no ``chain``, rows of calls that claimed
# no nonce no ``context_nonce``); a table's column holds this value for a field absent.
OPTIONAL_AUDIT_FIELDS = {"chain": LEGACY_CHAIN, "context_nonce": ""}


def stored_audit_field(doc: dict[str, Any], key: str) -> Any:
    """What a table's column holds for ``doc``'s ``key`` (the value for an optional one absent)."""
    return doc.get(key, OPTIONAL_AUDIT_FIELDS[key]) if key in OPTIONAL_AUDIT_FIELDS else doc[key]


def digested_audit_doc(stored: dict[str, Any]) -> dict[str, Any]:
    """``stored`` (every column of an audit row) as the document its digest covers: an optional
    field holding its absent value dropped (changed in place, returned)."""
    for key, absent in OPTIONAL_AUDIT_FIELDS.items():
        if stored[key] == absent:
            del stored[key]
    return stored


def audit_doc(row: AuditRow, chain: str, head: tuple[int, str]) -> dict[str, Any]:
    """The audit row document that follows ``head`` (seq, row digest) in ``chain``."""
    doc = {
        "chain": chain, "seq": head[0] + 1, "at_ms": row.at_ms, "audit_id": row.audit_id, "tenant": row.tenant,
        "workspace": row.workspace, "principal": row.principal, "agent_id": row.agent_id,
        "operation": row.operation, "outcome": row.outcome, "target_digest": row.target_digest,
        "decisions": row.decisions, "prev_digest": head[1],
    }
    if row.context_nonce:  # rows from before migration 11, and rows of calls that claimed none, lack it
        doc["context_nonce"] = row.context_nonce
    if chain == LEGACY_CHAIN:
        del doc["chain"]
    doc["row_digest"] = audit_digest_of(doc)
    return doc


def by_chain(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by chain, each chain's in seq order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(chain_of(r), []).append(r)
    for chain_rows in out.values():
        chain_rows.sort(key=lambda r: int(r["seq"]))
    return out


def chain_heads(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[int, str]]:
    """Each chain's last (seq, row digest) among ``rows``."""
    return {chain: (int(rs[-1]["seq"]), rs[-1]["row_digest"]) for chain, rs in by_chain(rows).items() if rs}


def check_audit(rows: Iterable[dict[str, Any]], heads: dict[str, tuple[int, str]] | None = None) -> list[dict[str, Any]]:
    """Problems in the audit log's chains: each dense in seq from 1, prev links, row digests, and
    (``heads``) ending where the store says each chain ends."""
    problems: list[dict[str, Any]] = []
    grouped = by_chain(rows)
    for chain, chain_rows in sorted(grouped.items()):
        prev, expected = GENESIS, 1
        for r in chain_rows:
            where = {"chain": chain, "seq": int(r["seq"])} if chain else {"seq": int(r["seq"])}
            if int(r["seq"]) != expected:
                problems.append({**where, "problem": "seq_gap"})
            if r["prev_digest"] != prev:
                problems.append({**where, "problem": "prev_link"})
            if audit_digest_of(r) != r["row_digest"]:
                problems.append({**where, "problem": "row_digest"})
            prev, expected = r["row_digest"], int(r["seq"]) + 1
        if heads is not None and chain in heads and heads[chain] != (expected - 1, prev):
            problems.append({"chain": chain, "seq": heads[chain][0], "problem": "head"})
    for chain, head in sorted((heads or {}).items()):
        if chain not in grouped and head[0] > 0:
            problems.append({"chain": chain, "seq": head[0], "problem": "head"})
    return problems
