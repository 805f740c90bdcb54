# Issue 61: who may answer a confirmation in the console, on the bundle's own data (data.json):
# the "confirmer" role (confirm.view, confirm.decide), which the local token's owner holds and an
# issuer's entry must grant by name: no other role implies it.
package engram.console_confirmer_test

import data.engram.console

_iss := "https://idp.example.com"

_issuers := {_iss: {
	"groups_claim": "groups",
	"subjects": {
		"ada": [{"tenant": "acme", "workspaces": ["main"], "roles": ["confirmer"]}],
		"bob": [{"tenant": "acme", "workspaces": ["*"], "roles": ["reviewer", "auditor", "operator"]}],
	},
	"groups": {},
}}

_in(o) := object.union({"subject": "ada", "issuer": _iss, "claims": {"sub": "ada"}, "tenant": "acme", "workspace": "main"}, o)

test_local_owner_may_confirm if {
	d := console.decision with input as _in({"subject": "local:owner", "issuer": "local", "claims": {}})
	"confirmer" in d.roles
	"confirm.view" in d.actions
	"confirm.decide" in d.actions
}

test_confirmer_role_gives_exactly_the_confirm_actions if {
	d := console.decision with input as _in({}) with data.engram.config.console.issuers as _issuers
	d.roles == ["confirmer"]
	d.actions == ["confirm.decide", "confirm.view"]
}

test_other_roles_do_not_confirm if {
	d := console.decision with input as _in({"subject": "bob", "claims": {"sub": "bob"}}) with data.engram.config.console.issuers as _issuers
	not "confirm.decide" in d.actions
	not "confirm.view" in d.actions
}

test_confirmer_of_another_tenant_gets_nothing_here if {
	d := console.decision with input as _in({"tenant": "globex"}) with data.engram.config.console.issuers as _issuers
	d.actions == []
}
