# Retention: whether a record is due for the expire sweep (SPEC §6: expire moves
# accepted_* and historical records to expired once expires_at has passed).
package engram.retention

import data.engram.lib

_record := input.record

# METADATA
# title: Retention decision
# description: >-
#   action "expire" when the record has an expires_at_ms at or before now_ms
#   and is in an expirable state (data.engram.config.retention.expirable_states);
#   otherwise "none". allow is false, with action "none", for an invalid input.
decision := {
	"allow": allow,
	"action": _action,
	"reasons": sort([r | some r in (deny | _notes)]),
}

# METADATA
# title: Allow
# description: True only when no deny reason applies.
default allow := false

allow if count(deny) == 0

default _action := "none"

_action := "expire" if {
	allow
	_due
}

_due if {
	_record.expires_at_ms <= input.now_ms
	_record.state in data.engram.config.retention.expirable_states
}

_notes contains lib.reason("EXPIRES_AT_PASSED", "The record's expiry has passed.") if {
	allow
	_due
}

# METADATA
# title: Deny reasons
# description: Why the input cannot be decided on; empty for a valid input.
deny contains lib.reason("INVALID_INPUT", "The policy input lacks now_ms.") if {
	not _now_valid
}

deny contains lib.reason("INVALID_INPUT", "The policy input lacks a record state.") if {
	not _state_named
}

# Negations go through helper rules: OPA lifts a call's arguments out of `not`,
# so `not f(input.missing)` would be undefined instead of true (fail open).
_now_valid if is_number(input.now_ms)

_state_named if is_string(_record.state)
