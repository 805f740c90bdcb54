package engram.redaction_test

import data.engram.redaction

_ctx := {
	"tenant": "acme", "workspace": "main", "principal": "user:ada", "agent_id": "agent-1",
	"session": "sess-1", "purpose_ref": "purpose:notes", "host_key_id": "hk-1",
	"memory_enabled": true, "host_principal": false, "maintenance_scopes": [],
	"authorization_epoch": 1,
}

_in(operation, purpose) := {"context": _ctx, "operation": operation, "purpose_ref": purpose, "now_ms": 1700000000000}

_r(code, message) := {"code": code, "message": message}

_default_fields := [
	"/accepted_at", "/cursor", "/payload", "/payload_digest",
	"/record_digest", "/record_id", "/state", "/trust_class",
]

# --- golden cases (mirrored by tests/policy/fixtures/redaction/*.json) ---

test_golden_default_fields_get if {
	redaction.decision == {"allow_fields": _default_fields, "max_packet_bytes": 1048576, "reasons": []} with input as _in("engram_memory_get", "purpose:notes")
}

test_golden_unknown_operation_record_id_only if {
	redaction.decision == {"allow_fields": ["/record_id"], "max_packet_bytes": 1048576, "reasons": [
		_r("UNKNOWN_OPERATION", "Redaction applies to search and get only."),
	]} with input as _in("engram_memory_capture", "purpose:notes")
}

# --- further behaviour ---

_purposes := {"purpose:audit": {
	"allow_fields": ["/principal", "/agent_id", "/state", "/not_a_field"],
	"max_packet_bytes": 65536,
}}

test_purpose_override_keeps_record_id_and_drops_unknown_fields if {
	redaction.decision == {"allow_fields": ["/agent_id", "/principal", "/record_id", "/state"], "max_packet_bytes": 65536, "reasons": []} with input as _in("engram_memory_search", "purpose:audit")
		with data.engram.config.redaction.purposes as _purposes
}

test_other_purpose_gets_defaults if {
	redaction.decision.allow_fields == _default_fields with input as _in("engram_memory_search", "purpose:notes")
		with data.engram.config.redaction.purposes as _purposes
}

test_missing_purpose_record_id_only if {
	redaction.decision == {"allow_fields": ["/record_id"], "max_packet_bytes": 1048576, "reasons": [
		_r("INVALID_INPUT", "The policy input lacks a purpose_ref."),
	]} with input as {"context": _ctx, "operation": "engram_memory_get", "now_ms": 1}
}
