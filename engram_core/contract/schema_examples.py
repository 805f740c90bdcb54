"""Complete, valid example arguments of the six tools: the worked calls of the agent guide
(``engram://guide``), and the few the input schemas publish (``SCHEMA_EXAMPLES``).

The schemas carry only what a first call copies (issue 60: every agent pays for tools/list
in every session): capture's one compact example, complete and valid, and one search. The
worked captures per kind of memory and the other tools' calls are in the guide.

One capture per kind of memory agents keep (SPEC §13's "what memory is for", the guide's
§1): a decision with its reason, a verified fact, a known problem and its fix, a
convention, a hand-off. Each maps the kind onto components (``context`` / ``decision`` /
``evidence``) and citations. ``tests/mcp/test_mcp_schema_examples.py`` validates every
example against its schema and runs each through a real adapter and core.

The ids in the non-capture examples (candidate_id, record_id) are placeholders that say so
in their own letters: no call can succeed with them, since an id exists only once a previous
call returned it; ``EXAMPLE_ID_NOTES`` says, in the guide, which earlier result the id comes
from. ``purpose_ref`` stands for the purpose the host bound; the adapter writes the bound one
into the examples it lists and the guide it serves.
"""

from __future__ import annotations

from typing import Any

from engram_core.contract.tools import (
    ADMISSION_TOOL,
    CAPTURE_TOOL,
    FORGET_TOOL,
    GET_TOOL,
    SEARCH_TOOL,
    WITHDRAW_TOOL,
)

EXAMPLE_PURPOSE = "purpose:engineering-notes"
# Valid shapes (cand_ + base32; mem_ + 52 base32 characters) spelling out what they stand for.
EXAMPLE_CANDIDATE_ID = "cand_placeholdercopythecandidateidcapturereturned"
EXAMPLE_RECORD_ID = "mem_placeholdercopyarecordidfromsearchoradmissionresults"

_RECORD_ID_NOTE = ("The example's record_id is a placeholder (it answers NOT_FOUND): copy the record_id from an "
                   "earlier call's result, records[].record.record_id of engram_memory_search or "
                   "outcome.record_id of an accepted engram_memory_request_admission.")
_CANDIDATE_ID_NOTE = ("The example's candidate_id is a placeholder (it answers NOT_FOUND): copy the candidate_id "
                      "from an earlier call's result, the one engram_memory_capture returned.")
# Said in the guide beside each example that needs an id from an earlier call.
EXAMPLE_ID_NOTES: dict[str, str] = {
    GET_TOOL: _RECORD_ID_NOTE,
    ADMISSION_TOOL: _CANDIDATE_ID_NOTE,
    WITHDRAW_TOOL: _CANDIDATE_ID_NOTE,
    FORGET_TOOL: _RECORD_ID_NOTE,
}

# Times are epoch milliseconds (2025-12-01T00:00:00.000Z and later).
_T0 = 1_764_547_200_000


def _citation(cid: str, source_ref: str, scheme: str, value: str, digest_hex: str,
              observed_at: str | None = None) -> dict[str, Any]:
    citation: dict[str, Any] = {
        "citation_id": cid,
        "source_ref": source_ref,
        "locator": {"scheme": scheme, "value": value},
        "content_digest": "sha256:" + digest_hex,
    }
    if observed_at is not None:
        citation["observed_at"] = observed_at
    return citation


def _component(component_id: str, kind: str, text: str, *citation_ids: str) -> dict[str, Any]:
    return {"component_id": component_id, "kind": kind, "text": text, "citation_ids": list(citation_ids)}


def _capture(key: str, *, t: int, event_type: str, primary: str, components: list[dict[str, Any]],
             citations: list[dict[str, Any]], evidence_ref: str, evidence_digest_hex: str) -> dict[str, Any]:
    cited = sorted({cid for comp in components for cid in comp["citation_ids"]})
    primary_citation = next(c for c in components if c["component_id"] == primary)["citation_ids"][0]
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": EXAMPLE_PURPOSE,
            "valid_time": {"t": t},
            "components": components,
            "primary_component_id": primary,
            "primary_event": {"at": t, "type_ref": event_type, "citation_id": primary_citation},
            "citations": citations,
        },
        "evidence": {
            "evidence_ref": evidence_ref,
            "evidence_digest": "sha256:" + evidence_digest_hex,
            "citation_ids": cited,
        },
    }


# kind of memory -> (what it is, one complete capture)
CAPTURE_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "decision with its reason": (
        "the decision as a `decision` component (primary), the reason and the alternatives "
        "weighed as a `context` component, both citing the record of the decision (ADR, PR, minutes)",
        _capture(
            "capture-2025-12-01-adr-0007-store",
            t=_T0,
            event_type="event:decision-made",
            primary="decision",
            components=[
                _component("decision", "decision",
                           "The store is one DuckDB file written by exactly one core process; other "
                           "processes talk to that core over gRPC.",
                           "adr-0007"),
                _component("reason", "context",
                           "Reason: DuckDB allows one writer per file, and a single writer keeps the "
                           "journal and the audit chain in one order. PostgreSQL was considered and "
                           "deferred until several cores must share a store.",
                           "adr-0007"),
            ],
            citations=[_citation("adr-0007", "repo:engram/docs/adr/0007-duckdb-single-writer.md", "path",
                                 "docs/adr/0007-duckdb-single-writer.md",
                                 "367b2ee17dcac6bb6a53a3ef0c2b60a016ea705eed3b6da7e5845e03020c4a7e")],
            evidence_ref="evidence:adr-0007-accepted",
            evidence_digest_hex="5d0d4ba0c1e6cbd6a4d5a3b7a8e0b1c2d3e4f5061728394a5b6c7d8e9f0a1b2c",
        ),
    ),
    "verified fact": (
        "the fact as an `evidence` component (primary), citing the exact source it was checked "
        "against (a file at a commit, a command's output) with that content's digest and "
        "`observed_at`",
        _capture(
            "capture-2025-12-01-grpc-max-message",
            t=_T0 + 3_600_000,
            event_type="event:fact-verified",
            primary="fact",
            components=[
                _component("fact", "evidence",
                           "The core refuses gRPC messages larger than 8 MiB (MAX_MESSAGE_BYTES in "
                           "engram_core/rpc/server.py).",
                           "server-py"),
            ],
            citations=[_citation("server-py", "repo:engram@abee8eb", "path", "engram_core/rpc/server.py",
                                 "2ab5356a60a8952b0417de35a30876e94ef75220b65f1f06e9d264c484d48f8e",
                                 observed_at="2025-12-01T01:00:00.000Z")],
            evidence_ref="evidence:read-source-at-abee8eb",
            evidence_digest_hex="2ab5356a60a8952b0417de35a30876e94ef75220b65f1f06e9d264c484d48f8e",
        ),
    ),
    "known problem and its fix": (
        "the symptom and cause as a `context` component, the fix as a `decision` component "
        "(primary), and how the fix was verified as an `evidence` component, each citing its source",
        _capture(
            "capture-2025-12-01-crash-test-race",
            t=_T0 + 7_200_000,
            event_type="event:problem-fixed",
            primary="fix",
            components=[
                _component("symptom", "context",
                           "Problem: the crash test failed with NOT_FOUND now and then. A forget killed "
                           "in flight may have committed although its reply was lost.",
                           "issue-15"),
                _component("fix", "decision",
                           "Fix: the harness treats an unacknowledged forget as possibly done and accepts "
                           "either outcome for that record.",
                           "issue-15", "crash-test"),
                _component("verified", "evidence",
                           "Verified: the crash test passed 50 runs in a row after the change.",
                           "crash-test"),
            ],
            citations=[
                _citation("issue-15", "tracker:engram/issues/15", "issue", "15",
                          "3ed40bd62e731f9a08e02bd2c6e9583b387805601af19223527578e6c0d6a020"),
                _citation("crash-test", "repo:engram/tests/core/test_crash_safety.py", "path",
                          "tests/core/test_crash_safety.py",
                          "2db5aa58a763f2cf8da64e55ae08f536857ba5855fbbbc78597b8abc07d13f05"),
            ],
            evidence_ref="evidence:crash-test-50-runs",
            evidence_digest_hex="9f1c2e3d4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
        ),
    ),
    "convention": (
        "the rule as a `decision` component (primary) and where it applies as a `context` "
        "component, citing the document that states it",
        _capture(
            "capture-2025-12-01-test-naming-rule",
            t=_T0 + 10_800_000,
            event_type="event:convention-adopted",
            primary="rule",
            components=[
                _component("rule", "decision",
                           "Convention: a test is named after the behaviour it proves, for example "
                           "test_forget_removes_postings_in_same_transaction.",
                           "style"),
                _component("applies", "context",
                           "Applies to every test under tests/; test files mirror the package tree.",
                           "style"),
            ],
            citations=[_citation("style", "repo:engram/STYLE.md", "path", "STYLE.md",
                                 "a9b19ccf73804266933b0f0982056b16d07441283428ccd959f9116d352a635a")],
            evidence_ref="evidence:style-guide",
            evidence_digest_hex="a9b19ccf73804266933b0f0982056b16d07441283428ccd959f9116d352a635a",
        ),
    ),
    "hand-off": (
        "the state reached as a `context` component (primary) and the next step and who owns it "
        "as a `decision` component, citing the work item; durable facts only, no task notes",
        _capture(
            "capture-2025-12-01-handoff-store-v2",
            t=_T0 + 14_400_000,
            event_type="event:hand-off",
            primary="state",
            components=[
                _component("state", "context",
                           "Hand-off: store v2 is designed (issue 14) but not started; the Store port is "
                           "the only seam it needs.",
                           "issue-14"),
                _component("next", "decision",
                           "Next: the storage owner implements PostgreSQL behind the Store port; "
                           "nothing else changes.",
                           "issue-14"),
            ],
            citations=[_citation("issue-14", "tracker:engram/issues/14", "issue", "14",
                                 "4a6b8c0d2e4f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9")],
            evidence_ref="evidence:issue-14-thread",
            evidence_digest_hex="4a6b8c0d2e4f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9",
        ),
    ),
}

SEARCH_EXAMPLES: list[dict[str, Any]] = [
    {"query": "why is the store a single DuckDB writer", "purpose_ref": EXAMPLE_PURPOSE},
    {"query": "gRPC message size limit", "purpose_ref": EXAMPLE_PURPOSE, "limit": 5,
     "max_packet_bytes": 65_536, "capability_policy": {"minimum_channels": "lexical", "network": "forbid"}},
]

GET_EXAMPLES: list[dict[str, Any]] = [{"record_id": EXAMPLE_RECORD_ID, "purpose_ref": EXAMPLE_PURPOSE}]

ADMISSION_EXAMPLES: list[dict[str, Any]] = [
    {"candidate_id": EXAMPLE_CANDIDATE_ID, "idempotency_key": "admit-2025-12-01-adr-0007-store"},
]

WITHDRAW_EXAMPLES: list[dict[str, Any]] = [
    {"candidate_id": EXAMPLE_CANDIDATE_ID, "idempotency_key": "withdraw-2025-12-01-adr-0007",
     "reason_ref": "reason:captured-by-mistake"},
]

FORGET_EXAMPLES: list[dict[str, Any]] = [
    {"record_id": EXAMPLE_RECORD_ID, "idempotency_key": "forget-2025-12-01-adr-0007-store",
     "reason_ref": "reason:superseded-by-adr-0012"},
]

TOOL_EXAMPLES: dict[str, list[dict[str, Any]]] = {
    SEARCH_TOOL: SEARCH_EXAMPLES,
    GET_TOOL: GET_EXAMPLES,
    CAPTURE_TOOL: [example for _, example in CAPTURE_EXAMPLES.values()],
    ADMISSION_TOOL: ADMISSION_EXAMPLES,
    WITHDRAW_TOOL: WITHDRAW_EXAMPLES,
    FORGET_TOOL: FORGET_EXAMPLES,
}

# The capture a first try copies (published in engram_memory_capture's inputSchema): every
# required field once, one component citing one source, nothing optional. Kept compact: it is
# read in every session (tests/mcp/test_mcp_context_budget.py).
SCHEMA_CAPTURE_EXAMPLE: dict[str, Any] = _capture(
    "capture-adr-0007-store",
    t=_T0,
    event_type="event:decision-made",
    primary="d",
    components=[_component("d", "decision", "The store is one DuckDB file with one writer.", "adr")],
    citations=[_citation("adr", "repo:engram", "path", "docs/adr/0007.md",
                         "367b2ee17dcac6bb6a53a3ef0c2b60a016ea705eed3b6da7e5845e03020c4a7e")],
    evidence_ref="evidence:adr-0007",
    evidence_digest_hex="5d0d4ba0c1e6cbd6a4d5a3b7a8e0b1c2d3e4f5061728394a5b6c7d8e9f0a1b2c",
)

# What the input schemas publish as ``examples``; every other tool has its calls in the guide.
SCHEMA_EXAMPLES: dict[str, list[dict[str, Any]]] = {
    SEARCH_TOOL: SEARCH_EXAMPLES[:1],
    CAPTURE_TOOL: [SCHEMA_CAPTURE_EXAMPLE],
}
