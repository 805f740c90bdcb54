package engram.binding_test

import data.engram.binding

_iss := "https://idp.example.com/realms/acme"

_all_scopes := ["engram:forget", "engram:read", "engram:write"]

_issuers := {_iss: {
	"tenant_claim": "engram_tenant",
	"tenants": ["acme", "globex"],
	"workspace": "main",
	"purpose_ref": "purpose:engineering-notes",
}}

_in(overrides) := object.union(
	{
		"issuer": _iss, "subject": "ada", "client_id": "vscode", "scopes": _all_scopes,
		"audience": "https://memory.example.com/mcp",
		"claims": {"iss": _iss, "sub": "ada", "engram_tenant": "acme", "groups": ["eng"]},
		"now_ms": 1700000000000,
	},
	overrides,
)

# object.union merges nested objects: _claims_only replaces the claims instead.
_claims_only(overrides, claims) := object.union(object.remove(_in(overrides), ["claims"]), {"claims": claims})

_r(code, message) := {"code": code, "message": message}

_acme_ada := {
	"tenant": "acme", "workspace": "main", "principal": "user:ada", "agent_id": "vscode",
	"purpose_ref": "purpose:engineering-notes",
}

_every_tool := [
	"engram_memory_capture", "engram_memory_forget", "engram_memory_get",
	"engram_memory_request_admission", "engram_memory_search", "engram_memory_withdraw",
]

_unbound(reasons) := {"allow": false, "tools": [], "step_up": {}, "reasons": reasons}

test_a_known_issuer_binds_the_subject_in_the_tenant_its_claim_names if {
	binding.decision == {"allow": true, "binding": _acme_ada, "tools": _every_tool, "step_up": {}, "reasons": []} with input as _in({})
		with data.engram.config.binding.issuers as _issuers
}

test_each_user_lands_in_the_tenant_of_their_own_claim if {
	d := binding.decision with input as _in({"subject": "bob", "claims": {"engram_tenant": "globex"}})
		with data.engram.config.binding.issuers as _issuers
	d.binding == {
		"tenant": "globex", "workspace": "main", "principal": "user:bob", "agent_id": "vscode",
		"purpose_ref": "purpose:engineering-notes",
	}
}

test_read_and_write_scopes_leave_forget_to_a_step_up if {
	binding.decision == {
		"allow": true, "binding": _acme_ada,
		"tools": ["engram_memory_capture", "engram_memory_get", "engram_memory_request_admission", "engram_memory_search"],
		"step_up": {"engram_memory_forget": "engram:forget", "engram_memory_withdraw": "engram:forget"},
		"reasons": [],
	} with input as _in({"scopes": ["engram:read", "engram:write", "openid"]})
		with data.engram.config.binding.issuers as _issuers
}

test_no_engram_scope_is_bound_with_no_tools if {
	d := binding.decision with input as _in({"scopes": []}) with data.engram.config.binding.issuers as _issuers
	d.allow == true
	d.tools == []
	count(d.step_up) == 6
}

test_golden_default_bundle_binds_nobody if {
	binding.decision == _unbound([_r("UNKNOWN_ISSUER", "No binding is configured for the token's issuer.")]) with input as _in({})
}

test_another_issuer_is_unbound if {
	binding.decision == _unbound([_r("UNKNOWN_ISSUER", "No binding is configured for the token's issuer.")]) with input as _in({"issuer": "https://evil.example.com"})
		with data.engram.config.binding.issuers as _issuers
}

test_a_tenant_claim_outside_the_allowed_tenants_is_unbound if {
	binding.decision == _unbound([_r("TENANT_UNRESOLVED", "The token maps to no allowed tenant.")]) with input as _in({"claims": {"engram_tenant": "initech"}})
		with data.engram.config.binding.issuers as _issuers
}

test_a_missing_tenant_claim_is_unbound if {
	binding.decision == _unbound([_r("TENANT_UNRESOLVED", "The token maps to no allowed tenant.")]) with input as _claims_only({}, {})
		with data.engram.config.binding.issuers as _issuers
}

test_no_subject_and_no_client_are_unbound if {
	binding.decision == _unbound([
		_r("NO_CLIENT", "The token names no client."),
		_r("NO_SUBJECT", "The token names no subject."),
		_r("TENANT_UNRESOLVED", "The token maps to no allowed tenant."),
	]) with input as _claims_only({"subject": "", "client_id": ""}, {})
		with data.engram.config.binding.issuers as _issuers
}

test_a_fixed_tenant_and_a_workspace_claim if {
	issuers := {_iss: {"tenant": "acme", "tenant_claim": "engram_tenant", "tenants": ["globex"], "workspace_claim": "team", "workspaces": ["red", "blue"], "principal_prefix": "okta:"}}
	binding.decision == {
		"allow": true,
		"binding": {"tenant": "acme", "workspace": "red", "principal": "okta:ada", "agent_id": "vscode", "purpose_ref": "purpose:default"},
		"tools": _every_tool, "step_up": {}, "reasons": [],
	} with input as _in({"claims": {"engram_tenant": "globex", "team": "red"}})
		with data.engram.config.binding.issuers as issuers
}

test_a_workspace_claim_outside_the_list_is_unbound if {
	issuers := {_iss: {"tenant": "acme", "workspace_claim": "team", "workspaces": ["red"]}}
	binding.decision == _unbound([_r("WORKSPACE_UNRESOLVED", "The token maps to no allowed workspace.")]) with input as _in({"claims": {"team": "green"}})
		with data.engram.config.binding.issuers as issuers
}

test_an_unlisted_workspace_claim_is_taken_as_it_is if {
	issuers := {_iss: {"tenant": "acme", "workspace_claim": "team"}}
	d := binding.decision with input as _in({"claims": {"team": "green"}}) with data.engram.config.binding.issuers as issuers
	d.binding.workspace == "green"
}

test_required_groups_and_allowed_clients if {
	issuers := {_iss: {"tenant": "acme", "workspace": "main", "required_groups": ["engram-users"], "clients": ["claude"]}}
	binding.decision == _unbound([
		_r("CLIENT_NOT_ALLOWED", "The token's client is not allowed for this issuer."),
		_r("GROUP_REQUIRED", "The subject is in none of the groups this issuer requires."),
	]) with input as _in({}) with data.engram.config.binding.issuers as issuers
	d := binding.decision with input as _in({"client_id": "claude", "claims": {"groups": ["eng", "engram-users"]}})
		with data.engram.config.binding.issuers as issuers
	d.allow == true
	d.binding.agent_id == "claude"
}

test_a_custom_groups_claim if {
	issuers := {_iss: {"tenant": "acme", "workspace": "main", "required_groups": ["memory"], "groups_claim": "roles"}}
	d := binding.decision with input as _in({"claims": {"roles": ["memory"]}}) with data.engram.config.binding.issuers as issuers
	d.allow == true
}

test_an_empty_input_is_a_well_formed_denial if {
	binding.decision == _unbound([_r("INVALID_INPUT", "The binding input lacks the token's issuer, scopes or claims.")]) with input as {}
}

test_golden_scopes_listed if {
	binding.scopes == {"scopes": _all_scopes, "reasons": []}
}
