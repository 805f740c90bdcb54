# The console (engram console, docs/console.md): who may do what on which tenant+workspace.
#
# Input (asked by the console's process, never by the core):
#   {"subject": "local:owner" | the ID token's sub, "issuer": "local" | the OpenID issuer,
#    "claims": the verified ID token's claims ({} for the local token),
#    "tenant": ..., "workspace": ...}
# Output: decision := {"roles": [...], "actions": [...], "memory_purpose": "...", "reasons": [...]}
#   roles come from data.engram.config.console: the local token's owner gets local_owner_roles on
#   every scope the console serves; a person signed in through an issuer gets the roles that
#   issuer's entry grants their subject or one of their groups on this tenant (and workspace).
#   actions are the union of role_actions over those roles: the console checks an action, never
#   a role name, so what a role may do is decided here too. No grant: no roles, no actions
#   (the console then shows nothing of the scope). memory_purpose is the purpose the Memory page
#   reads under (the core's redaction policy decides per purpose what it shows): the first entry of
#   memory_purposes whose role the person holds; "" (and no memory.view) when none applies.
package engram.console

import data.engram.lib

_config := data.engram.config.console

decision := {
	"roles": sort(roles),
	"actions": sort(actions),
	"memory_purpose": memory_purpose,
	"reasons": sort(reasons),
}

# METADATA
# title: Console roles
# description: The roles the person holds on input.tenant/input.workspace.
roles contains r if {
	_scope_named
	_local_owner
	some r in _config.local_owner_roles
	_known_role(r)
}

roles contains r if {
	_scope_named
	some g in _grants
	_grant_matches(g)
	some r in g.roles
	_known_role(r)
}

# METADATA
# title: Console actions
# description: >-
#   What those roles may do (review.view, review.decide, audit.view, keys.view, policy.view,
#   confirm.view and confirm.decide: see and answer the confirmations agents' withdraw and forget
#   wait for, issue 61; memory.view: only with a purpose to read under).
actions contains a if {
	some r in roles
	some a in _config.role_actions[r]
	a != "memory.view"
}

# policy.replay (run a candidate bundle against the decision log on the Policy page) goes with the
# roles of replay_roles, by default the policy author's: data can name others, or none.
actions contains "policy.replay" if {
	some r in roles
	r in object.get(_config, "replay_roles", ["policy_author"])
}

actions contains "memory.view" if {
	some r in roles
	"memory.view" in _config.role_actions[r]
	memory_purpose != ""
}

# METADATA
# title: Memory purpose
# description: The purpose the Memory page reads under, from the first memory_purposes entry whose role is held.
default memory_purpose := ""

memory_purpose := _purposes[0] if count(_purposes) > 0

_purposes := [e.purpose_ref |
	some e in object.get(_config, "memory_purposes", [])
	e.role in roles
	is_string(e.purpose_ref)
	startswith(e.purpose_ref, "purpose:")
]

reasons contains lib.reason("NO_CONSOLE_ROLE", "No console role is granted to this person on this tenant and workspace.") if {
	count(roles) == 0
}

_scope_named if {
	lib.context_complete({"tenant": input.tenant, "workspace": input.workspace, "principal": input.subject})
}

_local_owner if {
	input.issuer == "local"
	input.subject == "local:owner"
}

_known_role(r) if {
	_ = _config.role_actions[r]
}

_issuer := _config.issuers[input.issuer] if input.issuer != "local"

_grants contains g if {
	some g in _issuer.subjects[input.subject]
}

_grants contains g if {
	groups := input.claims[_issuer.groups_claim]
	is_array(groups)
	some group in groups
	is_string(group)
	some g in _issuer.groups[group]
}

# A grant names its tenant exactly (no tenant wildcard: a person is never given every tenant by
# accident) and either "*" or the workspaces it covers.
_grant_matches(g) if {
	g.tenant == input.tenant
	"*" in g.workspaces
}

_grant_matches(g) if {
	g.tenant == input.tenant
	input.workspace in g.workspaces
}
