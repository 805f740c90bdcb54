package engram.log_test

import data.engram.log

_p(path) := {"op": "pseudonymize", "path": path}

_known := {
	_p("/input/context/tenant"), _p("/input/context/workspace"), _p("/input/context/principal"),
	_p("/input/context/agent_id"), _p("/input/context/session"), _p("/input/context/purpose_ref"),
	_p("/input/attestation/tenant"), _p("/input/attestation/workspace"), _p("/input/purpose_ref"),
	_p("/input/context/host_key/tenants"), _p("/input/target/tenant"), _p("/input/target/workspace"),
	_p("/input/family_refs"), _p("/input/candidate/family_refs"),
	_p("/input/candidate/principal"), _p("/input/candidate/agent_id"),
	_p("/input/candidate/instructions/*/hosts"), _p("/input/instructions/*/hosts"),
	_p("/input/candidate/provenance/source_hosts"), _p("/input/candidate/provenance/locator_hosts"),
	_p("/input/provenance/source_hosts"), _p("/input/provenance/locator_hosts"),
	_p("/input/record/principal"), _p("/input/record/agent_id"), _p("/input/record/family_refs"),
	_p("/input/members/*/principal"), _p("/input/members/*/agent_id"), _p("/input/members/*/family_refs"),
	"/result/reasons/*/message",
}

test_every_decision_family_of_the_core_gets_the_known_mask if {
	every path in [
		"engram/authz/decision", "engram/authz/tools", "engram/capture/decision", "engram/admission/decision",
		"engram/redaction/decision", "engram/retention/decision", "engram/reconciliation/decision",
	] {
		log.path_mask(path) == _known
	}
}

test_an_unknown_family_is_pseudonymized_whole if {
	log.path_mask("engram/binding/decision") == {_p("/input"), _p("/result")}
}

test_an_empty_path_is_pseudonymized_whole if {
	log.path_mask("") == {_p("/input"), _p("/result")}
}

test_without_configuration_everything_is_pseudonymized if {
	log.path_mask("engram/authz/decision") == {_p("/input"), _p("/result")} with data.engram.config.decision_log as {}
}
