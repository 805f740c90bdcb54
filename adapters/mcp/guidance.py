"""What the agent is told: server instructions, tool descriptions, the guide.

Written in our own words from SPEC §2–§8 and §13 and sections 0–4 of the agent
usage guide. The same guide is served as the ``instructions``, as the prompt
``engram_memory_guide`` and as the resource ``engram://guide``.
"""

from __future__ import annotations

import json

from adapters.mcp.envelope import (
    TEMPORARILY_UNAVAILABLE,
    TEMPORARILY_UNAVAILABLE_CODE,
    TRUSTED_CONTEXT_UNAVAILABLE,
    UNKNOWN_TOOL,
)
from engram_core.schema_examples import CAPTURE_EXAMPLES, EXAMPLE_PURPOSE

GUIDE_PROMPT_NAME = "engram_memory_guide"
GUIDE_RESOURCE_URI = "engram://guide"

_WHEN = (
    "Use memory for durable, reusable knowledge that a later session or another agent should find again: "
    "decisions with their reasons, facts verified against a citable source, conventions, recurring problems "
    "and their fixes, hand-over notes. Do not use it for drafts, work in progress, chat transcripts, raw tool "
    "output, task-level notes or speculation. Never store secrets of any kind: API or signing keys, tokens, "
    "passwords, connection strings, .env values, session cookies, private keys, or your host's own credentials."
)

TOOL_DESCRIPTIONS: dict[str, str] = {
    "engram_memory_search": (
        "Find current, accepted memory records by text, with a rank receipt. Read-only. Search before you "
        "capture anything, and cite the record_id of what you rely on. Pass query and your bound purpose_ref; "
        "omit optional fields rather than sending null. An empty records list means nothing matched. "
        "STALE_PAGE: search again without page_cursor. RESULT_TOO_LARGE / PROJECTION_OVERSIZED: lower limit or "
        "raise max_packet_bytes. " + _WHEN
    ),
    "engram_memory_get": (
        "Read one known, current record by record_id, copied exactly from an earlier result (search's "
        "records[].record.record_id, or an accepted admission's outcome.record_id); the example's id is a "
        "placeholder. Read-only. Pass your bound purpose_ref. NOT_FOUND means unknown, outside your scope, or "
        "no longer current; they are deliberately indistinguishable, so do not probe variants."
    ),
    "engram_memory_capture": (
        "Submit a cited piece of durable knowledge as a sealed, pending candidate. It is not searchable "
        "until admitted; the candidate_id is not a record_id. Search first: if an equivalent current record "
        "exists, cite it instead. Every component cites at least one citation; payload.purpose_ref must be "
        "your bound purpose_ref. Choose one idempotency_key (16-256 bytes) per logical capture, keep it, "
        "and retry with the same key and identical arguments: duplicate_exact is that replay, not a semantic "
        "duplicate check. Omit retention unless told otherwise. " + _WHEN
    ),
    "engram_memory_request_admission": (
        "Ask the host's admission policy to decide a pending candidate: pass the candidate_id your capture "
        "returned (the example's id is a placeholder). You cannot supply the decision. "
        "accepted, rejected, pending_adjudication and duplicate_exact are all successful answers: report the "
        "exact outcome. duplicate_exact means a current record in this scope already holds identical "
        "content; its record_id is in the outcome and no second record was made. "
        "Content equal to something forgotten in this scope stays pending_adjudication; never reword "
        "forgotten content to get around that. An accepted outcome carries the record_id that get, search "
        "results and forget use."
    ),
    "engram_memory_withdraw": (
        "Withdraw one of your pending candidates for good (candidate_id, idempotency_key, reason_ref); the "
        "candidate_id is the one your capture returned (the example's id is a placeholder). "
        "A human must confirm through the host; you cannot confirm on anyone's behalf and no argument "
        "does it. gate_failed means the confirmation was not given."
    ),
    "engram_memory_forget": (
        "Forget an accepted record for good: its body is destroyed and it leaves search and get "
        "(record_id, idempotency_key, reason_ref). The record_id comes from an earlier result (search, or an "
        "accepted admission); the example's id is a placeholder. A human must confirm through the host; no argument "
        "does it. gate_failed means the confirmation was not given."
    ),
}

TOOL_TITLES: dict[str, str] = {
    "engram_memory_search": "Search memory",
    "engram_memory_get": "Get a memory record",
    "engram_memory_capture": "Capture a memory candidate",
    "engram_memory_request_admission": "Request admission of a candidate",
    "engram_memory_withdraw": "Withdraw a pending candidate",
    "engram_memory_forget": "Forget a memory record",
}


def worked_captures(purpose_ref: str | None) -> str:
    """One complete engram_memory_capture per kind of memory agents keep, mapped onto
    components and citations (the same examples the capture schema publishes)."""
    parts = [
        "Worked captures. One per kind of memory; each is a complete, valid engram_memory_capture call "
        "(the same examples the tool's inputSchema lists). Use a fresh idempotency_key of your own, "
        "your own text, sources and times (valid_time.t and primary_event.at are epoch milliseconds), "
        "and your bound purpose_ref. content_digest and evidence_digest are sha256: + 64 lowercase hex "
        "of the cited content. Then call engram_memory_request_admission with the candidate_id."
    ]
    for number, (kind, (mapping, example)) in enumerate(CAPTURE_EXAMPLES.items(), start=1):
        text = json.dumps(example, ensure_ascii=False, separators=(",", ":"))
        if purpose_ref:
            text = text.replace(json.dumps(EXAMPLE_PURPOSE), json.dumps(purpose_ref, ensure_ascii=False))
        parts.append(f"{number}. A {kind}: {mapping}.\n{text}")
    return "\n\n".join(parts)


def _purpose_mismatch(which: str) -> str:
    """SPEC §2: a purpose other than the bound one is the -32603 refusal, whose constant message
    cannot say why; so the guide says what it looks like and the one thing worth checking."""
    return (f"A purpose_ref other than {which}, in engram_memory_search, engram_memory_get or payload.purpose_ref "
            "of engram_memory_capture, is refused before anything happens, and not with an envelope: the call "
            f"fails with the protocol error JSON-RPC -32603 \"{TRUSTED_CONTEXT_UNAVAILABLE}\", which "
            "never says why. So when a call that carried a purpose_ref fails with -32603, compare what you sent "
            "with your bound purpose_ref and resend once with exactly that value; never try other values.")


def _purpose(purpose_ref: str | None) -> str:
    if purpose_ref:
        return (f"Your bound purpose_ref is {purpose_ref!r}. It comes from your host, not from you: the host "
                "binds it to this connection together with your scope and identity (an operator finds it as "
                "[binding] purpose_ref in the adapter's host config, and `engram doctor` shows it), and no "
                "argument changes it. Pass exactly this value wherever purpose_ref is asked. "
                + _purpose_mismatch("this one"))
    return ("Your purpose_ref is bound by your host for each request (in the signed host context it sends with "
            "the request), not by you, and no argument changes it. Pass exactly that value wherever purpose_ref "
            "is asked; if you were not told it, ask the host operator. " + _purpose_mismatch("that one"))


def guide(purpose_ref: str | None) -> str:
    """The agent guide; names the bound purpose when the binding is fixed."""
    return f"""Engram: governed long-term memory.

{_purpose(purpose_ref)}

Host-owned context. Never pass tenant, workspace, scope, principal, agent_id, session, credential, auditId,
deadline, cancellation or any confirmation in arguments: the host binds them on every call. Every input schema
is closed; an extra field or a null is INVALID_SCHEMA. You only ever see your own scope; anything else is
NOT_FOUND. Memory is off unless your host enabled it: a missing tool means you do not have that capability,
and no memory tools at all means memory is off for you. Do not look for another way in.

When to use memory. {_WHEN}

Discipline.
1. Search before capture. Cite the record_id of an existing current record instead of capturing it again.
2. Capture creates a sealed pending candidate, not a record. It cannot be searched or read.
3. Admission is requested, not assumed: call engram_memory_request_admission and report the exact outcome
   (accepted, rejected, pending_adjudication, or duplicate_exact with the record_id of the current record that
   already holds identical content). Forgotten content stays pending_adjudication; never reword it.
4. Cite sources: every component cites at least one citation with a content digest (sha256: + 64 hex). Names
   written in text carry no authority; your identity is what the host bound.
5. One idempotency_key per logical mutation (16-256 UTF-8 bytes: 16 or more ASCII characters); record it
   before the call; retry with the same key and identical arguments. Same key with other content is
   DIGEST_CONFLICT.
6. withdraw and forget always need a human confirmation obtained by the host; capture and admission may.
   You cannot confirm for yourself. gate_failed means it was not given: ask the human through the host.
7. Times (valid_time.t, valid_time.t_end, primary_event.at) are epoch milliseconds, UTC:
   2026-01-01T00:00:00.000Z is 1767225600000. Epoch seconds (1767225600) would mean January 1970 and are
   refused (UNAUTHORIZED, "... earlier than the host accepts"), as are times further ahead than the host
   allows. A record whose valid_time.t is still in the future is not returned until then.

Ids come from results. Every id you pass was returned by an earlier call; never make one up. The ids in the tool
examples are placeholders that answer NOT_FOUND. The chain:
  engram_memory_capture -> output.value.candidate_id
  -> engram_memory_request_admission {{candidate_id, idempotency_key}} -> output.value.outcome.record_id (when
     outcome.status is accepted or duplicate_exact)
  -> engram_memory_get {{record_id, purpose_ref}}.
engram_memory_search returns record ids too (output.value.records[].record.record_id). engram_memory_withdraw
takes a candidate_id (one still pending), engram_memory_forget a record_id. Copy ids exactly.

Search scores. Records come best first (rank). score runs from 0 to 1 and means the same in every search:
the top score says how much of your query the best record holds. A top score below about 0.2 (lexical) or
0.4 (lexical_and_semantic) usually means nothing in memory answers the query; about 0.8 or more, a record
holds all of it. It is evidence, not proof: read the record. Question and stop words (what, did, anything,
remember, the) are not evidence; word forms match (adopted, adopting); a time you name ("last spring", "in
March 2025") ranks records from that time first. Records captured one after another with the same valid_time.t
(the turns of one conversation, each dated with its session) are searched together: the turns beside a match
come back after it, since an answer often follows the turn that holds your words. Give notes captured
separately their own times.

Results. Every tool result is an envelope: {{ok: true, output: {{schema_version: 1, value}}, auditId,
redactionClass}} or {{ok: false, auditId, redactionClass, error: {{code, message, retriable}}}}. Act on error.code
and error.retriable; the message is a fixed sentence per code and kind of mistake (it never repeats your input)
that says what to fix: e.g. INVALID_SCHEMA "A citation id does not resolve ...", UNAUTHORIZED "The content looks
like a credential ..." (remove the secret; this is not a permissions problem), gate_failed "This client cannot
ask a human ..." (nothing will change until a client that can ask is used). retriable true: back off and retry (mutations with the same
key and arguments). MUTATION_OUTCOME_UNKNOWN: it may have committed; retry with the same key until you get a
definitive answer. UNAUTHORIZED and the like: stop and report to the host; never retry as someone else.
NOT_FOUND: treat the target as unavailable. ILLEGAL_TRANSITION / ALREADY_TERMINAL: re-check with search or get.

{worked_captures(purpose_ref)}

Protocol errors are not memory answers: they are JSON-RPC errors, not envelopes, and say whether to retry or stop.
- {TEMPORARILY_UNAVAILABLE_CODE} "{TEMPORARILY_UNAVAILABLE}" (tools/list while the memory core is not answering): retry.
  Its error data is the error object an envelope would carry, e.g. {{code: STORE_UNAVAILABLE, retriable: true}}.
  Back off and list again; tool calls meanwhile answer the same code as a retriable envelope.
- -32603 "{TRUSTED_CONTEXT_UNAVAILABLE}": stop. Your host's context for this call was refused (or a
  purpose_ref was not your bound one: check that once, as above). Report to the host operator and do not retry
  with changed arguments.
- -32602 "{UNKNOWN_TOOL}": stop using that tool; you do not have it.
In short, retry (after a back-off): retriable envelopes, MUTATION_OUTCOME_UNKNOWN with the same key,
{TEMPORARILY_UNAVAILABLE_CODE}.
Fix the arguments and call again: INVALID_SCHEMA, INVALID_DIGEST, STALE_PAGE, RESULT_TOO_LARGE,
PROJECTION_OVERSIZED. Stop and report: every other non-retriable code, -32603, -32602.
"""
