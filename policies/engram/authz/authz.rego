# Authorization per operation and the agent tool list (SPEC §2, §8, §9, §12).
# Agent tools need memory enabled, an activated scope and a grant; maintenance
# operations need a host principal holding the operation's maintenance scope.
package engram.authz

import data.engram.lib

_config := data.engram.config

# METADATA
# title: Authorization decision
# description: >-
#   Whether input.operation may run for the bound context, with the reasons
#   and obligations. Agent tools are allowed only when memory is enabled, the
#   scope is activated and the tool is granted; admin.<op> only for a host
#   principal holding the maintenance scope data.engram.config.maintenance_scopes
#   names; host.issue_confirmation (a confirmation grant for a human approval
#   the host obtained) and host.authorization_epoch (the scope's revocation
#   epoch) only for a host principal, never for an agent context. Any secret
#   scanner finding in input.findings (the request's stored strings) denies.
#   A denial by quotas alone carries retry_after_ms (RATE_LIMITED).
#   host.record_refusal (the audit row of a refusal the host decided for the
#   call this context was signed for) for any complete context. Every
#   operation also needs the key that signed the context to serve the tenant
#   it acts for (input.context.host_key), and maintenance the scope it needs.
#   Confirmations in the console's browser page (issue 61):
#   host.park_confirmation and host.claim_confirmation under the agent call's
#   context, as the agent tools are gated; host.list_confirmations ("read")
#   and host.decide_confirmation ("maintain") only for a host principal (the
#   console, naming the person) holding that maintenance scope with a key bound
#   to it, never for an agent context.
decision := object.union(
	{
		"allow": allow,
		"reasons": sort([r | some r in deny]),
		"obligations": {"confirmation_required": _confirmation_required},
	},
	_rate_limit,
)

# METADATA
# title: Allow
# description: True only when no deny reason applies.
default allow := false

allow if count(deny) == 0

# METADATA
# title: Tool list
# description: >-
#   The agent tools the bound context may see (tools/list): the granted tools of
#   an activated scope with memory enabled, otherwise none.
tools := {
	"tools": _listed_tools,
	"reasons": sort([r | some r in _agent_gate]),
}

_listed_tools := sort([t | some t in _granted_tools]) if count(_agent_gate) == 0

_listed_tools := [] if count(_agent_gate) > 0

_granted_tools contains t if {
	some t in input.scope.tools
	t in _config.agent_tools
}

# --- classification of the operation ---

_is_agent_tool if input.operation in _config.agent_tools

_is_host_confirmation if input.operation == "host.issue_confirmation"

_is_host_epoch if input.operation == "host.authorization_epoch"

_is_host_call if _is_host_confirmation

_is_host_call if _is_host_epoch

# The MCP adapter records its own refusals (schema, confirmation) under the agent
# context it signed for that call: the row names that call's principal and audit id.
_is_host_refusal if input.operation == "host.record_refusal"

_admin_name := trim_prefix(input.operation, "admin.") if startswith(input.operation, "admin.")

_required_scope := _config.maintenance_scopes[_admin_name]

_is_admin if _required_scope

_known if _is_agent_tool

_known if _is_host_call

_known if _is_admin

_known if _is_host_refusal

# --- reasons; each rule both enforces and explains ---

# Gates shared by every agent tool and by the tool list.
_agent_gate contains lib.reason("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal.") if {
	not _context_complete
}

_agent_gate contains _key_not_bound if not _key_serves_context_tenant

_agent_gate contains lib.reason("MEMORY_DISABLED", "Memory is not enabled for this host.") if {
	not input.context.memory_enabled == true
}

_agent_gate contains lib.reason("SCOPE_NOT_ACTIVATED", "Memory is not activated for this tenant and workspace.") if {
	not input.scope.activated == true
}

# METADATA
# title: Deny reasons
# description: Every reason the operation is refused; empty means allowed.
deny contains lib.reason("UNKNOWN_OPERATION", "The operation is not known to the policy.") if {
	not _known
}

deny contains r if {
	_is_agent_tool
	some r in _agent_gate
}

deny contains lib.reason("TOOL_NOT_GRANTED", "The tool is not granted in this scope.") if {
	_is_agent_tool
	not _granted
}

deny contains lib.reason("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal.") if {
	not _is_agent_tool
	_known
	not _context_complete
}

deny contains lib.reason("MEMORY_DISABLED", "Memory is not enabled for this host.") if {
	_is_host_confirmation
	not input.context.memory_enabled == true
}

# SPEC §8: only the host obtains a confirmation; an agent's only path to one is
# the human answering the host (MCP elicitation). An agent context that could
# ask for a grant would approve its own forget.
deny contains lib.reason("HOST_PRINCIPAL_REQUIRED", "Host operations are for host principals only.") if {
	_is_host_call
	not input.context.host_principal == true
}

deny contains lib.reason("HOST_PRINCIPAL_REQUIRED", "Maintenance operations are for host principals only.") if {
	_is_admin
	not input.context.host_principal == true
}

deny contains lib.reason("MAINTENANCE_SCOPE_REQUIRED", sprintf("The operation requires the %q maintenance scope.", [_required_scope])) if {
	_is_admin
	not _holds_required_scope
}

# Issue 26.3: a trusted host key acts only for the tenants it is bound to (agent tools and the
# tool list above; every other operation here, by the tenant it acts for).
deny contains _key_not_bound if {
	not _is_agent_tool
	_known
	not _key_serves_acting_tenant
}

deny contains lib.reason("HOST_KEY_SCOPE_NOT_BOUND", sprintf("The host key that signed the context is not bound to the %q maintenance scope.", [_required_scope])) if {
	_is_admin
	_holds_required_scope
	not _key_holds_required_scope
}

# SPEC §13: the request's free strings that the operation would store (idempotency keys,
# reason refs, event ids, scope names) went through the secret scanner; any finding
# refuses the request, whatever the operation and whoever asks.
deny contains lib.reason("SECRET_FINDINGS", sprintf("The secret scanner reported %s in the request.", [finding.kind])) if {
	some finding in object.get(input, "findings", [])
}

# A held scope may imply others (maintain implies read), per data.engram.config.scope_implies.
_held_scopes contains implied if {
	some held in input.context.maintenance_scopes
	some implied in _config.scope_implies[held]
}

# Negations go through helper rules: OPA lifts a call's arguments out of `not`,
# so `not f(input.missing)` would be undefined instead of true (fail open).
_context_complete if lib.context_complete(input.context)

_granted if input.operation in _granted_tools

_holds_required_scope if _required_scope in _held_scopes

# --- host key bindings (issue 26.3) ---
# input.context.host_key: {id, local, all_tenants, tenants, maintenance_scopes}, the binding of the
# key that signed the context. local: the data directory's host.key or a key named at
# `engram serve --trust-host-key` (the operator's own), which serves every tenant and scope.
# Maintenance and attestation act on the scope their request names (input.target,
# input.attestation), not on the context's own (the admin CLI signs _host/_admin); a request
# naming no tenant acts on the whole store and needs a key serving every tenant.

_key_not_bound := lib.reason("HOST_KEY_NOT_BOUND", "The host key that signed the context does not serve this tenant.")

_host_key := object.get(input.context, "host_key", {})

_key_serves_every_tenant if _host_key.local == true

_key_serves_every_tenant if _host_key.all_tenants == true

_key_serves(_) if _key_serves_every_tenant

_key_serves(tenant) if {
	is_string(tenant)
	tenant != ""
	tenant in _host_key.tenants
}

_key_serves_context_tenant if _key_serves(input.context.tenant)

_acts_on_named_scope if _is_admin

_acts_on_named_scope if _is_host_attest

_named_tenant := object.get(object.get(input, "target", {}), "tenant", "") if _is_admin

_named_tenant := object.get(object.get(input, "attestation", {}), "tenant", "") if _is_host_attest

_key_serves_acting_tenant if {
	not _acts_on_named_scope
	_key_serves_context_tenant
}

_key_serves_acting_tenant if {
	_acts_on_named_scope
	_named_tenant != ""
	_key_serves(_named_tenant)
}

_key_serves_acting_tenant if {
	_acts_on_named_scope
	_named_tenant == ""
	_key_serves_every_tenant
}

_key_scopes contains scope if {
	_host_key.local == true
	some scope, _ in _config.scope_implies
}

_key_scopes contains implied if {
	some bound in _host_key.maintenance_scopes
	some implied in _config.scope_implies[bound]
}

_key_holds_required_scope if _required_scope in _key_scopes

# --- obligations (SPEC §8) ---

_confirmation_required if input.operation in _config.always_confirm_tools

_confirmation_required if {
	_is_agent_tool
	input.operation in lib.tenant_setting(input.context.tenant, "confirmation_required_tools")
}

default _confirmation_required := false

# --- confirmations in the console's browser page (issue 61) ---
# The MCP adapter parks the exact withdraw or forget an agent asked for, and claims the person's
# decision, under that agent call's own context: the same gates as an agent tool (complete context,
# key serving its tenant, memory enabled, activated scope). Listing and deciding are the console's,
# for a person its own policy (engram/console, confirm.view and confirm.decide) lets confirm: a host
# principal holding "read" (list) or "maintain" (decide), with a key bound to that scope. An agent
# context can park and claim, never decide: its only path to an approval is a person.

_is_pending_request if input.operation in {"host.park_confirmation", "host.claim_confirmation"}

_pending_review_scope := "read" if input.operation == "host.list_confirmations"

_pending_review_scope := "maintain" if input.operation == "host.decide_confirmation"

_is_pending_review if _pending_review_scope

_known if _is_pending_request

_is_host_call if _is_pending_review

deny contains r if {
	_is_pending_request
	some r in _agent_gate
}

deny contains lib.reason("MAINTENANCE_SCOPE_REQUIRED", sprintf("The operation requires the %q maintenance scope.", [_pending_review_scope])) if {
	_is_pending_review
	not _pending_review_scope in _held_scopes
}

deny contains lib.reason("HOST_KEY_SCOPE_NOT_BOUND", sprintf("The host key that signed the context is not bound to the %q maintenance scope.", [_pending_review_scope])) if {
	_is_pending_review
	_pending_review_scope in _held_scopes
	not _pending_review_scope in _key_scopes
}

# --- host.attest: a host verifier raises a trust class (SPEC §5 Trust; issue 18) ---
# Input carries attestation: {tenant, workspace, trust_class: "signed"|"earned", verifier_key_id,
# target_kind}; the context is the host's own (as for admin.<op>).
# A host principal holding "maintain" may attest; a signed attestation must come from a
# verifier key the tenant names in verifier_key_ids (none by default: fail closed).

_is_host_attest if input.operation == "host.attest"

_is_host_call if _is_host_attest

deny contains lib.reason("MAINTENANCE_SCOPE_REQUIRED", "The operation requires the \"maintain\" maintenance scope.") if {
	_is_host_attest
	not _holds_maintain
}

deny contains lib.reason("HOST_KEY_SCOPE_NOT_BOUND", "The host key that signed the context is not bound to the \"maintain\" maintenance scope.") if {
	_is_host_attest
	_holds_maintain
	not _key_holds_maintain
}

deny contains lib.reason("VERIFIER_NOT_TRUSTED", "The verifier key is not trusted for signed attestations.") if {
	_is_host_attest
	input.attestation.trust_class == "signed"
	not _verifier_trusted
}

deny contains lib.reason("INVALID_INPUT", "The attestation names no known trust class.") if {
	_is_host_attest
	not _attested_class_known
}

_holds_maintain if "maintain" in _held_scopes

_key_holds_maintain if "maintain" in _key_scopes

_attested_class_known if input.attestation.trust_class in {"signed", "earned"}

_verifier_trusted if input.attestation.verifier_key_id in lib.tenant_setting(input.attestation.tenant, "verifier_key_ids")

# --- quotas (issue 18): input.usage holds the core's counters per principal and per scope ---
# usage: {windows: {minute: {ms}, hour: {ms}},
#         principal|scope: {minute|hour: {captures, admissions, searches, gets, bytes_stored, retry_after_ms}}}
# A tool is refused once a counter it adds to (data.engram.config.quota_metrics) has reached the
# tenant's limit (tenant setting quotas[subject][window][metric]). When quotas are the only
# reasons, the answer carries retry_after_ms and the core answers RATE_LIMITED (retriable).

_quota_hits contains [subject, window, metric] if {
	_is_agent_tool
	some metric in _config.quota_metrics[input.operation]
	some subject, windows in lib.tenant_setting(input.context.tenant, "quotas")
	some window, limits in windows
	input.usage[subject][window][metric] >= limits[metric]
}

_quota_reasons contains lib.reason("QUOTA_EXCEEDED", sprintf("The %s quota of %s per %s is used up.", [subject, metric, window])) if {
	some [subject, window, metric] in _quota_hits
}

deny contains r if some r in _quota_reasons

default _rate_limit := {}

_rate_limit := {"retry_after_ms": max({_retry_after(s, w) | some [s, w, _] in _quota_hits})} if {
	count(_quota_hits) > 0
	count(deny - _quota_reasons) == 0
}

# At least a millisecond: a refusal never says "retry now".
_retry_after(subject, window) := max({1, input.usage[subject][window].retry_after_ms})
