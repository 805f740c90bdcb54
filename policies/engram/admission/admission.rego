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
#   findings and does not duplicate a current record.
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

_has_citations if _candidate.citations.count > 0

_evidence_cites if _candidate.evidence.citation_count > 0

# METADATA
# title: Adjudication reasons
# description: Every reason the candidate needs a host adjudication (when nothing rejects it).
adjudicate contains lib.reason("TRUST_CLASS_REQUIRES_ADJUDICATION", sprintf("Candidates of trust class %q need adjudication.", [_candidate.trust_class])) if {
	_candidate.trust_class in lib.tenant_setting(input.context.tenant, "adjudication_trust_classes")
}
