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

# --- content signals (issue 59) ---

_sig(code, count, quoted, negated) := {"code": code, "count": count, "quoted": quoted, "negated": negated, "kinds": ["decision"]}

_pipe(hosts) := object.union(_sig("PIPE_TO_SHELL", 1, 0, 0), {"hosts": hosts})

# A current record compared with the candidate; `overrides` replaces comparison facts.
_sim(overrides) := object.union(
	{
		"record_id": "mem_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "lexical": 0.4,
		"same_text": false, "same_kind": true, "same_family": false, "distinct_shared": 0,
		"distinct_added": 0, "distinct_missing": 0, "polarity_differs": false, "slot_edit": false,
		"subject_changed": false,
	},
	overrides,
)

# A candidate whose text has `terms` distinct terms and `similar` current records like it.
_near_in(terms, similar) := _in({"primary_kind": "decision", "text_terms": terms, "similar": similar})

_near_msg := "The candidate restates current record mem_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa."

test_golden_hold_instruction_signal if {
	admission.decision == {"decision": "adjudication_required", "reasons": [
		_r("AGENT_ADDRESSED", "Instruction signal AGENT_ADDRESSED: 1 occurrence(s) in decision."),
	]} with input as _in({"instructions": [_sig("AGENT_ADDRESSED", 1, 0, 0)]})
}

test_golden_reject_near_duplicate if {
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"same_text": true, "lexical": 1})])
}

test_quoted_occurrence_of_exempt_code_does_not_hold if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"instructions": [_sig("OVERRIDE_PHRASE", 1, 1, 0)]})
}

test_quoted_occurrence_of_other_code_holds if {
	admission.decision == {"decision": "adjudication_required", "reasons": [
		_r("TOOL_CALL_SHAPE", "Instruction signal TOOL_CALL_SHAPE: 1 occurrence(s) in decision."),
	]} with input as _in({"instructions": [_sig("TOOL_CALL_SHAPE", 1, 1, 0)]})
}

test_negated_verification_advice_does_not_hold if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"instructions": [_sig("DISABLES_VERIFICATION", 2, 0, 2)]})
}

test_one_plain_occurrence_among_negated_holds if {
	admission.decision == {"decision": "adjudication_required", "reasons": [
		_r("DISABLES_VERIFICATION", "Instruction signal DISABLES_VERIFICATION: 2 occurrence(s) in decision."),
	]} with input as _in({"instructions": [_sig("DISABLES_VERIFICATION", 3, 1, 1)]})
}

test_pipe_to_shell_from_trusted_host_accepted if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"instructions": [_pipe(["sh.rustup.rs", "static.sh.rustup.rs"])]})
}

test_pipe_to_shell_from_unlisted_or_unread_host_held if {
	every hosts in [["get.tools-mirror.io"], [""], ["sh.rustup.rs", "evil.example"], ["notsh.rustup.rs"]] {
		admission.decision == {"decision": "adjudication_required", "reasons": [
			_r("PIPE_TO_SHELL", "Instruction signal PIPE_TO_SHELL: 1 occurrence(s) in decision."),
		]} with input as _in({"instructions": [_pipe(hosts)]})
	}
}

test_tenant_trusts_its_own_shell_host if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"instructions": [_pipe(["tools.acme.internal"])]})
		with data.engram.config.tenants.acme as {"trusted_shell_hosts": ["acme.internal"]}
}

test_tenant_rejects_a_code if {
	admission.decision == {"decision": "reject", "reasons": [
		_r("OVERRIDE_PHRASE", "Instruction signal OVERRIDE_PHRASE: 2 occurrence(s) in context, decision."),
	]} with input as _in({"instructions": [object.union(_sig("OVERRIDE_PHRASE", 2, 0, 0), {"kinds": ["context", "decision"]})]})
		with data.engram.config.tenants.acme as {"instruction_reject_codes": ["OVERRIDE_PHRASE"]}
}

test_tenant_stops_holding_a_code if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"instructions": [_sig("MIXED_SCRIPT", 1, 0, 0)]})
		with data.engram.config.tenants.acme as {"instruction_hold_codes": ["AGENT_ADDRESSED"]}
}

test_restatement_with_shared_distinct_terms_rejected if {
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"lexical": 0.5, "distinct_shared": 1})])
}

test_restatement_by_lexical_similarity_alone_rejected if {
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"lexical": 0.7})])
}

test_restatement_by_semantic_similarity_rejected if {
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"lexical": 0.3, "semantic": 0.9})])
}

test_restatement_that_adds_or_drops_a_detail_rejected if {
	every overrides in [
		{"lexical": 0.8, "distinct_shared": 2, "distinct_added": 1},
		{"lexical": 0.8, "distinct_shared": 2, "distinct_missing": 1},
	] {
		admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
			with input as _near_in(8, [_sim(overrides)])
	}
}

test_short_texts_are_never_restatements if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _near_in(4, [_sim({"same_text": true, "lexical": 1})])
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(5, [_sim({"same_text": true, "lexical": 1})])
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"similar": [_sim({"same_text": true, "lexical": 1})]})
}

test_same_text_in_the_same_family_is_still_a_restatement if {
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"same_text": true, "same_family": true})])
}

test_a_context_said_again_is_another_event if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"primary_kind": "context", "text_terms": 9, "similar": [_sim({"same_text": true, "lexical": 1})]})
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _in({"primary_kind": "context", "text_terms": 9, "similar": [_sim({"same_text": true, "lexical": 1})]})
		with data.engram.config.tenants.acme as {"near_duplicate": {"action": "reject", "lexical": 0.7, "lexical_with_shared": 0.5, "shared_distinct": 1, "max_distinct_changes": 1, "min_terms": 5, "semantic": 0.9, "kinds": ["context", "decision", "evidence"]}}
}

test_below_thresholds_accepted if {
	every overrides in [
		{"lexical": 0.69},
		{"lexical": 0.49, "distinct_shared": 3},
		{"lexical": 0.3, "semantic": 0.89},
	] {
		admission.decision == {"decision": "accept", "reasons": []} with input as _near_in(8, [_sim(overrides)])
	}
}

test_near_miss_is_a_different_decision_accepted if {
	every overrides in [
		{"lexical": 0.95, "distinct_added": 1, "distinct_missing": 1},
		{"lexical": 0.95, "polarity_differs": true},
		{"lexical": 0.95, "slot_edit": true},
		{"lexical": 0.95, "subject_changed": true},
		{"lexical": 0.95, "same_family": true},
		{"lexical": 0.8, "semantic": 0.97, "distinct_shared": 2, "distinct_added": 2, "distinct_missing": 1},
		{"lexical": 0.8, "distinct_shared": 2, "distinct_missing": 2},
		{"lexical": 0.8, "semantic": 0.95, "distinct_shared": 1, "distinct_added": 2},
	] {
		admission.decision == {"decision": "accept", "reasons": []} with input as _near_in(8, [_sim(overrides)])
	}
}

test_exact_duplicate_stays_duplicate if {
	admission.decision == {"decision": "duplicate", "reasons": [
		_r("DUPLICATE_OF_CURRENT", "The candidate duplicates a current record."),
	]} with input as _in({"duplicate_of_current": true, "primary_kind": "decision", "text_terms": 9, "similar": [_sim({"same_text": true, "lexical": 1})]})
}

test_tightened_threshold_rejects_more if {
	admission.decision == {"decision": "reject", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"lexical": 0.6})])
		with data.engram.config.tenants.acme as {"near_duplicate": {"action": "reject", "lexical": 0.6, "lexical_with_shared": 0.5, "shared_distinct": 1, "max_distinct_changes": 1, "min_terms": 5, "semantic": 0.9, "kinds": ["decision", "evidence"]}}
}

test_near_duplicate_held_when_tenant_adjudicates if {
	admission.decision == {"decision": "adjudication_required", "reasons": [_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg)]}
		with input as _near_in(8, [_sim({"same_text": true})])
		with data.engram.config.tenants.acme as {"near_duplicate": {"action": "adjudicate", "lexical": 0.7, "lexical_with_shared": 0.5, "shared_distinct": 1, "max_distinct_changes": 1, "min_terms": 5, "semantic": 0.9, "kinds": ["decision", "evidence"]}}
}

test_untrusted_source_held_only_when_listed if {
	admission.decision == {"decision": "accept", "reasons": []}
		with input as _in({"provenance": {"source_hosts": ["evil.example"]}})
	admission.decision == {"decision": "adjudication_required", "reasons": [
		_r("UNTRUSTED_SOURCE", "A citation's host evil.example is not among the tenant's trusted sources."),
	]} with input as _in({"provenance": {"source_hosts": ["evil.example", "git.acme.dev"]}})
		with data.engram.config.tenants.acme as {"trusted_source_hosts": ["git.acme.dev"]}
}

test_signals_and_near_duplicate_reasons_together if {
	admission.decision == {"decision": "reject", "reasons": [
		_r("NEAR_DUPLICATE_OF_CURRENT", _near_msg),
		_r("ROLE_MARKUP", "Instruction signal ROLE_MARKUP: 2 occurrence(s) in decision."),
	]} with input as _in({"instructions": [_sig("ROLE_MARKUP", 2, 0, 0)], "primary_kind": "evidence", "text_terms": 6, "similar": [_sim({"same_text": true})]})
}
