package engram.retention_test

import data.engram.retention

_ctx := {
	"tenant": "acme", "workspace": "main", "principal": "host:ops", "agent_id": "",
	"session": "sweep", "purpose_ref": "purpose:maintenance", "host_key_id": "hk-1",
	"memory_enabled": false, "host_principal": true, "maintenance_scopes": ["maintain"],
	"authorization_epoch": 1,
}

_now := 1700000000000

_in(record) := {"context": _ctx, "now_ms": _now, "record": record}

_r(code, message) := {"code": code, "message": message}

_expire := {"allow": true, "action": "expire", "reasons": [_r("EXPIRES_AT_PASSED", "The record's expiry has passed.")]}

_none := {"allow": true, "action": "none", "reasons": []}

# --- golden cases (mirrored by tests/policy/fixtures/retention/*.json) ---

test_golden_expire_due if {
	retention.decision == _expire with input as _in({"state": "accepted_current", "expires_at_ms": _now, "derivative_rule": "make-ineligible"})
}

test_golden_none_not_due if {
	retention.decision == _none with input as _in({"state": "accepted_current", "expires_at_ms": _now + 1, "derivative_rule": "make-ineligible"})
}

test_golden_none_tombstoned if {
	retention.decision == _none with input as _in({"state": "tombstoned", "expires_at_ms": _now - 1, "derivative_rule": "retain"})
}

# --- further behaviour ---

test_expirable_states if {
	every state in ["accepted_current", "accepted_disputed", "historical"] {
		retention.decision == _expire with input as _in({"state": state, "expires_at_ms": 1, "derivative_rule": "retain"})
	}
	every state in ["pending", "expired", "trust_invalid", "rejected"] {
		retention.decision == _none with input as _in({"state": state, "expires_at_ms": 1, "derivative_rule": "retain"})
	}
}

test_no_expiry_never_expires if {
	retention.decision == _none with input as _in({"state": "historical", "derivative_rule": "retain"})
}

test_invalid_input_denied if {
	retention.decision == {"allow": false, "action": "none", "reasons": [
		_r("INVALID_INPUT", "The policy input lacks a record state."),
		_r("INVALID_INPUT", "The policy input lacks now_ms."),
	]} with input as {}
}
