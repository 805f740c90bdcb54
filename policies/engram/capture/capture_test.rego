package engram.capture_test

import data.engram.capture

_ctx(overrides) := object.union(
	{
		"tenant": "acme", "workspace": "main", "principal": "user:ada", "agent_id": "agent-1",
		"session": "sess-1", "purpose_ref": "purpose:notes", "host_key_id": "hk-1",
		"memory_enabled": true, "host_principal": false, "maintenance_scopes": [],
		"authorization_epoch": 1,
	},
	overrides,
)

_now := 1700000000000

_day_ms := 86400000

# A well-formed capture input; `overrides` replaces top-level keys.
_in(overrides) := object.union(
	{
		"context": _ctx({}), "now_ms": _now, "family_refs": [], "findings": [],
		"components": {"count": 2, "kinds": {"context": 1, "decision": 1, "evidence": 0}, "text_bytes": 120},
		"citations": {"count": 1}, "evidence": {"citation_count": 1, "has_attestation": false},
		"payload_bytes": 900, "valid_time": {"t": _now - _day_ms}, "primary_event_at": _now - _day_ms,
	},
	overrides,
)

_r(code, message) := {"code": code, "message": message}

_result(allow, reasons, retention) := {
	"allow": allow, "reasons": reasons, "retention": retention, "confirmation_required": false,
}

# --- golden cases (mirrored by tests/policy/fixtures/capture/*.json) ---

test_golden_default_allowed if {
	capture.decision == _result(true, [], {"derivative_rule": "make-ineligible"}) with input as _in({})
}

test_golden_expiry_within_cap_allowed if {
	capture.decision == _result(true, [], {"derivative_rule": "make-ineligible", "expires_at_ms": _now + (30 * _day_ms)}) with input as _in({"retention": {"derivative_rule": "make-ineligible", "expires_at_ms": _now + (30 * _day_ms)}})
}

test_golden_retain_not_allowed if {
	capture.decision == _result(
		false,
		[_r("RETAIN_NOT_ALLOWED", "The host does not permit retaining derivatives.")],
		{"derivative_rule": "retain"},
	) with input as _in({"retention": {"derivative_rule": "retain"}})
}

test_golden_expiry_beyond_cap if {
	capture.decision == _result(
		false,
		[_r("EXPIRY_BEYOND_CAP", "The expiry is beyond the host's retention cap.")],
		{"derivative_rule": "make-ineligible", "expires_at_ms": _now + (366 * _day_ms)},
	) with input as _in({"retention": {"expires_at_ms": _now + (366 * _day_ms)}})
}

test_golden_family_not_consented if {
	capture.decision == _result(
		false,
		[_r("FAMILY_NOT_CONSENTED", "The host has not consented to family \"family:deploys\".")],
		{"derivative_rule": "make-ineligible"},
	) with input as _in({"family_refs": ["family:deploys"]})
}

test_golden_secret_findings if {
	capture.decision == _result(
		false,
		[
			_r("SECRET_FINDINGS", "The secret scanner reported aws_access_key."),
			_r("SECRET_FINDINGS", "The secret scanner reported jwt."),
		],
		{"derivative_rule": "make-ineligible"},
	) with input as _in({"findings": [{"kind": "jwt", "count": 2}, {"kind": "aws_access_key", "count": 1}]})
}

# --- further behaviour ---

_acme := {
	"retain_allowed": true, "expiry_cap_ms": 7 * _day_ms,
	"consented_families": ["family:deploys"], "confirmation_required_tools": ["engram_memory_capture"],
}

test_tenant_config_permits_retain_families_and_requires_confirmation if {
	capture.decision == {
		"allow": true, "reasons": [], "confirmation_required": true,
		"retention": {"derivative_rule": "retain", "expires_at_ms": _now + (7 * _day_ms)},
	} with input as _in({"retention": {"derivative_rule": "retain", "expires_at_ms": _now + (7 * _day_ms)}, "family_refs": ["family:deploys"]})
		with data.engram.config.tenants.acme as _acme
}

test_tenant_cap_is_tenant_specific if {
	capture.decision.reasons == [_r("EXPIRY_BEYOND_CAP", "The expiry is beyond the host's retention cap.")] with input as _in({"retention": {"expires_at_ms": _now + (8 * _day_ms)}})
		with data.engram.config.tenants.acme as _acme
}

test_unknown_derivative_rule_denied if {
	capture.decision.reasons == [_r("INVALID_INPUT", "The derivative rule is not known.")] with input as _in({"retention": {"derivative_rule": "keep-forever"}})
}

test_missing_now_and_context_denied if {
	capture.decision == _result(
		false,
		[
			_r("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal."),
			_r("INVALID_INPUT", "The policy input lacks now_ms."),
			_r("INVALID_INPUT", "The policy input lacks valid_time.t."),
		],
		{"derivative_rule": "make-ineligible"},
	) with input as {}
}

# --- the window of payload times (issue 26.5, 31.3): data valid_time_window {floor_ms, horizon_ms} ---

_floor := 31536000000 # 1971-01-01T00:00:00.000Z

_horizon := 31622400000 # 366 days

_before_floor(field) := _r("TIME_BEFORE_FLOOR", sprintf("%s is before the host's floor for payload times.", [field]))

_beyond_horizon(field) := _r("TIME_BEYOND_HORIZON", sprintf("%s is beyond the host's horizon for payload times.", [field]))

_default_retention := {"derivative_rule": "make-ineligible"}

# Mirrors tests/policy/fixtures/capture/time_before_floor.json: epoch seconds sent as milliseconds.
test_golden_time_before_floor if {
	capture.decision == _result(false, [_before_floor("primary_event.at"), _before_floor("valid_time.t")], _default_retention) with input as _in({"valid_time": {"t": 1796125975}, "primary_event_at": 1796125975})
}

test_far_future_times_are_refused if {
	capture.decision == _result(false, [_beyond_horizon("valid_time.t")], _default_retention) with input as _in({"valid_time": {"t": 9007199254740991}})
	capture.decision == _result(false, [_beyond_horizon("primary_event.at")], _default_retention) with input as _in({"primary_event_at": (_now + _horizon) + 1})
}

test_the_window_is_inclusive if {
	capture.decision == _result(true, [], _default_retention) with input as _in({"valid_time": {"t": _floor}, "primary_event_at": _now + _horizon})
	capture.decision == _result(false, [_before_floor("valid_time.t")], _default_retention) with input as _in({"valid_time": {"t": _floor - 1}})
}

test_a_tenant_sets_its_own_window if {
	wide := {"floor_ms": -2208988800000, "horizon_ms": 10 * _horizon}
	capture.decision == _result(true, [], _default_retention) with input as _in({"valid_time": {"t": -631152000000}})
		with data.engram.config.tenants.acme.valid_time_window as wide
	capture.decision == _result(false, [_before_floor("valid_time.t")], _default_retention) with input as _in({"valid_time": {"t": -631152000000}, "context": _ctx({"tenant": "globex"})})
		with data.engram.config.tenants.acme.valid_time_window as wide
}

test_missing_valid_time_is_invalid_input if {
	capture.decision == _result(false, [_r("INVALID_INPUT", "The policy input lacks valid_time.t.")], _default_retention) with input as object.remove(_in({}), ["valid_time"])
}
