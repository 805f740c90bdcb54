# Admission: accept | reject | duplicate | adjudication_required for a pending candidate
# (SPEC §5 engram_memory_request_admission). The forgotten-content protection is
# a core invariant applied after this decision, not a policy choice.
package engram.admission

import data.engram.lib

_candidate := input.candidate

_trust_classes := {"asserted", "earned", "signed"}

# METADATA
# title: Admission decision
# description: >-
#   reject when any reject reason applies; else duplicate when its content
#   equals a current record's in this scope (the core answers duplicate_exact
#   with that record's id and makes no second record); else
#   adjudication_required when any adjudication reason applies; else accept. A
#   candidate is acceptable when it is well formed and cited (every component
#   cited, at least one citation, evidence citing at least one), has no secret
#   findings, does not duplicate or restate a current record, and carries no
#   instruction signal the tenant holds (issue 59).
decision := {
	"decision": _outcome,
	"reasons": sort([r | some r in _reasons]),
}

_outcome := "reject" if count(reject) > 0

_outcome := "duplicate" if {
	count(reject) == 0
	count(duplicate) > 0
}

_outcome := "adjudication_required" if {
	count(reject) == 0
	count(duplicate) == 0
	count(adjudicate) > 0
}

_outcome := "accept" if {
	count(reject) == 0
	count(duplicate) == 0
	count(adjudicate) == 0
}

_reasons := (reject | duplicate) | adjudicate

# METADATA
# title: Reject reasons
# description: Every reason the candidate is rejected; any one rejects it.
reject contains lib.reason("INVALID_INPUT", "The policy input lacks a candidate.") if {
	not _candidate_present
}

reject contains lib.reason("UNKNOWN_TRUST_CLASS", "The candidate's trust class is not known.") if {
	not _trust_class_known
}

reject contains lib.reason("NO_COMPONENTS", "The candidate has no components.") if {
	not _has_components
}

reject contains lib.reason("UNCITED_COMPONENTS", "Not every component cites a citation.") if {
	not _candidate.all_components_cited == true
}

reject contains lib.reason("NO_CITATIONS", "The candidate has no citations.") if {
	not _has_citations
}

reject contains lib.reason("EVIDENCE_UNCITED", "The evidence cites no citation.") if {
	not _evidence_cites
}

reject contains lib.reason("SECRET_FINDINGS", sprintf("The secret scanner reported %s.", [finding.kind])) if {
	some finding in _candidate.findings
}

# METADATA
# title: Duplicate reasons
# description: >-
#   Why the candidate is a duplicate of a current record (input.candidate.duplicate_of_current:
#   its effective payload digest equals a current record's in this scope).
duplicate contains lib.reason("DUPLICATE_OF_CURRENT", "The candidate duplicates a current record.") if {
	_candidate.duplicate_of_current == true
}

# Negations go through helper rules: OPA lifts a call's arguments out of `not`,
# so `not f(input.missing)` would be undefined instead of true (fail open).
_candidate_present if is_object(_candidate)

_trust_class_known if _candidate.trust_class in _trust_classes

_has_components if _candidate.components.count > 0

_is_duplicate if _candidate.duplicate_of_current == true

_has_citations if _candidate.citations.count > 0

_evidence_cites if _candidate.evidence.citation_count > 0

# METADATA
# title: Adjudication reasons
# description: Every reason the candidate needs a host adjudication (when nothing rejects it).
adjudicate contains lib.reason("TRUST_CLASS_REQUIRES_ADJUDICATION", sprintf("Candidates of trust class %q need adjudication.", [_candidate.trust_class])) if {
	_candidate.trust_class in lib.tenant_setting(input.context.tenant, "adjudication_trust_classes")
}

# --- content signals (issue 59): facts the core computed about the candidate's content -----

_setting(key) := lib.tenant_setting(input.context.tenant, key)

_signals := object.get(_candidate, "instructions", [])

_similar := object.get(_candidate, "similar", [])

_near := _setting("near_duplicate")

# Occurrences of a signal that stand: quoted ones do not for the codes in
# instruction_quoted_exempt, negated ones ("never use --no-verify") not for those in
# instruction_negation_exempt.
_quoted_off(s) := s.quoted if s.code in _setting("instruction_quoted_exempt")

else := 0

_negated_off(s) := s.negated if s.code in _setting("instruction_negation_exempt")

else := 0

_standing(s) := (s.count - _quoted_off(s)) - _negated_off(s)

# A pipe-to-shell counts only when it downloads from a host the tenant has not listed (or
# from one the core could not read: "").
_counts(s) if {
	s.code != "PIPE_TO_SHELL"
	_standing(s) > 0
}

_counts(s) if {
	s.code == "PIPE_TO_SHELL"
	_standing(s) > 0
	some host in s.hosts
	not _trusted_shell_host(host)
}

_trusted_shell_host(host) if host in _setting("trusted_shell_hosts")

_trusted_shell_host(host) if {
	some trusted in _setting("trusted_shell_hosts")
	endswith(host, concat("", [".", trusted]))
}

_signal_reason(s) := lib.reason(s.code, sprintf("Instruction signal %s: %d occurrence(s) in %s.", [s.code, _standing(s), concat(", ", s.kinds)]))

# METADATA
# title: Instruction signals that reject
# description: >-
#   A signal whose code is in the tenant's instruction_reject_codes rejects the candidate.
reject contains _signal_reason(s) if {
	some s in _signals
	s.code in _setting("instruction_reject_codes")
	_counts(s)
}

# METADATA
# title: Instruction signals that hold
# description: >-
#   A signal whose code is in the tenant's instruction_hold_codes (and not in its reject
#   codes) holds the candidate for a human: text that addresses the future reader.
adjudicate contains _signal_reason(s) if {
	some s in _signals
	s.code in _setting("instruction_hold_codes")
	not s.code in _setting("instruction_reject_codes")
	_counts(s)
}

# A restatement of a current record: the same text, or close enough with nothing that says a
# different decision (a distinctive term or number swapped for another, a flipped polarity,
# one slot of the same sentence changed, another thing named, more than max_distinct_changes names or numbers
# added or dropped: a memory that says more or less than the record is not a restatement).
_restates(s) if s.same_text == true

_restates(s) if {
	_unchanged(s)
	s.distinct_shared >= _near.shared_distinct
	s.lexical >= _near.lexical_with_shared
}

_restates(s) if {
	_unchanged(s)
	s.lexical >= _near.lexical
}

_restates(s) if {
	_unchanged(s)
	object.get(s, "semantic", 0) >= _near.semantic
}

# A record of a reconciliation family the candidate names too is its reconciliation's business
# (the newcomer may supersede it): only the same text restates it.
_unchanged(s) if {
	s.same_family == false
	not _swapped(s)
	s.distinct_added + s.distinct_missing <= _near.max_distinct_changes
	s.polarity_differs == false
	s.slot_edit == false
	s.subject_changed == false
}

# A distinctive term (a name, a number, an identifier) of each text that the other lacks: one
# value replaced by another (Redis for Memcached, 30 for 60 seconds), a different decision.
_swapped(s) if {
	s.distinct_added > 0
	s.distinct_missing > 0
}

# Only a candidate whose primary component is of a kind in near_duplicate.kinds (decisions and
# evidence: knowledge) can restate a record; a context (what was said or happened: a turn of a
# conversation) said again at another time is another event. A text of fewer than
# near_duplicate.min_terms terms is too short to be judged a restatement.
_near_duplicate contains lib.reason("NEAR_DUPLICATE_OF_CURRENT", sprintf("The candidate restates current record %s.", [s.record_id])) if {
	not _is_duplicate
	object.get(_candidate, "primary_kind", "") in _near.kinds
	object.get(_candidate, "text_terms", 0) >= _near.min_terms
	some s in _similar
	_restates(s)
}

# METADATA
# title: Near-duplicates that reject
# description: >-
#   With near_duplicate.action "reject" (the default), a restatement of a current record is
#   rejected: no second record; the agent searches and finds the first.
reject contains r if {
	_near.action == "reject"
	some r in _near_duplicate
}

# METADATA
# title: Near-duplicates that hold
# description: >-
#   With near_duplicate.action "adjudicate", a human decides (an update that should supersede
#   the record is a reconciliation family's business: name the family).
adjudicate contains r if {
	_near.action == "adjudicate"
	some r in _near_duplicate
}

# METADATA
# title: Untrusted sources
# description: >-
#   When the tenant lists trusted_source_hosts (null: no check), a candidate citing a URL on
#   another host is held for a human.
adjudicate contains lib.reason("UNTRUSTED_SOURCE", sprintf("A citation's host %s is not among the tenant's trusted sources.", [host])) if {
	trusted := _setting("trusted_source_hosts")
	is_array(trusted)
	some host in object.get(object.get(_candidate, "provenance", {}), "source_hosts", [])
	not host in trusted
}
