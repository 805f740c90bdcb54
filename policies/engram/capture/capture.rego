# Capture: retention resolution, host caps, family consent, secret findings, the
# window payload times must fall in, and whether confirmation is required
# (SPEC §5 engram_memory_capture, §8, §13). The input carries sizes, labels,
# times and flags only — never memory text.
package engram.capture

import data.engram.lib

_tenant := input.context.tenant

_requested := object.get(input, "retention", {})

_derivative_rule := object.get(_requested, "derivative_rule", "make-ineligible")

_derivative_rules := {"make-ineligible", "retain"}

# METADATA
# title: Capture decision
# description: >-
#   Whether a capture may be stored, with the resolved retention (derivative
#   rule defaulting to make-ineligible; expires_at_ms only when requested) and
#   whether a host confirmation is required for this tenant.
decision := {
	"allow": allow,
	"reasons": sort([r | some r in deny]),
	"retention": _retention,
	"confirmation_required": _confirmation_required,
}

# METADATA
# title: Allow
# description: True only when no deny reason applies.
default allow := false

allow if count(deny) == 0

_retention := object.union(
	{"derivative_rule": _derivative_rule},
	{"expires_at_ms": _requested.expires_at_ms | _requested.expires_at_ms},
)

# METADATA
# title: Deny reasons
# description: Every reason the capture is refused; empty means allowed.
deny contains lib.reason("INVALID_INPUT", "The policy input lacks now_ms.") if {
	not _now_valid
}

deny contains lib.reason("INVALID_INPUT", "The derivative rule is not known.") if {
	not _derivative_rule_known
}

deny contains lib.reason("RETAIN_NOT_ALLOWED", "The host does not permit retaining derivatives.") if {
	_derivative_rule == "retain"
	not _retain_allowed
}

deny contains lib.reason("EXPIRY_BEYOND_CAP", "The expiry is beyond the host's retention cap.") if {
	_requested.expires_at_ms > input.now_ms + lib.tenant_setting(_tenant, "expiry_cap_ms")
}

deny contains lib.reason("FAMILY_NOT_CONSENTED", sprintf("The host has not consented to family %q.", [family])) if {
	some family in input.family_refs
	not _consented(family)
}

deny contains lib.reason("SECRET_FINDINGS", sprintf("The secret scanner reported %s.", [finding.kind])) if {
	some finding in input.findings
}

deny contains lib.reason("CONTEXT_INCOMPLETE", "The bound context lacks a tenant, workspace or principal.") if {
	not _context_complete
}

# Issue 26.5 / 31.3: payload times (epoch milliseconds) must fall in the host's window,
# tenant setting valid_time_window {floor_ms, horizon_ms}: not before floor_ms (by default
# 1971-01-01, so epoch seconds sent as milliseconds, dated January 1970, are refused) and
# not more than horizon_ms after now (a record dated far ahead is invisible until then and
# must not stand in for a current one).
deny contains lib.reason("INVALID_INPUT", "The policy input lacks valid_time.t.") if {
	not _valid_time_given
}

deny contains lib.reason("TIME_BEFORE_FLOOR", sprintf("%s is before the host's floor for payload times.", [field])) if {
	some field, at in _payload_times
	at < _window.floor_ms
}

deny contains lib.reason("TIME_BEYOND_HORIZON", sprintf("%s is beyond the host's horizon for payload times.", [field])) if {
	some field, at in _payload_times
	at > input.now_ms + _window.horizon_ms
}

# Negations go through helper rules: OPA lifts a call's arguments out of `not`,
# so `not f(input.missing)` would be undefined instead of true (fail open).
_now_valid if is_number(input.now_ms)

_derivative_rule_known if _derivative_rule in _derivative_rules

_retain_allowed if lib.tenant_setting(_tenant, "retain_allowed") == true

_consented(family) if family in lib.tenant_setting(_tenant, "consented_families")

_context_complete if lib.context_complete(input.context)

_valid_time_given if is_number(input.valid_time.t)

_window := lib.tenant_setting(_tenant, "valid_time_window")

_payload_times["valid_time.t"] := input.valid_time.t if _valid_time_given

_payload_times["primary_event.at"] := input.primary_event_at if is_number(input.primary_event_at)

default _confirmation_required := false

_confirmation_required if {
	"engram_memory_capture" in lib.tenant_setting(_tenant, "confirmation_required_tools")
}
