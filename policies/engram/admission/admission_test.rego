package engram.admission_test

import data.engram.admission

_ctx := {
	"tenant": "acme", "workspace": "main", "principal": "user:ada", "agent_id": "agent-1",
	"session": "sess-1", "purpose_ref": "purpose:notes", "host_key_id": "hk-1",
	"memory_enabled": true, "host_principal": false, "maintenance_scopes": [],
	"authorization_epoch": 1,
}

# A well-formed, cited candidate; `overrides` replaces candidate keys.
_in(overrides) := {"context": _ctx, "now_ms": 1700000000000, "candidate": object.union(
	{
		"trust_class": "asserted",
		"components": {"count": 2, "kinds": {"context": 1, "decision": 1, "evidence": 0}, "text_bytes": 120},
		"citations": {"count": 2}, "evidence": {"citation_count": 1, "has_attestation": false},
		"all_components_cited": true, "findings": [], "duplicate_of_current": false,
		"payload_bytes": 900, "retention": {"derivative_rule": "make-ineligible"}, "family_refs": [],
	},
	overrides,
)}

_r(code, message) := {"code": code, "message": message}

# --- golden cases (mirrored by tests/policy/fixtures/admission/*.json) ---

test_golden_accept_cited if {
	admission.decision == {"decision": "accept", "reasons": []} with input as _in({})
}

test_golden_reject_findings if {
	admission.decision == {"decision": "reject", "reasons": [
		_r("SECRET_FINDINGS", "The secret scanner reported private_key."),
	]} with input as _in({"findings": [{"kind": "private_key", "count": 1}]})
}

test_golden_duplicate_of_current if {
	admission.decision == {"decision": "duplicate", "reasons": [
		_r("DUPLICATE_OF_CURRENT", "The candidate duplicates a current record."),
	]} with input as _in({"duplicate_of_current": true})
}

test_golden_reject_uncited if {
	admission.decision == {"decision": "reject", "reasons": [
		_r("EVIDENCE_UNCITED", "The evidence cites no citation."),
		_r("NO_CITATIONS", "The candidate has no citations."),
		_r("UNCITED_COMPONENTS", "Not every component cites a citation."),
	]} with input as _in({"all_components_cited": false, "citations": {"count": 0}, "evidence": {"citation_count": 0, "has_attestation": false}})
}

test_adjudication_for_configured_trust_class if {
	admission.decision == {"decision": "adjudication_required", "reasons": [
		_r("TRUST_CLASS_REQUIRES_ADJUDICATION", "Candidates of trust class \"asserted\" need adjudication."),
	]} with input as _in({}) with data.engram.config.tenants.acme as {"adjudication_trust_classes": ["asserted"]}
}

# --- further behaviour ---

test_duplicate_wins_over_adjudication if {
	admission.decision == {"decision": "duplicate", "reasons": [
		_r("DUPLICATE_OF_CURRENT", "The candidate duplicates a current record."),
		_r("TRUST_CLASS_REQUIRES_ADJUDICATION", "Candidates of trust class \"asserted\" need adjudication."),
	]} with input as _in({"duplicate_of_current": true})
		with data.engram.config.tenants.acme as {"adjudication_trust_classes": ["asserted"]}
}

test_reject_wins_over_duplicate if {
	admission.decision == {"decision": "reject", "reasons": [
		_r("DUPLICATE_OF_CURRENT", "The candidate duplicates a current record."),
		_r("SECRET_FINDINGS", "The secret scanner reported private_key."),
	]} with input as _in({"duplicate_of_current": true, "findings": [{"kind": "private_key", "count": 1}]})
}

test_other_trust_class_not_adjudicated if {
	admission.decision == {"decision": "accept", "reasons": []} with input as _in({"trust_class": "signed"})
		with data.engram.config.tenants.acme as {"adjudication_trust_classes": ["asserted"]}
}

test_unknown_trust_class_and_no_components_rejected if {
	admission.decision == {"decision": "reject", "reasons": [
		_r("NO_COMPONENTS", "The candidate has no components."),
		_r("UNKNOWN_TRUST_CLASS", "The candidate's trust class is not known."),
	]} with input as _in({"trust_class": "root", "components": {"count": 0, "kinds": {}, "text_bytes": 0}})
}

test_missing_candidate_rejected if {
	admission.decision.decision == "reject" with input as {}
	_r("INVALID_INPUT", "The policy input lacks a candidate.") in admission.decision.reasons with input as {}
}
