package engram.authz_test

import data.engram.authz

# Tiny constructors keep each case to what it changes.
_ctx(overrides) := object.union(
	{
		"tenant": "acme", "workspace": "main", "principal": "user:ada", "agent_id": "agent-1",
		"session": "sess-1", "purpose_ref": "purpose:notes", "host_key_id": "hk-1",
		"memory_enabled": true, "host_principal": false, "maintenance_scopes": [],
		"authorization_epoch": 1, "host_key": _local_key,
	},
	overrides,
)

# The data directory's own host.key (and --trust-host-key at start): the operator's, every tenant.
_local_key := {"id": "hk-1", "local": true, "all_tenants": false, "tenants": [], "maintenance_scopes": []}

_all_tools := [
	"engram_memory_capture", "engram_memory_forget", "engram_memory_get",
	"engram_memory_request_admission", "engram_memory_search", "engram_memory_withdraw",
]

_in(operation, ctx, scope) := {"operation": operation, "context": ctx, "scope": scope, "now_ms": 1700000000000}

_active := {"activated": true, "tools": _all_tools}

_allowed(confirm) := {"allow": true, "reasons": [], "obligations": {"confirmation_required": confirm}}

_denied(reasons, confirm) := {"allow": false, "reasons": reasons, "obligations": {"confirmation_required": confirm}}

_r(code, message) := {"code": code, "message": message}

_host := _ctx({"host_principal": true, "memory_enabled": false})

# --- golden cases (mirrored by tests/policy/fixtures/authz/*.json) ---

test_golden_agent_search_allowed if {
	authz.decision == _allowed(false) with input as _in("engram_memory_search", _ctx({}), _active)
}

test_golden_forget_requires_confirmation if {
	authz.decision == _allowed(true) with input as _in("engram_memory_forget", _ctx({}), _active)
}

test_golden_memory_disabled_denied if {
	authz.decision == _denied(
		[_r("MEMORY_DISABLED", "Memory is not enabled for this host.")],
		false,
	) with input as _in("engram_memory_get", _ctx({"memory_enabled": false}), _active)
}

test_golden_scope_not_activated_denied if {
	authz.decision == _denied(
		[_r("SCOPE_NOT_ACTIVATED", "Memory is not activated for this tenant and workspace.")],
		true,
	) with input as _in("engram_memory_withdraw", _ctx({}), {"activated": false, "tools": _all_tools})
}

test_golden_tool_not_granted_denied if {
	authz.decision == _denied(
		[_r("TOOL_NOT_GRANTED", "The tool is not granted in this scope.")],
		false,
	) with input as _in("engram_memory_capture", _ctx({}), {"activated": true, "tools": ["engram_memory_search"]})
}

test_golden_admin_read_with_read_scope_allowed if {
	authz.decision == _allowed(false) with input as _in("admin.history", object.union(_host, {"maintenance_scopes": ["read"]}), {"activated": false, "tools": []})
}

test_golden_admin_requires_host_principal if {
	authz.decision == _denied(
		[_r("HOST_PRINCIPAL_REQUIRED", "Maintenance operations are for host principals only.")],
		false,
	) with input as _in("admin.export", _ctx({"maintenance_scopes": ["maintain"]}), _active)
}

test_golden_admin_maintain_requires_maintain_scope if {
	authz.decision == _denied(
		[_r("MAINTENANCE_SCOPE_REQUIRED", "The operation requires the \"maintain\" maintenance scope.")],
		false,
	) with input as _in("admin.activate", object.union(_host, {"maintenance_scopes": ["read"]}), {"activated": false, "tools": []})
}

_confirming_host := _ctx({"host_principal": true})

test_golden_host_issue_confirmation_allowed if {
	authz.decision == _allowed(false) with input as _in("host.issue_confirmation", _confirming_host, {"activated": false, "tools": []})
}

test_golden_host_issue_confirmation_agent_denied if {
	authz.decision == _denied(
		[_r("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only.")],
		false,
	) with input as _in("host.issue_confirmation", _ctx({}), _active)
}

test_golden_unknown_operation_denied if {
	authz.decision == _denied(
		[_r("UNKNOWN_OPERATION", "The operation is not known to the policy.")],
		false,
	) with input as _in("admin.drop_everything", _host, _active)
}

test_golden_tools_listed if {
	authz.tools == {"tools": ["engram_memory_get", "engram_memory_search"], "reasons": []} with input as {
		"context": _ctx({}),
		"scope": {"activated": true, "tools": ["engram_memory_search", "engram_memory_get", "not_a_tool"]},
		"now_ms": 1700000000000,
	}
}

test_golden_tools_empty_when_disabled if {
	authz.tools == {"tools": [], "reasons": [
		_r("MEMORY_DISABLED", "Memory is not enabled for this host."),
		_r("SCOPE_NOT_ACTIVATED", "Memory is not activated for this tenant and workspace."),
	]} with input as {"context": _ctx({"memory_enabled": false}), "scope": {"activated": false, "tools": _all_tools}, "now_ms": 1}
}

# --- further behaviour ---

test_maintain_scope_implies_read if {
	authz.decision == _allowed(false) with input as _in("admin.verify", object.union(_host, {"maintenance_scopes": ["maintain"]}), _active)
}

test_admin_never_needs_memory_or_activation if {
	authz.decision == _allowed(false) with input as _in("admin.activate", object.union(_host, {"maintenance_scopes": ["maintain"]}), {"activated": false, "tools": []})
}

test_host_issue_confirmation_needs_memory_enabled if {
	authz.decision == _denied(
		[_r("MEMORY_DISABLED", "Memory is not enabled for this host.")],
		false,
	) with input as _in("host.issue_confirmation", object.union(_confirming_host, {"memory_enabled": false}), _active)
}

test_agent_with_maintenance_scopes_still_cannot_issue_confirmation if {
	authz.decision == _denied(
		[_r("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only.")],
		false,
	) with input as _in("host.issue_confirmation", _ctx({"maintenance_scopes": ["read", "maintain"]}), _active)
}

test_agent_without_memory_gets_both_reasons_for_issue_confirmation if {
	authz.decision == _denied(
		[
			_r("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only."),
			_r("MEMORY_DISABLED", "Memory is not enabled for this host."),
		],
		false,
	) with input as _in("host.issue_confirmation", _ctx({"memory_enabled": false}), _active)
}

test_host_reads_authorization_epoch_without_memory_or_activation if {
	authz.decision == _allowed(false) with input as _in("host.authorization_epoch", _host, {"activated": false, "tools": []})
}

test_agent_cannot_read_authorization_epoch if {
	authz.decision == _denied(
		[_r("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only.")],
		false,
	) with input as _in("host.authorization_epoch", _ctx({}), _active)
}

test_authorization_epoch_needs_complete_context if {
	authz.decision == _denied(
		[_r("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal.")],
		false,
	) with input as _in("host.authorization_epoch", object.union(_host, {"workspace": ""}), _active)
}

test_incomplete_context_denied_everywhere if {
	reason := _r("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal.")
	authz.decision == _denied([reason], false) with input as _in("engram_memory_search", _ctx({"tenant": ""}), _active)
	authz.decision == _denied([reason], false) with input as _in("host.issue_confirmation", object.union(_confirming_host, {"principal": ""}), _active)
}

test_empty_input_denied if {
	authz.decision == _denied([_r("UNKNOWN_OPERATION", "The operation is not known to the policy.")], false) with input as {}
	authz.tools.tools == [] with input as {}
}

test_capture_confirmation_from_tenant_config if {
	authz.decision == _allowed(true) with input as _in("engram_memory_capture", _ctx({}), _active)
		with data.engram.config.tenants.acme as {"confirmation_required_tools": ["engram_memory_capture"]}
	authz.decision == _allowed(false) with input as _in("engram_memory_capture", _ctx({"tenant": "other"}), _active)
		with data.engram.config.tenants.acme as {"confirmation_required_tools": ["engram_memory_capture"]}
}

test_agent_tool_denials_accumulate if {
	authz.decision == _denied(
		[
			_r("MEMORY_DISABLED", "Memory is not enabled for this host."),
			_r("SCOPE_NOT_ACTIVATED", "Memory is not activated for this tenant and workspace."),
			_r("TOOL_NOT_GRANTED", "The tool is not granted in this scope."),
		],
		false,
	) with input as _in("engram_memory_search", _ctx({"memory_enabled": false}), {"activated": false, "tools": []})
}

# --- host.attest ---

_attest_ctx := {
	"tenant": "_host", "workspace": "_admin", "principal": "host:ops", "agent_id": "", "session": "s",
	"purpose_ref": "", "host_key_id": "hk-1", "memory_enabled": false, "host_principal": true,
	"maintenance_scopes": ["maintain"], "authorization_epoch": 0, "host_key": _local_key,
}

_attest(ctx, class, kid) := {
	"operation": "host.attest", "context": ctx, "scope": {"activated": true, "tools": []}, "now_ms": 1,
	"attestation": {"tenant": "acme", "workspace": "main", "trust_class": class, "verifier_key_id": kid, "target_kind": "record"},
}

_no_obligations := {"confirmation_required": false}

test_host_attest_earned_allowed_for_a_maintaining_host if {
	authz.decision == {"allow": true, "reasons": [], "obligations": _no_obligations} with input as _attest(_attest_ctx, "earned", "")
}

test_host_attest_signed_needs_a_trusted_verifier_key if {
	authz.decision == {"allow": false, "reasons": [{"code": "VERIFIER_NOT_TRUSTED", "message": "The verifier key is not trusted for signed attestations."}], "obligations": _no_obligations} with input as _attest(_attest_ctx, "signed", "ed25519:abc")
	authz.decision == {"allow": true, "reasons": [], "obligations": _no_obligations} with input as _attest(_attest_ctx, "signed", "ed25519:abc")
		with data.engram.config.tenants.acme.verifier_key_ids as ["ed25519:abc"]
}

test_host_attest_refused_to_agents_and_readers if {
	agent := object.union(_attest_ctx, {"host_principal": false, "maintenance_scopes": []})
	authz.decision == {"allow": false, "reasons": [
		{"code": "HOST_PRINCIPAL_REQUIRED", "message": "Host operations are for host principals only."},
		{"code": "MAINTENANCE_SCOPE_REQUIRED", "message": "The operation requires the \"maintain\" maintenance scope."},
	], "obligations": _no_obligations} with input as _attest(agent, "earned", "")
	reader := object.union(_attest_ctx, {"maintenance_scopes": ["read"]})
	authz.decision.reasons == [{"code": "MAINTENANCE_SCOPE_REQUIRED", "message": "The operation requires the \"maintain\" maintenance scope."}] with input as _attest(reader, "earned", "")
}

test_host_attest_unknown_trust_class_denied if {
	authz.decision.reasons == [{"code": "INVALID_INPUT", "message": "The attestation names no known trust class."}] with input as _attest(_attest_ctx, "asserted", "")
	authz.decision.allow == false with input as {"operation": "host.attest", "context": _attest_ctx}
}

test_golden_secret_in_request_denied if {
	authz.decision == _denied(
		[
			_r("SECRET_FINDINGS", "The secret scanner reported aws_access_key in the request."),
			_r("SECRET_FINDINGS", "The secret scanner reported github_token in the request."),
		],
		true,
	) with input as object.union(_in("engram_memory_forget", _ctx({}), _active), {"findings": [
		{"kind": "github_token", "rule": "github-token", "count": 1},
		{"kind": "aws_access_key", "rule": "aws-access-token", "count": 1},
	]})
}

test_secret_in_admin_request_denied_even_for_a_host if {
	authz.decision == _denied(
		[_r("SECRET_FINDINGS", "The secret scanner reported slack_webhook in the request.")],
		false,
	) with input as object.union(
		_in("admin.transition", _ctx({"host_principal": true, "maintenance_scopes": ["maintain"]}), _active),
		{"findings": [{"kind": "slack_webhook", "rule": "slack-webhook-url", "count": 1}]},
	)
}

test_no_findings_change_nothing if {
	authz.decision == _allowed(true) with input as object.union(
		_in("engram_memory_forget", _ctx({}), _active), {"findings": []},
	)
}

# --- quotas ---

_counts(n) := {"captures": n, "admissions": n, "searches": n, "gets": n, "bytes_stored": n, "retry_after_ms": 0}

_usage(principal_minute, retry) := {
	"windows": {"minute": {"ms": 60000}, "hour": {"ms": 3600000}},
	"principal": {"minute": object.union(principal_minute, {"retry_after_ms": retry}), "hour": _counts(0)},
	"scope": {"minute": _counts(0), "hour": _counts(0)},
}

_with_usage(operation, usage) := object.union(_in(operation, _ctx({}), _active), {"usage": usage})

_tiny := {"principal": {"minute": {"captures": 3, "bytes_stored": 100}}}

_quota_reason(metric) := _r("QUOTA_EXCEEDED", sprintf("The principal quota of %s per minute is used up.", [metric]))

test_under_quota_allowed if {
	authz.decision == _allowed(false) with input as _with_usage("engram_memory_capture", _usage(_counts(2), 0))
		with data.engram.config.tenants.acme.quotas as _tiny
}

test_quota_used_up_is_rate_limited_with_retry_after if {
	authz.decision == object.union(_denied([_quota_reason("captures")], false), {"retry_after_ms": 41000}) with input as _with_usage("engram_memory_capture", _usage(_counts(3), 41000))
		with data.engram.config.tenants.acme.quotas as _tiny
	authz.decision.retry_after_ms == 1 with input as _with_usage("engram_memory_capture", _usage(_counts(3), 0))
		with data.engram.config.tenants.acme.quotas as _tiny
}

test_quota_counts_only_the_operations_metric if {
	# searches are not limited by _tiny; bytes are, for captures only.
	authz.decision == _allowed(false) with input as _with_usage("engram_memory_search", _usage(_counts(1000), 5))
		with data.engram.config.tenants.acme.quotas as _tiny
	authz.decision.reasons == [_quota_reason("bytes_stored")] with input as _with_usage("engram_memory_capture", _usage(object.union(_counts(0), {"bytes_stored": 100}), 5))
		with data.engram.config.tenants.acme.quotas as _tiny
}

test_quota_with_another_denial_is_not_retriable if {
	d := authz.decision with input as object.union(_in("engram_memory_capture", _ctx({}), {"activated": true, "tools": []}), {"usage": _usage(_counts(3), 5)})
		with data.engram.config.tenants.acme.quotas as _tiny
	d.allow == false
	not "retry_after_ms" in object.keys(d)
	d.reasons == [_quota_reason("captures"), _r("TOOL_NOT_GRANTED", "The tool is not granted in this scope.")]
}

# Issue 26.7: forget and withdraw (and the check before the human is asked, authorized as the
# same tool) count against quotas of their own.
test_forget_and_withdraw_have_quotas_of_their_own if {
	limits := {"principal": {"minute": {"forgets": 2, "withdrawals": 1}}}
	used := object.union(_counts(0), {"forgets": 2, "withdrawals": 0})
	authz.decision == object.union(_denied([_quota_reason("forgets")], true), {"retry_after_ms": 7}) with input as _with_usage("engram_memory_forget", _usage(used, 7))
		with data.engram.config.tenants.acme.quotas as limits
	authz.decision == _allowed(true) with input as _with_usage("engram_memory_withdraw", _usage(used, 7))
		with data.engram.config.tenants.acme.quotas as limits
	authz.decision == _allowed(true) with input as _with_usage("engram_memory_forget", _usage(used, 7))
}

test_default_quotas_are_generous if {
	authz.decision == _allowed(false) with input as _with_usage("engram_memory_search", _usage(_counts(100), 5))
}

# Mirrors tests/policy/fixtures/authz/search_rate_limited.json: the default quotas, used up.
test_golden_search_rate_limited if {
	used := object.union(_counts(0), {"searches": 60000, "retry_after_ms": 12345})
	usage := {
		"windows": {"minute": {"ms": 60000}, "hour": {"ms": 3600000}},
		"principal": {"minute": used, "hour": used}, "scope": {"minute": used, "hour": used},
	}
	authz.decision == object.union(_denied([_r("QUOTA_EXCEEDED", "The principal quota of searches per minute is used up.")], false), {"retry_after_ms": 12345}) with input as _with_usage("engram_memory_search", usage)
}

# --- host.record_refusal: the adapter audits refusals it decided under the call's own context ---

test_record_refusal_allowed_for_an_agent_context if {
	authz.decision == _allowed(false) with input as _in("host.record_refusal", _ctx({}), _active)
}

test_record_refusal_allowed_when_the_scope_is_not_active if {
	authz.decision == _allowed(false) with input as _in("host.record_refusal", _ctx({}), {"activated": false, "tools": []})
}

test_record_refusal_needs_a_complete_context if {
	authz.decision == _denied(
		[_r("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal.")],
		false,
	) with input as _in("host.record_refusal", _ctx({"principal": ""}), _active)
}

# Mirrors tests/policy/fixtures/authz/host_attest_untrusted_verifier_denied.json (default data: no verifiers).
test_golden_host_attest_untrusted_verifier_denied if {
	authz.decision == {"allow": false, "reasons": [{"code": "VERIFIER_NOT_TRUSTED", "message": "The verifier key is not trusted for signed attestations."}], "obligations": _no_obligations} with input as _attest(_attest_ctx, "signed", "ed25519:abc")
}

# --- host key bindings (issue 26.3): a key acts only for the tenants and scopes it is bound to ---

_bound_key(tenants, scopes) := {"id": "hk-2", "local": false, "all_tenants": false, "tenants": tenants, "maintenance_scopes": scopes}

_every_tenant_key(scopes) := {"id": "hk-3", "local": false, "all_tenants": true, "tenants": [], "maintenance_scopes": scopes}

_not_bound := _r("HOST_KEY_NOT_BOUND", "The host key that signed the context does not serve this tenant.")

_scope_not_bound(scope) := _r("HOST_KEY_SCOPE_NOT_BOUND", sprintf("The host key that signed the context is not bound to the %q maintenance scope.", [scope]))

_admin_in(operation, ctx, target) := object.union(_in(operation, ctx, {"activated": false, "tools": []}), {"target": target})

_acme := {"tenant": "acme", "workspace": "main"}

# Mirrors tests/policy/fixtures/authz/agent_key_not_bound_denied.json: another tenant's host key.
test_golden_agent_key_not_bound_denied if {
	authz.decision == _denied([_not_bound], false) with input as _in("engram_memory_search", _ctx({"host_key": _bound_key(["globex"], [])}), _active)
}

test_a_key_bound_to_the_tenant_acts_for_it if {
	ctx := _ctx({"host_key": _bound_key(["acme", "globex"], [])})
	authz.decision == _allowed(false) with input as _in("engram_memory_search", ctx, _active)
	authz.decision == _allowed(true) with input as _in("engram_memory_forget", ctx, _active)
	authz.decision == _allowed(false) with input as _in("engram_memory_search", _ctx({"host_key": _every_tenant_key([])}), _active)
}

test_another_tenants_key_lists_no_tools if {
	authz.tools == {"tools": [], "reasons": [_not_bound]} with input as {
		"context": _ctx({"host_key": _bound_key(["globex"], [])}), "scope": _active, "now_ms": 1,
	}
}

test_a_key_without_a_binding_serves_nothing if {
	keyless := object.remove(_ctx({}), ["host_key"])
	authz.decision == _denied([_not_bound], false) with input as _in("engram_memory_get", keyless, _active)
	authz.decision == _denied([_not_bound], false) with input as _in("engram_memory_get", object.union(keyless, {"host_key": {"id": "hk-9"}}), _active)
	authz.decision == _denied([_not_bound], false) with input as _in("engram_memory_get", _ctx({"host_key": _bound_key([], [])}), _active)
}

test_host_calls_follow_the_binding if {
	other := _bound_key(["globex"], [])
	authz.decision == _denied([_not_bound], false) with input as _in("host.record_refusal", _ctx({"host_key": other}), _active)
	authz.decision == _denied([_not_bound], false) with input as _in("host.issue_confirmation", object.union(_confirming_host, {"host_key": other}), _active)
	authz.decision == _denied([_not_bound], false) with input as _in("host.authorization_epoch", object.union(_host, {"host_key": other}), _active)
	authz.decision == _allowed(false) with input as _in("host.authorization_epoch", object.union(_host, {"host_key": _bound_key(["acme"], [])}), _active)
}

# Mirrors tests/policy/fixtures/authz/admin_key_scope_not_bound_denied.json.
test_golden_admin_key_scope_not_bound_denied if {
	ctx := object.union(_host, {"tenant": "_host", "workspace": "_admin", "maintenance_scopes": ["read"], "host_key": _bound_key(["acme"], [])})
	authz.decision == _denied([_scope_not_bound("read")], false) with input as _admin_in("admin.history", ctx, _acme)
}

test_admin_acts_for_the_named_tenant_only if {
	ctx := object.union(_host, {"tenant": "_host", "workspace": "_admin", "maintenance_scopes": ["read", "maintain"], "host_key": _bound_key(["acme"], ["maintain"])})
	authz.decision == _allowed(false) with input as _admin_in("admin.history", ctx, _acme)
	authz.decision == _allowed(false) with input as _admin_in("admin.revoke", ctx, _acme)
	authz.decision == _denied([_not_bound], false) with input as _admin_in("admin.history", ctx, {"tenant": "globex", "workspace": "main"})
	# No tenant named: the whole store, which only a key serving every tenant may act on.
	authz.decision == _denied([_not_bound], false) with input as _admin_in("admin.rotate_keys", ctx, {})
	authz.decision == _denied([_not_bound], false) with input as _in("admin.migrate", ctx, _active)
}

test_a_key_for_every_tenant_keeps_to_its_scopes if {
	ctx := object.union(_host, {"maintenance_scopes": ["read", "maintain"], "host_key": _every_tenant_key(["read"])})
	authz.decision == _allowed(false) with input as _admin_in("admin.verify", ctx, {})
	authz.decision == _allowed(false) with input as _admin_in("admin.history", ctx, {"tenant": "globex", "workspace": "main"})
	authz.decision == _denied([_scope_not_bound("maintain")], false) with input as _admin_in("admin.rotate_keys", ctx, {})
}

test_a_key_bound_to_maintain_holds_read_too if {
	ctx := object.union(_host, {"maintenance_scopes": ["read"], "host_key": _bound_key(["acme"], ["maintain"])})
	authz.decision == _allowed(false) with input as _admin_in("admin.history", ctx, _acme)
}

test_a_scope_the_context_does_not_claim_is_refused_as_before if {
	ctx := object.union(_host, {"maintenance_scopes": [], "host_key": _bound_key(["acme"], ["maintain"])})
	authz.decision == _denied([_r("MAINTENANCE_SCOPE_REQUIRED", "The operation requires the \"read\" maintenance scope.")], false) with input as _admin_in("admin.history", ctx, _acme)
}

test_the_local_key_serves_every_tenant_and_scope if {
	ctx := object.union(_host, {"maintenance_scopes": ["maintain"]})
	authz.decision == _allowed(false) with input as _admin_in("admin.history", ctx, {"tenant": "globex", "workspace": "main"})
	authz.decision == _allowed(false) with input as _admin_in("admin.rotate_keys", ctx, {})
}

test_host_attest_follows_the_binding if {
	named := object.union(_attest_ctx, {"host_key": _bound_key(["acme"], ["maintain"])})
	authz.decision == {"allow": true, "reasons": [], "obligations": _no_obligations} with input as _attest(named, "earned", "")
	other := object.union(_attest_ctx, {"host_key": _bound_key(["globex"], ["maintain"])})
	authz.decision == {"allow": false, "reasons": [_not_bound], "obligations": _no_obligations} with input as _attest(other, "earned", "")
	reader := object.union(_attest_ctx, {"host_key": _bound_key(["acme"], ["read"])})
	authz.decision == {"allow": false, "reasons": [_scope_not_bound("maintain")], "obligations": _no_obligations} with input as _attest(reader, "earned", "")
}
