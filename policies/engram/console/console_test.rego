package engram.console_test

import data.engram.console

_iss := "https://idp.example.com"

_all := ["audit.view", "keys.view", "memory.view", "policy.replay", "policy.view", "review.decide", "review.view"]

_config := {
	"role_actions": {
		"reviewer": ["review.view", "review.decide", "memory.view"],
		"operator": ["audit.view", "keys.view"],
		"auditor": ["audit.view", "memory.view"],
		"policy_author": ["policy.view"],
	},
	"local_owner_roles": ["auditor", "operator", "policy_author", "reviewer"],
	"memory_purposes": [
		{"role": "reviewer", "purpose_ref": "purpose:console-review"},
		{"role": "auditor", "purpose_ref": "purpose:console-audit"},
	],
	"issuers": {_iss: {
		"groups_claim": "groups",
		"subjects": {"ada": [{"tenant": "acme", "workspaces": ["main"], "roles": ["reviewer"]}]},
		"groups": {"sre": [{"tenant": "acme", "workspaces": ["*"], "roles": ["operator", "auditor"]}]},
	}},
}

_in(o) := object.union({"subject": "ada", "issuer": _iss, "claims": {"sub": "ada"}, "tenant": "acme", "workspace": "main"}, o)

test_local_owner_holds_every_role if {
	d := console.decision with input as _in({"subject": "local:owner", "issuer": "local", "claims": {}})
		with data.engram.config.console as _config
	d.roles == ["auditor", "operator", "policy_author", "reviewer"]
	d.actions == _all
	d.reasons == []
}

test_local_subject_from_an_issuer_is_not_the_owner if {
	d := console.decision with input as _in({"subject": "local:owner"}) with data.engram.config.console as _config
	d.roles == []
	d.reasons[0].code == "NO_CONSOLE_ROLE"
}

test_subject_grant_on_its_workspace_only if {
	d := console.decision with input as _in({}) with data.engram.config.console as _config
	d.roles == ["reviewer"]
	d.actions == ["memory.view", "review.decide", "review.view"]
	d.memory_purpose == "purpose:console-review"
	other := console.decision with input as _in({"workspace": "ops"}) with data.engram.config.console as _config
	other.roles == []
}

test_group_grant_every_workspace_of_its_tenant_only if {
	d := console.decision with input as _in({"subject": "bo", "claims": {"groups": ["sre"]}, "workspace": "ops"})
		with data.engram.config.console as _config
	d.roles == ["auditor", "operator"]
	d.actions == ["audit.view", "keys.view", "memory.view"]
	g := console.decision with input as _in({"subject": "bo", "claims": {"groups": ["sre"]}, "tenant": "globex"})
		with data.engram.config.console as _config
	g.roles == []
}

test_no_rule_no_access if {
	d := console.decision with input as _in({"subject": "eve", "claims": {"groups": "sre"}})
		with data.engram.config.console as _config
	d.roles == []
	d.actions == []
	u := console.decision with input as _in({"issuer": "https://other.example"}) with data.engram.config.console as _config
	u.roles == []
}

test_unknown_role_grants_nothing if {
	cfg := json.patch(_config, [{"op": "add", "path": "/issuers/https:~1~1idp.example.com/subjects/ada/0/roles", "value": ["root"]}])
	d := console.decision with input as _in({}) with data.engram.config.console as cfg
	d.roles == []
}

test_empty_scope_grants_nothing if {
	d := console.decision with input as _in({"subject": "local:owner", "issuer": "local", "tenant": ""})
		with data.engram.config.console as _config
	d.roles == []
}

test_bundled_default_gives_oidc_users_nothing if {
	d := console.decision with input as _in({})
	d.roles == []
	o := console.decision with input as _in({"subject": "local:owner", "issuer": "local", "claims": {}})
	count(o.roles) == 5
}

test_first_memory_purpose_of_a_held_role_wins if {
	d := console.decision with input as _in({"subject": "local:owner", "issuer": "local", "claims": {}})
		with data.engram.config.console as _config
	d.memory_purpose == "purpose:console-review"
	a := console.decision with input as _in({"subject": "bo", "claims": {"groups": ["sre"]}})
		with data.engram.config.console as _config
	a.memory_purpose == "purpose:console-audit"
	"memory.view" in a.actions
}

test_no_purpose_no_memory_page if {
	cfg := object.remove(_config, ["memory_purposes"])
	d := console.decision with input as _in({}) with data.engram.config.console as cfg
	d.memory_purpose == ""
	not "memory.view" in d.actions
	"review.view" in d.actions
	bad := json.patch(_config, [{"op": "replace", "path": "/memory_purposes/0/purpose_ref", "value": "console"}])
	b := console.decision with input as _in({}) with data.engram.config.console as bad
	b.memory_purpose == ""
}

test_policy_replay_goes_with_the_policy_author_unless_data_says_otherwise if {
	owner := _in({"subject": "local:owner", "issuer": "local", "claims": {}})
	d := console.decision with input as owner with data.engram.config.console as _config
	"policy.replay" in d.actions
	none := console.decision with input as owner
		with data.engram.config.console as object.union(_config, {"replay_roles": []})
	not "policy.replay" in none.actions
	"policy.view" in none.actions
	auditors := console.decision with input as _in({"subject": "bo", "claims": {"groups": ["sre"]}})
		with data.engram.config.console as object.union(_config, {"replay_roles": ["auditor"]})
	"policy.replay" in auditors.actions
	reviewer := console.decision with input as _in({}) with data.engram.config.console as _config
	not "policy.replay" in reviewer.actions
}
