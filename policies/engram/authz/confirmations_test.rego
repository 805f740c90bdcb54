# Issue 61: confirmations in the console's browser page (authz.rego, "confirmations in the
# console's browser page"): the adapter parks and claims under the agent's context; only a host
# principal holding the maintenance scope, with a key bound to it, lists (read) and decides (maintain).
package engram.authz_confirmations_test

import data.engram.authz

_local_key := {"id": "hk-1", "local": true, "all_tenants": false, "tenants": [], "maintenance_scopes": []}

_agent := {
	"tenant": "acme", "workspace": "main", "principal": "user:ada", "agent_id": "agent-1",
	"session": "sess-1", "purpose_ref": "purpose:notes", "host_key_id": "hk-1",
	"memory_enabled": true, "host_principal": false, "maintenance_scopes": [],
	"authorization_epoch": 1, "host_key": _local_key,
}

_console(scopes, key) := object.union(_agent, {
	"principal": "local:owner", "agent_id": "engram-console", "memory_enabled": false,
	"host_principal": true, "maintenance_scopes": scopes, "host_key": key,
})

_active := {"activated": true, "tools": ["engram_memory_forget"]}

_in(operation, ctx, scope) := {"operation": operation, "context": ctx, "scope": scope, "now_ms": 1700000000000}

_allowed := {"allow": true, "reasons": [], "obligations": {"confirmation_required": false}}

_denied(reasons) := {"allow": false, "reasons": reasons, "obligations": {"confirmation_required": false}}

_r(code, message) := {"code": code, "message": message}

test_agent_context_parks_and_claims if {
	authz.decision == _allowed with input as _in("host.park_confirmation", _agent, _active)
	authz.decision == _allowed with input as _in("host.claim_confirmation", _agent, _active)
}

test_park_needs_memory_enabled_and_an_active_scope if {
	authz.decision == _denied([
		_r("MEMORY_DISABLED", "Memory is not enabled for this host."),
		_r("SCOPE_NOT_ACTIVATED", "Memory is not activated for this tenant and workspace."),
	]) with input as _in("host.park_confirmation", object.union(_agent, {"memory_enabled": false}), {"activated": false, "tools": []})
}

test_park_needs_a_key_serving_the_tenant if {
	other := {"id": "hk-2", "local": false, "all_tenants": false, "tenants": ["globex"], "maintenance_scopes": []}
	authz.decision == _denied([_r("HOST_KEY_NOT_BOUND", "The host key that signed the context does not serve this tenant.")]) with input as _in("host.park_confirmation", object.union(_agent, {"host_key": other}), _active)
}

# An agent context can never approve its own forget, whatever scopes it claims to hold.
test_agent_context_cannot_decide_or_list if {
	authz.decision == _denied([_r("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only.")]) with input as _in("host.decide_confirmation", object.union(_agent, {"maintenance_scopes": ["maintain"]}), _active)
	authz.decision == _denied([
		_r("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only."),
		_r("MAINTENANCE_SCOPE_REQUIRED", "The operation requires the \"read\" maintenance scope."),
	]) with input as _in("host.list_confirmations", _agent, _active)
}

test_console_lists_with_read_and_decides_with_maintain if {
	authz.decision == _allowed with input as _in("host.list_confirmations", _console(["read"], _local_key), _active)
	authz.decision == _allowed with input as _in("host.decide_confirmation", _console(["maintain"], _local_key), _active)
	authz.decision == _denied([_r("MAINTENANCE_SCOPE_REQUIRED", "The operation requires the \"maintain\" maintenance scope.")]) with input as _in("host.decide_confirmation", _console(["read"], _local_key), _active)
}

test_console_key_must_hold_the_scope_and_serve_the_tenant if {
	read_only := {"id": "hk-3", "local": false, "all_tenants": false, "tenants": ["acme"], "maintenance_scopes": ["read"]}
	authz.decision == _denied([_r("HOST_KEY_SCOPE_NOT_BOUND", "The host key that signed the context is not bound to the \"maintain\" maintenance scope.")]) with input as _in("host.decide_confirmation", _console(["maintain"], read_only), _active)
	globex := {"id": "hk-4", "local": false, "all_tenants": false, "tenants": ["globex"], "maintenance_scopes": ["maintain"]}
	authz.decision == _denied([_r("HOST_KEY_NOT_BOUND", "The host key that signed the context does not serve this tenant.")]) with input as _in("host.decide_confirmation", _console(["maintain"], globex), _active)
}
