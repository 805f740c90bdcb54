# Who the caller of an OAuth-protected adapter is (issue 29): the verified claims of an
# access token mapped to a binding (tenant, workspace, principal, agent, purpose) and to the
# agent tools the token's scopes open. No matching issuer entry means no binding: memory is
# off for that caller (no tools), never a default scope.
#
# Input (adapters/mcp/oauth/caller_binding.py): {issuer, subject, client_id, scopes, audience,
# claims, now_ms}; every value comes from a token whose signature, issuer, audience and
# lifetime the adapter verified. Configuration: data.engram.config.binding.
package engram.binding

import data.engram.lib

_config := data.engram.config.binding

_issuer := _config.issuers[input.issuer]

# METADATA
# title: Binding decision
# description: >-
#   The binding of the caller (allow true): tenant, workspace, principal (the issuer
#   entry's principal_prefix, default "user:", then the token's subject), agent_id (the
#   token's client), purpose_ref; the tools whose scope (data.engram.config.binding.tool_scopes)
#   the token holds; and step_up, the scope each other tool needs (the adapter answers a call
#   to one with 403 insufficient_scope naming it). With any deny reason: allow false, no
#   binding, no tools.
decision := {
	"allow": true,
	"binding": _binding,
	"tools": _tools,
	"step_up": _step_up,
	"reasons": [],
} if {
	count(deny) == 0
}

decision := {
	"allow": false,
	"tools": [],
	"step_up": {},
	"reasons": sort([r | some r in deny]),
} if {
	count(deny) > 0
}

# METADATA
# title: Scopes
# description: >-
#   Every scope the tools map to: what the adapter's protected resource metadata publishes
#   as scopes_supported (so a client asks for them) unless the host config names others.
scopes := {"scopes": sort({s | some s in _config.tool_scopes}), "reasons": []}

_binding := {
	"tenant": _tenant,
	"workspace": _workspace,
	"principal": _principal,
	"agent_id": input.client_id,
	"purpose_ref": object.get(_issuer, "purpose_ref", "purpose:default"),
}

_tools := sort([t | some t, s in _config.tool_scopes; _has_scope(s)])

_step_up := {t: s | some t, s in _config.tool_scopes; not _has_scope(s)}

_has_scope(s) if {
	some held in input.scopes
	held == s
}

# --- the binding's parts; each is undefined when it cannot be resolved (a deny says why) ---

_tenant := t if {
	t := _issuer.tenant
	_text(t)
}

_tenant := t if {
	not _fixed("tenant")
	t := input.claims[_issuer.tenant_claim]
	_text(t)
	t in _issuer.tenants
}

_workspace := w if {
	w := _issuer.workspace
	_text(w)
}

_workspace := w if {
	not _fixed("workspace")
	w := input.claims[_issuer.workspace_claim]
	_text(w)
	_workspace_listed(w)
}

_workspace_listed(_) if not _issuer.workspaces

_workspace_listed(w) if w in _issuer.workspaces

_principal := concat("", [object.get(_issuer, "principal_prefix", "user:"), input.subject]) if _text(input.subject)

_fixed(key) if _text(_issuer[key])

_text(s) if {
	is_string(s)
	s != ""
}

_groups := object.get(input.claims, object.get(_issuer, "groups_claim", "groups"), [])

_in_required_group if {
	some g in _issuer.required_groups
	g in _groups
}

_client_allowed if input.client_id in _issuer.clients

_well_formed if {
	is_array(input.scopes)
	is_object(input.claims)
	is_string(input.issuer)
}

# METADATA
# title: Deny reasons
# description: Why the caller gets no binding; empty when it is bound.
deny contains lib.reason("INVALID_INPUT", "The binding input lacks the token's issuer, scopes or claims.") if {
	not _well_formed
}

deny contains lib.reason("UNKNOWN_ISSUER", "No binding is configured for the token's issuer.") if {
	_well_formed
	not _issuer
}

deny contains lib.reason("NO_SUBJECT", "The token names no subject.") if {
	_issuer
	not _text(input.subject)
}

deny contains lib.reason("NO_CLIENT", "The token names no client.") if {
	_issuer
	not _text(input.client_id)
}

deny contains lib.reason("CLIENT_NOT_ALLOWED", "The token's client is not allowed for this issuer.") if {
	_issuer.clients
	not _client_allowed
}

deny contains lib.reason("GROUP_REQUIRED", "The subject is in none of the groups this issuer requires.") if {
	_issuer.required_groups
	not _in_required_group
}

deny contains lib.reason("TENANT_UNRESOLVED", "The token maps to no allowed tenant.") if {
	_issuer
	not _tenant
}

deny contains lib.reason("WORKSPACE_UNRESOLVED", "The token maps to no allowed workspace.") if {
	_issuer
	not _workspace
}
